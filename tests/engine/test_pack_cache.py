"""engine.pack_cache: int8 weights packed once and read back from ktcli's cache equal a fresh
pack tensor for tensor (tied heads stay tied); a changed weight file, a damaged cache file
or a cache folder that cannot be written never gives wrong weights, and a changed model's
old file does not stay behind."""

import os
import shutil

import pytest
import torch

from ktcli.engine import int8_gemv, pack_cache
from ktcli.engine.config import load_config
from ktcli.engine.native import NativeBackend
from ktcli.engine.weights import ModelWeights, load_weights

pytestmark = pytest.mark.skipif(not int8_gemv.available(), reason="int8 kernels not built here")


def _tensors(w: ModelWeights) -> dict[str, torch.Tensor]:
    out = {"embed": w.embed, "norm": w.norm, "lm_head": w.lm_head}
    for i, lw in enumerate(w.layers):
        out.update({f"{i}.{k}": v for k, v in vars(lw).items() if v is not None})
    return out


def _same(a: ModelWeights, b: ModelWeights) -> bool:
    ta, tb = _tensors(a), _tensors(b)
    return ta.keys() == tb.keys() and all(ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]) for k in ta)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # qwen2: qkv biases and a tied head
def test_cached_pack_equals_a_fresh_one_and_is_read_back(tiny_models, tmp_path, monkeypatch, kind):
    monkeypatch.delenv("KTCLI_NO_PACK_CACHE", raising=False)
    folder = tiny_models[kind]
    cfg = load_config(folder)
    fresh = load_weights(folder, cfg, "int8")
    first = pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", tmp_path)  # packs, then writes
    assert pack_cache.cache_file(tmp_path, folder).is_file()

    def no_pack(*a, **k):
        raise AssertionError("packed again despite the cache")

    monkeypatch.setattr(pack_cache, "load_weights", no_pack)
    cached = pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", tmp_path)
    assert _same(fresh, first) and _same(fresh, cached)
    tied = fresh.lm_head.data_ptr() == fresh.embed.data_ptr()
    assert (cached.lm_head.data_ptr() == cached.embed.data_ptr()) == tied  # a tied head stays one tensor


def test_changed_weights_damaged_file_and_readonly_cache_are_packed_afresh(tiny_models, tmp_path, monkeypatch):
    monkeypatch.delenv("KTCLI_NO_PACK_CACHE", raising=False)
    folder = tmp_path / "model.Q4_1"  # (a dot in the name, as a converted GGUF's stem has)
    shutil.copytree(tiny_models["llama"], folder)
    cfg = load_config(folder)
    root = tmp_path / "cache"
    pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", root)
    old = pack_cache.cache_file(root, folder)
    other_kind = old.with_name(old.name.replace(".int8.", ".bf16."))  # another dtype's: kept
    other_kind.write_bytes(b"x")
    # New weights in the same folder: another cache file, packed from the new weights.
    st = next(folder.glob("*.safetensors"))
    os.utime(st, ns=(st.stat().st_atime_ns, st.stat().st_mtime_ns + 10**9))
    assert pack_cache.cache_file(root, folder) != old
    # A damaged cache file: packed afresh, never read as weights.
    path = pack_cache.cache_file(root, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    fresh = load_weights(folder, cfg, "int8")
    assert _same(fresh, pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", root))
    assert path.is_file() and not old.exists()  # the old weights' file is dropped once the new one is written
    assert other_kind.exists()
    # A cache root that is a file (cannot be written): still the right weights.
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    assert _same(fresh, pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", blocked / "packed"))


def test_engine_from_the_cache_gives_the_same_tokens(tiny_models, tmp_path, monkeypatch):
    monkeypatch.delenv("KTCLI_NO_PACK_CACHE", raising=False)
    folder = tiny_models["llama"]
    ids = list(range(3, 60))
    want = NativeBackend.load(folder, weights="int8").engine.prompt_logits(ids)
    for _ in range(2):  # packs and writes, then reads
        got = NativeBackend.load(folder, weights="int8", pack_cache=tmp_path).engine.prompt_logits(ids)
        assert torch.equal(want, got)


def test_a_cache_file_cut_short_is_packed_afresh_not_read_as_weights(tiny_models, tmp_path, monkeypatch):
    # An interrupted copy of the cache: the header is whole, the data is not. Read as it
    # was, the missing bytes were whatever memory the tensors got (answers of ' I, I, I').
    monkeypatch.delenv("KTCLI_NO_PACK_CACHE", raising=False)
    folder = tiny_models["llama"]
    cfg = load_config(folder)
    pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", tmp_path)
    path = pack_cache.cache_file(tmp_path, folder)
    os.truncate(path, path.stat().st_size - 1000)
    assert pack_cache.load(path, cfg) is None
    fresh = load_weights(folder, cfg, "int8")
    assert _same(fresh, pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", tmp_path))
    assert pack_cache.load(path, cfg) is not None  # written again, whole


def test_a_write_error_is_a_cache_miss(tiny_models, tmp_path, monkeypatch):
    """A full disk mid-file: no file, no temp file left, and the run goes on."""
    import errno

    def failing_write(out, entries, arrays, metadata=None, checksums=False):
        out.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pack_cache, "write_file", failing_write)
    folder = tiny_models["llama"]
    cfg = load_config(folder)
    w = load_weights(folder, cfg, "int8")
    assert pack_cache.save(tmp_path / "x.int8.safetensors", w) is False
    assert list(tmp_path.iterdir()) == []


def test_bytes_changed_in_place_are_packed_afresh_not_read_as_weights(tiny_models, tmp_path, monkeypatch):
    # Random bytes written over part of the packed file, its size unchanged: the header's
    # check of the file's length passes, and the bytes were read as weights (every answer
    # of the bundled model came out empty). Each tensor's CRC32 now says so.
    monkeypatch.delenv("KTCLI_NO_PACK_CACHE", raising=False)
    folder = tiny_models["llama"]
    cfg = load_config(folder)
    pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", tmp_path)
    path = pack_cache.cache_file(tmp_path, folder)
    assert pack_cache.load(path, cfg) is not None
    size = path.stat().st_size
    whole = path.read_bytes()
    for at in (size - 64, size // 2):  # the last tensor's bytes, and some in the middle
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(os.urandom(16))
        assert path.stat().st_size == size
        assert pack_cache.load(path, cfg) is None
        fresh = load_weights(folder, cfg, "int8")
        assert _same(fresh, pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", tmp_path))
        assert path.read_bytes() == whole  # written again as it was
    # A file without sums (written before they were kept) is packed afresh too.
    from ktcli.engine.safetensors_header import write_file

    w = load_weights(folder, cfg, "int8")
    with open(path, "wb") as f:
        write_file(f, [("norm", "F32", tuple(w.norm.shape), w.norm.numel() * 4)], [w.norm.numpy()],
                   {"format": str(pack_cache.FORMAT), "layers": str(cfg.n_layers), "tied": "0"})
    assert pack_cache.load(path, cfg) is None


def test_written_checksums_are_each_tensors_crc32(tmp_path):
    import zlib

    import numpy as np

    from ktcli.engine.safetensors_header import checksums_of, read_header, write_file

    arrays = {"a": np.arange(10, dtype=np.float32), "b": np.arange(7, dtype=np.uint8)}
    path = tmp_path / "x.safetensors"
    with open(path, "wb") as f:
        write_file(f, [(n, "F32" if a.dtype == np.float32 else "U8", a.shape, a.nbytes) for n, a in arrays.items()],
                   arrays.values(), {"format": "pt"}, checksums=True)
    header, base = read_header(path)
    assert checksums_of(header["__metadata__"]) == {n: zlib.crc32(a.tobytes()) for n, a in arrays.items()}
    assert header["__metadata__"]["format"] == "pt"
    data = path.read_bytes()[base:]
    assert data == b"".join(a.tobytes() for a in arrays.values())  # the data where the header says


def test_a_moved_cache_keeps_its_packed_weights(tiny_models, tmp_path, monkeypatch):
    # Keyed by the model folder's path, a cache copied or moved whole packed again (and
    # its first run dropped the packed file it had).
    import shutil

    monkeypatch.delenv("KTCLI_NO_PACK_CACHE", raising=False)
    folder = tmp_path / "one" / "model"
    shutil.copytree(tiny_models["llama"], folder)
    cfg = load_config(folder)
    fresh = pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", tmp_path / "one" / "packed")
    shutil.move(tmp_path / "one", tmp_path / "two")
    monkeypatch.setattr(pack_cache, "load_weights", lambda *a, **k: pytest.fail("packed again"))
    moved = tmp_path / "two" / "model"
    assert _same(fresh, pack_cache.load_engine_weights(moved, cfg, "int8", "cpu", tmp_path / "two" / "packed"))


def test_two_pack_formats_sharing_a_cache_keep_their_own_files_within_a_bound(tiny_models, tmp_path, monkeypatch):
    """Two ktcli versions of different FORMATs on one cache folder dropped each other's
    packed file of the same model on every save: alternating packed again on every run
    (~0.4 s for the bundled model, a 7B's whole weights for a 7B). Kept now, one other
    format's file, while used within a week; past that it goes on the next load."""
    import time

    from ktcli.engine import model_store

    monkeypatch.delenv("KTCLI_NO_PACK_CACHE", raising=False)
    folder = tiny_models["llama"]
    cfg = load_config(folder)
    root = tmp_path / "cache"
    packs: list[int] = []
    real = pack_cache.load_weights
    monkeypatch.setattr(pack_cache, "load_weights", lambda *a, **k: (packs.append(pack_cache.FORMAT), real(*a, **k))[1])

    def run(fmt: int) -> os.PathLike:
        monkeypatch.setattr(pack_cache, "FORMAT", fmt)
        pack_cache.load_engine_weights(folder, cfg, "int8", "cpu", root)
        return pack_cache.cache_file(root, folder)

    def age(path, seconds: float) -> None:
        when = time.time() - seconds
        os.utime(path, (when, when))

    two, three = run(2), run(3)
    for _ in range(2):
        assert run(2) == two and run(3) == three
    assert packs == [2, 3] and two.is_file() and three.is_file()
    # a third format: the least recently used other goes
    age(two, 200)
    age(three, 100)
    four = run(4)
    assert packs == [2, 3, 4] and not two.exists() and three.is_file() and four.is_file()
    # unused for longer than the bound: gone on the next load, which packs nothing
    age(three, model_store.OTHER_VERSION_KEPT_S + 60)
    assert run(4) == four and packs == [2, 3, 4] and not three.exists() and four.is_file()
