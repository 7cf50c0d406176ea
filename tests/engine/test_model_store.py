"""The converted-model cache: a damaged conversion is made again, never loaded; a cache
folder that cannot be written is one line, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ktcli.engine import gguf_weights, model_store
from ktcli.engine.model_store import ModelSource, converted_dir, ensure_hf_dir, is_converted
from ktcli.engine.safetensors_header import DamagedWeightsError, add_checksums
from ktcli.engine.weights import TensorReader
from ktcli.errors import CacheError, UsageError


def _fake_convert(calls: list[Path]):
    def convert(gguf: Path, target: Path) -> None:
        calls.append(target)
        target.mkdir(parents=True)
        save_file({"w": torch.arange(4096, dtype=torch.float32)}, str(target / "model.safetensors"))
        add_checksums(target / "model.safetensors")  # as both converters keep them
        (target / "config.json").write_text('{"model_type": "llama"}')
        (target / "tokenizer.json").write_text('{"model": {}}\n')
        (target / "tokenizer_config.json").write_text('{"bos_token": null}\n')
        (target / "generation_config.json").write_text('{"eos_token_id": 2}\n')
        (target / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
        model_store._write_digest(target)
        gguf_weights.record_source(target, gguf)  # as both converters do
    return convert


@pytest.fixture
def source(tmp_path) -> ModelSource:
    import gguf

    # A header and no tensors: the conversion reads the header before anything else.
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return ModelSource("tiny", "gguf", path)


def test_a_converted_weights_file_without_checksums_is_converted_again(source, tmp_path, monkeypatch):
    """One written before the CRC32s were kept could not be checked as it is read."""
    calls: list[Path] = []
    monkeypatch.setattr(model_store, "_convert_gguf", _fake_convert(calls))
    cache = tmp_path / "cache"
    target = ensure_hf_dir(source, cache)
    save_file({"w": torch.arange(4096, dtype=torch.float32)}, str(target / "model.safetensors"))
    assert not is_converted(source, cache)
    assert ensure_hf_dir(source, cache) == target and len(calls) == 2 and is_converted(source, cache)


def test_a_conversion_cut_short_is_converted_again(source, tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(model_store, "_convert_gguf", _fake_convert(calls))
    cache = tmp_path / "cache"
    target = ensure_hf_dir(source, cache)
    assert is_converted(source, cache) and ensure_hf_dir(source, cache) == target and len(calls) == 1
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # an interrupted copy of the cache
    assert not is_converted(source, cache)
    with pytest.raises(DamagedWeightsError, match="cut short"):
        TensorReader([weights])
    said: list[str] = []
    assert ensure_hf_dir(source, cache, said.append) == target and len(calls) == 2
    assert "damaged" in said[0] and is_converted(source, cache)
    assert torch.equal(TensorReader([weights]).get("w"), torch.arange(4096, dtype=torch.float32))
    # the damaged copy is gone (beside the folder: the record of the GGUF's fingerprint)
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([model_store.FINGERPRINT_RECORD, target.name])


@pytest.mark.parametrize(("name", "damage"), [
    ("config.json", b"garbage"), ("config.json", b""), ("tokenizer.json", b'{"model": {"vocab"'),
    ("tokenizer.json", None), ("tokenizer_config.json", b'{"bos_token": "<'),
    # damaged between its braces, a damaged generation config, an emptied template (probe 104)
    ("tokenizer_config.json", b'{"bos_token": \x00\x00}'), ("generation_config.json", b'{"eos'),
    ("generation_config.json", b"{xx}"), ("chat_template.jinja", b""),
])
def test_a_conversion_with_a_damaged_config_or_tokenizer_is_converted_again(source, tmp_path, monkeypatch,
                                                                           name, damage):
    """Only the weights were checked: a damaged config.json was blamed on the user's
    --model, a damaged or missing tokenizer.json was an internal error, every run."""
    calls: list[Path] = []
    monkeypatch.setattr(model_store, "_convert_gguf", _fake_convert(calls))
    cache = tmp_path / "cache"
    target = ensure_hf_dir(source, cache)
    if damage is None:
        (target / name).unlink()
    else:
        (target / name).write_bytes(damage)
    assert not is_converted(source, cache)
    assert ensure_hf_dir(source, cache) == target and len(calls) == 2 and is_converted(source, cache)


def test_a_cache_folder_that_cannot_be_written_is_one_line(source, tmp_path):
    """A runtime failure (exit 1): it was an input error (3), which the input is not."""
    blocked = tmp_path / "blocked"
    blocked.write_text("")  # a file where the cache folder should be: nothing can be made under it
    with pytest.raises(CacheError, match="cannot convert tiny.gguf into the cache folder") as caught:
        ensure_hf_dir(source, blocked / "cache")
    assert caught.value.exit_code == 1
    assert not converted_dir(source, blocked / "cache").exists()


def test_the_conversion_is_named_by_content_and_replaces_older_ones(tmp_path, monkeypatch):
    # The same GGUF in two virtualenvs (or reinstalled) is converted once; a new GGUF of
    # the same name drops the old conversion and its packed weights.
    calls: list[Path] = []
    monkeypatch.setattr(model_store, "_convert_gguf", _fake_convert(calls))
    cache = tmp_path / "cache"
    copies = []
    for venv in ("a", "b"):
        gguf = tmp_path / venv / "tiny.gguf"
        gguf.parent.mkdir()
        gguf.write_bytes(b"GGUF" + bytes(range(256)) * 9000)
        copies.append(ModelSource("tiny", "gguf", gguf))
    first = ensure_hf_dir(copies[0], cache)
    assert ensure_hf_dir(copies[1], cache) == first and len(calls) == 1
    (cache / "packed").mkdir()
    old_packed = cache / "packed" / f"{first.name}-0123456789abcdef.int8.safetensors"
    old_packed.write_bytes(b"x")
    old_keys = cache / "packed" / f"{first.name}-fedcba9876543210.keyweights.pt"
    old_keys.write_bytes(b"x")
    other_model = cache / "packed" / "other-0123456789abcdef-0123456789abcdef.int8.safetensors"
    other_model.write_bytes(b"x")
    copies[1].path.write_bytes(b"GGUF" + bytes(range(256)) * 9001)  # an upgraded model, same name
    second = ensure_hf_dir(copies[1], cache)
    assert second != first and len(calls) == 2
    assert not first.exists() and not old_packed.exists() and not old_keys.exists() and other_model.exists()


def test_facts_count_parameters_from_the_headers_whatever_the_dtype(tiny_models, tmp_path):
    # The file size over 4 counted a bf16 checkpoint (how real models ship) at half its
    # parameters: --weights fp32 was planned at 0.70x its peak.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_models["llama"]), dtype=torch.float32)
    want = sum(p.numel() for p in model.parameters())
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model.to(torch.float16).save_pretrained(tmp_path / "fp16")
    for folder, width, dtype in ((tiny_models["llama"], 4, "fp32"), (tmp_path / "bf16", 2, "bf16"),
                                 (tmp_path / "fp16", 2, "fp16")):
        facts = model_store.model_facts(ModelSource("tiny", "hf", folder), tmp_path)
        assert facts.n_params == want and facts.weight_bytes == 4 * want, folder
        assert (facts.source_bytes, facts.source_dtype) == (width * want, dtype), folder
    # transformers holds the files mapped while it casts from their dtype, not otherwise:
    # a bf16 release in bf16 was planned as if cast from fp32 (1.6 GiB for 981 MiB), in
    # fp32 as if read as it is (1.3 GiB for 1,582 MiB)
    from dataclasses import replace

    from ktcli.config import Settings
    from ktcli.pipeline import prepare
    from ktcli.plan.estimates import CPU_RUNTIME_BYTES

    hf = replace(Settings(), model=str(tmp_path / "bf16"), engine="hf", cache_dir=str(tmp_path / "cache"), device="cpu")
    assert prepare.planning_facts(replace(hf, weights="bf16")).host_bytes == CPU_RUNTIME_BYTES
    assert prepare.planning_facts(hf).host_bytes == CPU_RUNTIME_BYTES + 2 * want
    fp32 = replace(hf, model=str(tiny_models["llama"]))
    assert prepare.planning_facts(fp32).host_bytes == CPU_RUNTIME_BYTES
    assert prepare.planning_facts(replace(fp32, weights="bf16")).host_bytes == CPU_RUNTIME_BYTES + 4 * want
    # an fp16 release loaded in bf16: cast, though the same size (its load peaked at 3x the plan)
    fp16 = replace(hf, model=str(tmp_path / "fp16"), weights="bf16")
    assert prepare.planning_facts(fp16).host_bytes == CPU_RUNTIME_BYTES + 2 * want


def test_a_gguf_of_an_unsupported_architecture_is_refused_before_converting(tmp_path, monkeypatch):
    from tests.engine.conftest import build_tiny
    from tests.engine.tiny_gguf import write_gguf

    gguf = write_gguf(build_tiny("llama", tmp_path / "tiny"), tmp_path / "phi.gguf", arch="phi3")
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", None)  # never reached
    with pytest.raises(UsageError, match="GGUF architecture 'phi3' is not supported"):
        ensure_hf_dir(ModelSource("phi", "gguf", gguf), tmp_path / "cache")
    assert not (tmp_path / "cache" / "models").exists()  # nothing made, not even a temp folder


def test_the_conversion_draws_no_progress_bar(tmp_path, capfd):
    """The GGUF reader's tqdm bar was drawn under -q and into logs: TQDM_DISABLE was set
    after tqdm had read its environment."""
    from tests.engine.conftest import build_tiny
    from tests.engine.tiny_gguf import write_gguf

    gguf = write_gguf(build_tiny("llama", tmp_path / "tiny"), tmp_path / "tiny.gguf")
    capfd.readouterr()
    ensure_hf_dir(ModelSource("tiny", "gguf", gguf), tmp_path / "cache")
    err = capfd.readouterr().err
    assert "GGUF tensors" not in err and "\r" not in err, err


def test_facts_count_what_the_index_names_not_a_consolidated_copy(tiny_models, tmp_path):
    """A Mistral release's consolidated.safetensors beside its shards doubled the count
    (and the memory estimate)."""
    import json
    import shutil

    want = model_store.model_facts(ModelSource("tiny", "hf", tiny_models["llama"]), tmp_path).n_params
    for indexed in (True, False):
        folder = tmp_path / f"mistral-{indexed}"
        shutil.copytree(tiny_models["llama"], folder)
        shard = folder / "model-00001-of-00001.safetensors"
        (folder / "model.safetensors").rename(shard)
        shutil.copy(shard, folder / "consolidated.safetensors")
        if indexed:
            (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard.name}}))
        assert model_store.model_facts(ModelSource("tiny", "hf", folder), tmp_path).n_params == want, indexed


def test_the_model_key_is_the_models_content_not_its_folders_path(tmp_path):
    """A cache folder copied or moved kept neither its packed weights nor its prompt cache:
    the key hashed the folder's path. A changed model must still be another key."""
    import os
    import shutil

    folder = tmp_path / "a" / "model"
    folder.mkdir(parents=True)
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"model_type": "llama", "rope_theta": 10000}')
    (folder / "tokenizer.json").write_text('{"model": {}}\n')
    key = model_store.model_key(folder, "1")

    def copied(name: str, keep_times: bool = True) -> Path:
        to = tmp_path / name / "model"
        shutil.copytree(folder, to, copy_function=shutil.copy2 if keep_times else shutil.copy)
        return to

    moved = copied("b")
    assert model_store.model_key(moved, "1") == key  # moved, or copied keeping modification times
    for p in moved.glob("*.json"):
        os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    assert model_store.model_key(moved, "1") == key  # JSON files by their content
    assert model_store.model_key(moved, "2") != key  # another format

    # Weights copied without their times: another key (a cost, never a stale hit).
    assert model_store.model_key(copied("c", keep_times=False), "1") != key
    # Weights changed: another key, even at the same size.
    changed = copied("d")
    st = (changed / "model.safetensors").stat()
    save_file({"w": torch.arange(64, dtype=torch.float32) + 1}, str(changed / "model.safetensors"))
    assert (changed / "model.safetensors").stat().st_size == st.st_size
    assert model_store.model_key(changed, "1") != key
    # A config edited to the same size, its modification time put back: another key.
    edited = copied("e")
    config = edited / "config.json"
    st = config.stat()
    config.write_text('{"model_type": "llama", "rope_theta": 50000}')
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert config.stat().st_size == st.st_size and model_store.model_key(edited, "1") != key
    # A weight file or a JSON file more, or another folder name: another key.
    more = copied("f")
    (more / "generation_config.json").write_text("{}")
    assert model_store.model_key(more, "1") != key
    extra = copied("g")
    shutil.copy2(extra / "model.safetensors", extra / "model-2.safetensors")
    assert model_store.model_key(extra, "1") != key
    other = tmp_path / "h" / "model-v2"
    shutil.copytree(folder, other)
    assert model_store.model_key(other, "1") != key


def _flip_inside_tensor(path: Path, name: str) -> None:
    """Bytes changed in place inside tensor `name` (the file keeps its size)."""
    from ktcli.engine.safetensors_header import read_header

    header, base = read_header(path)
    begin, end = header[name]["data_offsets"]
    with open(path, "r+b") as f:
        f.seek(base + (begin + end) // 2)
        raw = f.read(4)
        f.seek(base + (begin + end) // 2)
        f.write(bytes(b ^ 0x5A for b in raw))


def test_a_converted_weights_file_changed_in_place_is_converted_again(tmp_path):
    """The float32 model.safetensors written into a converted GGUF's folder (for --engine hf,
    or by transformers' converter) held no checksum: bytes flipped in place were read as
    weights by both engines, and our engine packed them and kept the packed file. Its
    tensors' CRC32s are written with it and checked as they are read; a damaged file is
    converted again, said in one line, and the load goes on."""
    from dataclasses import replace

    from ktcli.config import Settings
    from ktcli.engine import gguf_weights, loading
    from ktcli.engine.hf_backend import _check_written_weights
    from ktcli.engine.safetensors_header import verify_checksums
    from tests.engine.conftest import build_tiny
    from tests.engine.tiny_gguf import write_gguf

    gguf = write_gguf(build_tiny("llama", tmp_path / "hf"), tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    source = model_store.resolve_model(str(gguf))
    folder = ensure_hf_dir(source, cache)
    gguf_weights.write_safetensors(folder)  # as --engine hf does, once
    weights = folder / "model.safetensors"
    good = TensorReader.of_folder(folder).get("model.layers.0.mlp.down_proj.weight")
    assert verify_checksums(weights)
    _flip_inside_tensor(weights, "model.layers.0.mlp.down_proj.weight")
    assert not verify_checksums(weights) and model_store.is_converted(source, cache)  # (the cheap check passes)
    with pytest.raises(DamagedWeightsError, match="down_proj.weight changed since it was written"):
        TensorReader.of_folder(folder).get("model.layers.0.mlp.down_proj.weight")
    with pytest.raises(DamagedWeightsError):
        _check_written_weights(folder)  # before transformers' loader, which checks nothing

    said: list[str] = []
    settings = replace(Settings(), model=str(gguf), cache_dir=str(cache), device="cpu", weights="fp32")
    backend = loading.load_backend(settings, said.append)
    assert [s for s in said if "damaged" in s] == [
        "the converted tiny.gguf in the cache is damaged (tensor model.layers.0.mlp.down_proj.weight changed since "
        "it was written (a damaged file)): converting it again"]
    assert backend is not None and not weights.exists()  # read from the GGUF again
    assert torch.equal(TensorReader.of_folder(folder).get("model.layers.0.mlp.down_proj.weight"), good)

    # `ktcli serve` loads its engine itself (`serve.run.load_engine`): the same repair, not
    # a one-line error on every start
    from ktcli.serve.run import load_engine

    gguf_weights.write_safetensors(folder)
    _flip_inside_tensor(weights, "model.layers.0.mlp.down_proj.weight")
    said.clear()
    assert load_engine(replace(settings, kv_dtype="auto", attention="auto"), said.append) is not None
    assert [s for s in said if "damaged" in s] and not weights.exists()


def test_a_model_folders_own_damaged_weights_are_one_line_and_left_alone(tmp_path):
    """A --model folder is the user's: its file is never rewritten, and a tensor changed
    since ktcli wrote it (a folder saved from a converted one) is a usage error."""
    from dataclasses import replace

    from ktcli.config import Settings
    from ktcli.engine import loading
    from ktcli.engine.safetensors_header import write_file

    folder = tmp_path / "model"
    from tests.engine.conftest import build_tiny

    build_tiny("llama", folder)
    from safetensors.numpy import load_file

    arrays = load_file(str(folder / "model.safetensors"))
    entries = [(n, "F32", a.shape, a.nbytes) for n, a in arrays.items()]
    with open(folder / "model.safetensors", "wb") as f:
        write_file(f, entries, arrays.values(), {"format": "pt"}, checksums=True)
    _flip_inside_tensor(folder / "model.safetensors", "model.layers.0.mlp.down_proj.weight")
    before = (folder / "model.safetensors").read_bytes()
    settings = replace(Settings(), model=str(folder), cache_dir=str(tmp_path / "cache"), device="cpu",
                       weights="fp32")
    with pytest.raises(DamagedWeightsError, match="changed since it was written") as caught:
        loading.load_backend(settings)
    assert caught.value.exit_code == 2 and (folder / "model.safetensors").read_bytes() == before


def test_a_converted_tokenizer_changed_in_place_is_converted_again(tmp_path):
    """Only the tokenizer's first and last bytes were checked: a token renamed inside it
    was "tokenizer.json cannot be read ...; copy or download the model again" on every run
    (blamed on the user's model, never mended), a merge changed was other tokens, silently.
    The conversion keeps each file's sha1 (`DIGEST_RECORD`), checked as the folder is."""
    from tests.engine.conftest import build_tiny
    from tests.engine.tiny_gguf import write_gguf

    gguf = write_gguf(build_tiny("llama", tmp_path / "hf"), tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    source = model_store.resolve_model(str(gguf))
    folder = ensure_hf_dir(source, cache)
    key = model_store.model_key(folder, "x")
    assert (folder / model_store.DIGEST_RECORD).is_file() and model_store._usable(folder)
    for name in ("tokenizer.json", "config.json", "tokenizer_config.json"):
        good = (folder / name).read_bytes()
        middle = len(good) // 2
        (folder / name).write_bytes(good[:middle] + bytes([good[middle] ^ 0x01]) + good[middle + 1:])
        model_store._CONTENT_HASHES.clear()  # (a new process: the memo is one process's)
        assert model_store._digest_holds(folder) is False and not is_converted(source, cache)
        said: list[str] = []
        assert ensure_hf_dir(source, cache, said.append) == folder and "damaged" in said[0]
        assert (folder / name).read_bytes() == good and model_store.model_key(folder, "x") == key
    # A folder converted before digests were kept (damaged then, perhaps) is converted again
    # once, said so, and keeps its key (its packed weights are read as before).
    (folder / model_store.DIGEST_RECORD).unlink()
    assert not is_converted(source, cache)
    said = []
    assert ensure_hf_dir(source, cache, said.append) == folder
    assert said == ["converting tiny.gguf again, once: its files' checksums are kept from now on"]
    assert (folder / model_store.DIGEST_RECORD).is_file() and model_store.model_key(folder, "x") == key
    (folder / model_store.DIGEST_RECORD).write_text("{damaged")
    assert not is_converted(source, cache)


def _runs_of(version: int, source: ModelSource, cache: Path, monkeypatch) -> Path:
    """A run of a ktcli whose conversions are of `version` (a new process: nothing remembered)."""
    monkeypatch.setattr(model_store, "CONVERSION_VERSION", version)
    monkeypatch.setattr(model_store, "_FINGERPRINTS", {})
    return ensure_hf_dir(source, cache)


def _packed_beside(folder: Path, cache: Path) -> Path:
    packed = cache / "packed" / f"{folder.name}-0123456789abcdef.int8.safetensors"
    packed.parent.mkdir(exist_ok=True)
    packed.write_bytes(b"x")
    return packed


def test_two_conversion_versions_sharing_a_cache_keep_their_own_conversions(source, tmp_path, monkeypatch):
    """An older ktcli and a newer one on one cache folder dropped each other's conversion of
    the same GGUF (and its packed weights) on each conversion: alternating between them
    converted (~40 s through transformers' reader) and packed again on every run."""
    calls: list[Path] = []
    monkeypatch.setattr(model_store, "_convert_gguf", _fake_convert(calls))
    cache = tmp_path / "cache"
    old = _runs_of(6, source, cache, monkeypatch)
    old_packed = _packed_beside(old, cache)
    new = _runs_of(7, source, cache, monkeypatch)
    new_packed = _packed_beside(new, cache)
    for _ in range(2):
        assert _runs_of(6, source, cache, monkeypatch) == old and _runs_of(7, source, cache, monkeypatch) == new
    assert len(calls) == 2 and old.exists() and new.exists() and old_packed.exists() and new_packed.exists()
    # The GGUF upgraded in place: the new version's stale conversion goes, the old version's stays.
    source.path.write_bytes(source.path.read_bytes() + b"\0" * 64)
    newer = _runs_of(7, source, cache, monkeypatch)
    assert newer not in (old, new) and not new.exists() and not new_packed.exists()
    assert old.exists() and old_packed.exists() and len(calls) == 3


def test_other_versions_conversions_are_bounded_by_count_and_age(source, tmp_path, monkeypatch):
    """Kept for another version, a conversion does not stay for good: a third version's
    drops the least recently used, and one unused for OTHER_VERSION_KEPT_S goes on the
    next run of any version (an upgrade's leftover), with its packed weights."""
    import os
    import time

    calls: list[Path] = []
    monkeypatch.setattr(model_store, "_convert_gguf", _fake_convert(calls))
    cache = tmp_path / "cache"

    def age(folder: Path, seconds: float) -> None:
        when = time.time() - seconds
        for path in (folder / "config.json", folder):
            os.utime(path, (when, when))

    five = _runs_of(5, source, cache, monkeypatch)
    six = _runs_of(6, source, cache, monkeypatch)
    age(five, 200)
    age(six, 100)  # 6 used after 5
    seven = _runs_of(7, source, cache, monkeypatch)
    assert not five.exists() and six.exists() and seven.exists()
    six_packed = _packed_beside(six, cache)
    age(six, model_store.OTHER_VERSION_KEPT_S + 60)
    assert _runs_of(7, source, cache, monkeypatch) == seven and len(calls) == 3  # no conversion: a warm run
    assert not six.exists() and not six_packed.exists() and seven.exists()


def test_two_versions_sharing_a_cache_remember_their_own_fingerprints(source, tmp_path, monkeypatch):
    """The record of each GGUF's fingerprint was keyed by the file's path alone: two versions
    replaced each other's entry, and each run of either read the whole file again (~6 s for
    4 GB)."""
    calls: list[Path] = []
    monkeypatch.setattr(model_store, "_convert_gguf", _fake_convert(calls))
    read: list[Path] = []
    refuse = model_store._refuse_unconvertible
    monkeypatch.setattr(model_store, "_refuse_unconvertible", lambda path: (read.append(path), refuse(path)))
    cache = tmp_path / "cache"
    for _ in range(3):
        _runs_of(6, source, cache, monkeypatch)
        _runs_of(7, source, cache, monkeypatch)
    assert len(read) == 2 and len(calls) == 2  # each version's first run reads the file whole; no other does
    # A record an earlier ktcli wrote (keyed by the path alone) is still read.
    import json

    record = cache / "models" / model_store.FINGERPRINT_RECORD
    remembered = json.loads(record.read_text())
    monkeypatch.setattr(model_store, "CONVERSION_VERSION", 6)
    remembered = {str(source.path): remembered[model_store._remembered_key(source.path)]}
    record.write_text(json.dumps(remembered))
    _runs_of(6, source, cache, monkeypatch)
    assert len(read) == 2 and len(calls) == 2
