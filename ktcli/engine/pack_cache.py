"""int8 weights packed once per model and kept in ktcli's cache folder, so a warm start
reads the packed matrices instead of reading every fp32 weight and packing it again; and a
converted GGUF's weights in bf16 or fp16 (a GPU's), which would otherwise be dequantized
from the GGUF on every load (`gguf_weights`); fp32 is not kept (4x the GGUF).

Why: packing SmolLM2-135M for `--weights int8` (the CPU default) reads its 540 MB of fp32
weights and computes every 32-value block's scale, minimum and codes: ~0.4 s of each `ktcli
ask`'s ~3.5 s time to first token on the 2-core Xeon. The packed model is 152 MB, read back
in a fraction of that (`benchmarks.startup` records the load).

The second: a GGUF's weights dequantized took 3.3-4.1 s of every bf16 load of the bundled
model, against 1.6-2.5 s reading the float32 copy the conversion wrote before
(`benchmarks.gguf_weights`); kept in bf16 (270 MB), they are read back as fast as the
int8 ones, and a model's folder from Hugging Face is read as it is (its files are as fast).

A cached file is keyed by the model folder's name, each weight file's name, size and
modification time and each JSON file's content (`model_store.model_key`: not the folder's
path, so a copied or moved cache keeps its packed weights), and by FORMAT (bump it when
`int8_gemv`'s packing or the engine's weight layout changes), so a changed model or a new
packing never reads a stale file. Anything
unexpected in a cached file (missing or misshaped tensors, a read error, a tensor whose
CRC32 is not the one written beside it) makes the caller pack afresh; a cache folder that
cannot be written is skipped silently.

The CRC32s: bytes changed in place in the packed file (a disk error, a stray write; the
file keeps its size, so the header's check of its length passes) were read as weights, and
every answer came out empty. Checked as each tensor is read: ~45 ms of CPU for SmolLM2's
151 MB on the 2-core Xeon (zlib.crc32; a sampled check would miss a few bytes changed
outside its samples, and a sum of words misses bytes moved within a tensor).
"""

from __future__ import annotations

import glob
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import torch

from ktcli.engine.config import ModelConfig
from ktcli.engine.gguf_weights import linked_gguf
from ktcli.engine.model_store import OTHER_VERSION_KEPT_S, OTHER_VERSIONS_KEPT, model_key, sweep_stale
from ktcli.engine.safetensors_header import checksums_of, crc32, read_header, write_file
from ktcli.engine.weights import DTYPES, LayerWeights, ModelWeights, load_weights

FORMAT = 2  # 2: each tensor's CRC32 in the metadata
PACKED_DIR = "packed"  # under the cache folder
_LAYER_FIELDS = [f.name for f in fields(LayerWeights)]


def cache_file(root: Path, folder: Path, weights: str = "int8") -> Path:
    """Where the `weights` (int8: packed) of the model in `folder` live under `root`."""
    return Path(root) / f"{model_key(folder, str(FORMAT))}.{weights}.safetensors"


# safetensors' names of the dtypes packed files hold
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.uint8: "U8"}


def save(path: Path, w: ModelWeights) -> bool:
    """Write `w` (packed int8 or float matrices, fp32 vectors; on any device) to `path`,
    copying one tensor at a time to the host; False where it cannot."""
    tensors = {"embed": w.embed, "norm": w.norm}
    tied = w.lm_head.data_ptr() == w.embed.data_ptr()
    if not tied:
        tensors["lm_head"] = w.lm_head
    for i, lw in enumerate(w.layers):
        for name in _LAYER_FIELDS:
            t = getattr(lw, name)
            if t is not None:
                tensors[f"layers.{i}.{name}"] = t
    meta = {"format": str(FORMAT), "layers": str(len(w.layers)), "tied": "1" if tied else "0"}
    entries = [(name, _SAFETENSORS_DTYPES[t.dtype], tuple(t.shape), t.numel() * t.element_size())
               for name, t in tensors.items()]
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write_file(f, entries, (_host_array(t) for t in tensors.values()), meta, checksums=True)
            f.flush()
            os.fsync(f.fileno())  # on disk before it has its name: a crash left zeros, read as weights
        os.replace(tmp, path)  # readers see the whole file or none
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # the folder itself could not be made
            pass
        return False
    _drop_stale(path)
    return True


def _host_array(t: torch.Tensor):
    """`t`'s bytes as a numpy array on the host (bf16, which numpy lacks, as int16)."""
    t = t.detach().to("cpu").contiguous()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


def drop_packed(root: Path, folder_name: str) -> None:
    """Remove what is kept under `root` for model folders named `folder_name` (one that is
    gone): packed weights, int4 key calibrations (`<folder name>-<key>.<kind>`)."""
    for old in Path(root).glob(f"{glob.escape(folder_name)}-*"):
        key = old.name[len(folder_name) + 1 :].split(".", 1)[0]
        if "-" not in key and old.is_file():
            try:
                old.unlink()
            except OSError:
                pass


def _drop_stale(path: Path) -> None:
    """Remove the packed files of earlier versions of the same model folder name (changed
    weights leave their old file behind, 151 MB for SmolLM2), and temp files of killed
    runs. Another folder of the same name loses its file too, and is packed again on its
    next load: a cost, never an error. A file of another FORMAT (another ktcli version
    sharing the cache) is kept while it is one of the OTHER_VERSIONS_KEPT last used and
    used within OTHER_VERSION_KEPT_S (`model_store`): dropped on each save, alternating
    between two versions packed again on every run."""
    sweep_stale(path.parent, "*.tmp")
    kind = ".".join(path.name.rsplit(".", 2)[-2:])  # "bf16.safetensors": a model run in int8 and bf16 keeps both
    others: list[tuple[float, Path]] = []  # (last used, file) of other formats'
    for old in path.parent.glob(f"*.{kind}"):
        if old != path and old.name.rsplit("-", 1)[0] == path.name.rsplit("-", 1)[0]:
            fmt = _format_of(old)
            if fmt is not None and fmt != str(FORMAT):
                others.append((_last_used(old), old))
            else:
                _unlink(old)
    now = time.time()
    for rank, (used, old) in enumerate(sorted(others, key=lambda o: o[0], reverse=True)):
        if rank >= OTHER_VERSIONS_KEPT or now - used > OTHER_VERSION_KEPT_S:
            _unlink(old)


def _format_of(path: Path) -> str | None:
    """The FORMAT a packed file was written in ("" where it names none); None where it
    cannot be read (damaged: dropped)."""
    try:
        header, _ = read_header(path)
    except Exception:  # noqa: BLE001 - a truncated or foreign file
        return None
    meta = header.get("__metadata__")
    return str(meta.get("format", "")) if isinstance(meta, dict) else ""


def _last_used(path: Path) -> float:
    """When a load last read `path`: its modification time, set by each load that marks it
    (`load_or_pack`). (Not its access time, which `_format_of` reading the header sets: a
    file read by the sweep would never age.)"""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def load(path: Path, cfg: ModelConfig, weights: str = "int8", device: torch.device | str = "cpu") -> ModelWeights | None:
    """The `weights` in `path` on `device`, or None when absent or not what `cfg` needs."""
    if not path.is_file():
        return None
    try:
        from ktcli.engine.weights import TensorReader

        # Each tensor read straight into memory of its own: through a memory map, the
        # mapped file stayed resident beside the copies until closed (+150 MB at load for
        # SmolLM2, the size of the model for any other).
        with TensorReader([path], verify=False) as f:  # (checked below, and its sums required)
            meta = f.metadata
            if meta.get("format") != str(FORMAT) or meta.get("layers") != str(cfg.n_layers):
                return None
            sums = checksums_of(meta)
            if sums is None or set(sums) != set(f.names()):
                return None
            t = _read_checked(f, sums, device)
            if t is None:
                return None  # bytes changed since it was written: pack afresh
        layers = [LayerWeights(**{name: t.get(f"layers.{i}.{name}") for name in _LAYER_FIELDS})
                  for i in range(cfg.n_layers)]
        embed = t["embed"]
        if meta.get("tied") == "1" and cfg.tie_embeddings is False:
            return None  # packed tied before an untied config's missing head was refused: packing says so now
        lm_head = embed if meta.get("tied") == "1" else t["lm_head"]
        w = ModelWeights(embed=embed, layers=layers, norm=t["norm"], lm_head=lm_head)
    except Exception:  # a truncated or foreign file: pack afresh
        return None
    return w if _fits(w, cfg, weights) else None


def _read_checked(f, sums: dict[str, int], device) -> dict[str, torch.Tensor] | None:
    """Every tensor of `f` on `device`, each checked against its CRC32 in `sums` as it is
    read; None at the first that differs. (Moved one by one: the host holds one tensor at
    a time, as a load from the folder does.)"""
    out: dict[str, torch.Tensor] = {}
    for name in f.names():
        host = f.get(name)
        if crc32(host.view(-1).view(torch.uint8).numpy()) != sums[name]:
            return None
        out[name] = host.to(device)
    return out


def _fits(w: ModelWeights, cfg: ModelConfig, weights: str = "int8") -> bool:
    """The shapes and dtypes the engine reads, so a file from another model is never used."""
    dtype = DTYPES[weights]  # (int8's: uint8, packed)
    row = cfg.hidden_size // 8 + cfg.hidden_size if weights == "int8" else cfg.hidden_size  # a hidden-wide row
    if w.embed.dtype != dtype or tuple(w.embed.shape) != (cfg.vocab_size, row):
        return False
    for lw in w.layers:
        if lw.qkv is None or lw.qkv.dtype != dtype or lw.qkv.shape[0] != cfg.q_size + 2 * cfg.kv_size:
            return False
        if lw.gate_up is None or lw.gate_up.shape[0] != 2 * cfg.intermediate_size or lw.down is None or lw.o is None:
            return False
        if lw.in_norm is None or lw.post_norm is None:
            return False
    return True


def load_or_pack(folder: Path, cfg: ModelConfig, root: Path | None, pack: Callable[[], ModelWeights],
                 weights: str = "int8", device: torch.device | str = "cpu") -> ModelWeights:
    """The cached `weights` of `folder` under `root` on `device`, else `pack()` (on the CPU
    or `device`; then cached, and moved). KTCLI_NO_PACK_CACHE=1 packs every time and writes nothing."""
    if root is None or os.environ.get("KTCLI_NO_PACK_CACHE"):
        return _moved(pack(), device)
    path = cache_file(root, folder, weights)
    w = load(path, cfg, weights, device)
    if w is None:
        w = pack()
        save(path, w)
        return _moved(w, device)
    try:
        os.utime(path)  # used: another version's file is kept while used (`_drop_stale`)
    except OSError:
        pass  # a cache another user warmed, read-only here
    _drop_stale(path)  # (an upgrade's leftover file otherwise stayed until this model's next pack)
    return w


def load_engine_weights(folder: Path, cfg: ModelConfig, weights: str, device, root: Path | None) -> ModelWeights:
    """`weights.load_weights`, through the cache under `root` for int8 weights, and for a
    converted GGUF's in any dtype."""
    if weights == "int8":
        return load_or_pack(folder, cfg, root, lambda: load_weights(folder, cfg, weights, device))
    if linked_gguf(folder) is None or weights == "fp32":
        # (fp32, an exactness mode, is dequantized each load: kept, it would be the 4x copy
        # of the GGUF that `gguf_weights` does away with, 538 MB for the bundled model)
        return load_weights(folder, cfg, weights, device)
    # Dequantized straight onto the device, then kept from there a tensor at a time: made on
    # the host, a GPU's first bf16 load held the whole model there (~14 GB for a 7B).
    return load_or_pack(folder, cfg, root, lambda: load_weights(folder, cfg, weights, device), weights, device)


def _moved(w: ModelWeights, device: torch.device | str) -> ModelWeights:
    """`w` on `device`, its tied head still the embedding itself."""
    if torch.device(device).type == "cpu":
        return w
    embed = w.embed.to(device)
    return ModelWeights(
        embed=embed, norm=w.norm.to(device), lm_head=embed if w.lm_head is w.embed else w.lm_head.to(device),
        layers=[LayerWeights(**{name: None if getattr(lw, name) is None else getattr(lw, name).to(device)
                                for name in _LAYER_FIELDS}) for lw in w.layers])
