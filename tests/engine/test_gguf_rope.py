"""A GGUF's RoPE scaling survives conversion: transformers' reader drops both the
`rope_freqs` tensor (Llama 3's llama3 scaling) and the `<arch>.rope.scaling.*` keys (YaRN,
linear), so a converted Llama 3.1 or Qwen2.5-YaRN ran with plain RoPE, silently wrong."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ktcli.engine import model_store
from ktcli.engine.gguf_meta import LLAMA3_STANDARD, llama3_divisors, llama3_from_divisors, rope_scaling
from ktcli.engine.model_store import ModelSource, ensure_hf_dir
from ktcli.engine.native import NativeBackend
from ktcli.errors import UsageError
from tests.engine.conftest import build_tiny, hf_loadable
from tests.engine.tiny_gguf import llama3_rope_freqs, write_gguf

LLAMA31 = {"rope_theta": 500000.0, **LLAMA3_STANDARD}


@pytest.mark.parametrize(("params", "head_dim"), [
    (LLAMA31, 128),  # Llama 3.1 8B: several dims inside the blended band
    ({**LLAMA31, "original_max_position_embeddings": 64}, 16),  # one dim inside the band
    ({"rope_theta": 10000.0, "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0,
      "original_max_position_embeddings": 4096}, 128),
    ({**LLAMA31, "factor": 32.0}, 64),  # Llama 3.2's factor
])
def test_llama3_parameters_are_recovered_from_the_divisors(params, head_dim):
    divisors = llama3_rope_freqs(params, head_dim)
    found = llama3_from_divisors(divisors, params["rope_theta"])
    want = {k: v for k, v in params.items() if k != "rope_theta"}
    assert found == {"rope_type": "llama3", **want}
    # and they give the tensor back: the check that guards any other set
    assert np.allclose(llama3_divisors(params["rope_theta"], head_dim // 2, found), divisors, rtol=1e-6)


def test_the_standard_values_win_when_they_give_the_same_divisors():
    # head 16, theta 500000: no dim falls in the 8192-window's band, so many sets agree
    params = {**LLAMA31}
    divisors = llama3_rope_freqs(params, 16)
    assert llama3_from_divisors(divisors, 500000.0) == {"rope_type": "llama3", **LLAMA3_STANDARD}


def test_divisors_no_llama3_parameters_give_are_refused():
    divisors = llama3_rope_freqs(LLAMA31, 128)
    divisors[40] *= 1.01
    assert llama3_from_divisors(divisors, 500000.0) is None
    assert llama3_from_divisors(np.linspace(1, 3, 8), 10000.0) is None
    assert llama3_from_divisors(np.ones(8), 10000.0) == {}  # all ones: no scaling


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


def _reader(arch: str, fields: dict, tensors=()):
    return SimpleNamespace(fields={"general.architecture": _Field(arch),
                                   **{f"{arch}.{k}": _Field(v) for k, v in fields.items()}},
                           tensors=list(tensors))


@pytest.mark.parametrize(("fields", "want"), [
    ({}, None),
    ({"rope.scaling.type": "none"}, None),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32768},
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_beta_fast": 16.0},
     {"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0}),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}, {"rope_type": "linear", "factor": 2.0}),
    ({"rope.scale_linear": 2.0}, {"rope_type": "linear", "factor": 2.0}),
])
def test_rope_scaling_from_metadata(fields, want, tmp_path):
    assert rope_scaling(_reader("qwen2", fields), tmp_path / "m.gguf") == want


def test_a_scaling_ktcli_cannot_express_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="RoPE scaling 'longrope' is not supported"):
        rope_scaling(_reader("llama", {"rope.scaling.type": "longrope", "rope.scaling.factor": 4.0}), tmp_path / "m.gguf")


def _converted(tmp_path, folder, **gguf_args):
    gguf = write_gguf(folder, tmp_path / f"{folder.name}.gguf", **gguf_args)
    return ensure_hf_dir(ModelSource(folder.name, "gguf", gguf), tmp_path / "cache")


def _assert_same_logits(original, converted):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(original), dtype=torch.float32).eval()
    hf = AutoModelForCausalLM.from_pretrained(str(hf_loadable(converted, converted.parent.parent / f"hf-{converted.name}")),
                                              dtype=torch.float32).eval()
    ours = NativeBackend.load(converted, weights="fp32", block_size=16, prefill_chunk=64, kv_budget_bytes=4 << 20)
    # 300 tokens: past the 64/128-token original windows, where the scaling changes the answer
    ids = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
        theirs = hf(torch.tensor([ids])).logits[0]
    scale = expected.abs().max()
    assert ((ours.prompt_logits(ids) - expected).abs().max() / scale).item() < 1e-4  # our engine
    assert ((theirs - expected).abs().max() / scale).item() < 1e-5  # --engine hf


def test_a_llama3_gguf_converts_with_its_rope_freqs(tmp_path):
    params = {**LLAMA31, "original_max_position_embeddings": 64}
    folder = build_tiny("llama", tmp_path / "llama3", rope_parameters={"rope_type": "llama3", **params})
    converted = _converted(tmp_path, folder, rope_freqs=llama3_rope_freqs(params, 16))
    cfg = json.loads((converted / "config.json").read_text())
    assert cfg["rope_parameters"] == {"rope_type": "llama3", **params}
    assert cfg["max_position_embeddings"] == 512
    _assert_same_logits(folder, converted)


def test_a_qwen2_yarn_gguf_converts_with_its_scaling(tmp_path):
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128}
    folder = build_tiny("qwen2", tmp_path / "qwen2", rope_parameters=yarn)
    converted = _converted(tmp_path, folder, metadata={
        "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 128})
    assert json.loads((converted / "config.json").read_text())["rope_parameters"] == yarn
    _assert_same_logits(folder, converted)


def test_a_qwen3_gguf_of_its_own_head_width_converts(tmp_path):
    """transformers' Qwen3 GGUF reading leaves head_dim at 128: a Qwen3 whose heads are
    another width (attention.key_length) failed its conversion with an internal error."""
    folder = build_tiny("qwen3", tmp_path / "qwen3", head_dim=32)  # 4 heads x 32 over a hidden size of 64
    converted = _converted(tmp_path, folder)
    assert json.loads((converted / "config.json").read_text())["head_dim"] == 32
    _assert_same_logits(folder, converted)


def test_conversions_made_before_the_rope_fix_are_made_again(tmp_path, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(1000))
    source = ModelSource("m", "gguf", gguf)
    now = model_store.converted_dir(source, tmp_path)
    monkeypatch.setattr(model_store, "CONVERSION_VERSION", 1)
    assert model_store.converted_dir(source, tmp_path) != now


def test_the_plan_of_an_unconverted_gguf_has_the_scaled_window(tmp_path):
    """A Qwen2.5-YaRN GGUF was planned at its 32K context_length before its first
    conversion and ran at 128K after (`config.scaled_window`)."""
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128}
    folder = build_tiny("qwen2", tmp_path / "qwen2", rope_parameters=yarn, max_position_embeddings=128)
    path = write_gguf(folder, tmp_path / "q.gguf", metadata={
        "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 128})
    facts = model_store.model_facts(model_store.resolve_model(str(path)), tmp_path / "cache")
    assert facts.context_window == 512
