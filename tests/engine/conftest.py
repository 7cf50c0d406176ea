"""Fixtures: the bundled SmolLM2 converted once into the user cache (works from an empty
cache, fast on reruns), and tiny random-weight models of each architecture built from
transformers configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=512,
    # A wider init than the default 0.02 makes the random model's next-token choice
    # decisive, so greedy comparisons test the engine, not float ties.
    initializer_range=0.2,
)


def build_tiny(kind: str, folder: Path, **overrides) -> Path:
    """Save a random-weight model of `kind` (llama, qwen2, qwen3, mistral) in `folder`."""
    import transformers as tf

    cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
    }[kind]
    args = dict(TINY)
    if kind == "qwen3":
        args["head_dim"] = 16
    args.update(overrides)
    config = cls[0](**args)
    torch.manual_seed(1234)
    model = cls[1](config).eval()
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "llama": build_tiny("llama", root / "llama"),
        "llama3-rope": build_tiny(
            "llama",
            root / "llama3",
            rope_parameters={
                "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=True,
        ),
        "qwen2": build_tiny("qwen2", root / "qwen2", tie_word_embeddings=True),
        "qwen3": build_tiny("qwen3", root / "qwen3"),
        # A window shorter than the prompts, so the sliding mask is really exercised.
        "mistral": build_tiny("mistral", root / "mistral", sliding_window=24),
    }


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    import platformdirs

    from ktcli.engine.model_store import ensure_hf_dir, resolve_model

    cache = Path(os.environ.get("KTCLI_TEST_CACHE", platformdirs.user_cache_dir("ktcli")))
    return ensure_hf_dir(resolve_model("smollm2"), cache)


def hf_loadable(folder: Path, out: Path) -> Path:
    """A converted GGUF's folder as transformers' loader reads it, in `out`: its files, and
    its weights (read from the GGUF by ktcli) written as model.safetensors."""
    import shutil

    from ktcli.engine.gguf_weights import linked_gguf, write_safetensors

    if linked_gguf(folder) is None:
        return folder  # weights of its own
    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        shutil.copy(f, out / f.name)
    write_safetensors(folder, out / "model.safetensors")
    return out


@pytest.fixture(scope="session")
def smollm2_hf_dir(smollm2_dir, tmp_path_factory) -> Path:
    """The bundled model's folder with its weights as a safetensors file, apart from the
    cache's (whose weights the engine's tests read from the GGUF)."""
    return hf_loadable(smollm2_dir, tmp_path_factory.mktemp("smollm2-hf") / smollm2_dir.name)


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_hf_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smollm2_hf_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    from ktcli.engine.native import NativeBackend

    # Small pages and chunks so prompts of a few hundred tokens span many of both.
    return NativeBackend.load(smollm2_dir, weights="fp32", block_size=16, prefill_chunk=256, kv_budget_bytes=256 << 20)
