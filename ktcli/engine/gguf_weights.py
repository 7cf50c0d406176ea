"""A converted GGUF's weights, read from the GGUF itself as they are asked for.

Why: the converted folder (`gguf_convert`) held the weights dequantized to float32, 4-8x
the GGUF: 538 MB beside the bundled model's 103 MB Q4_1 file, ~28 GB for a 7B model's
4 GB. The engine reads them once to pack its int8 weights (`pack_cache`), or on each load
of another dtype (a GPU's bf16). Dequantizing each tensor when it is read gives the same
values bit for bit (`gguf_dequant`) and reads the GGUF's bytes, not 4x as many.

The folder records the GGUF it was converted from (SOURCE_RECORD), with its size and
modification time. `model_store.ensure_hf_dir` records the path each run finds the file at
(the same file in another virtualenv: the folder is named by its content), and a reader
refuses a file that no longer matches its record. transformers' loader (`--engine hf`)
needs a safetensors file: `write_safetensors` writes it into the folder on first use.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ktcli.engine import gguf_convert
from ktcli.engine.gguf_header import read_header
from ktcli.errors import CacheError, UsageError

if TYPE_CHECKING:
    import torch

# Beside a converted folder's files: the GGUF it came from (path, size, mtime).
SOURCE_RECORD = "ktcli-source.json"
# Folders whose GGUF this process found (`model_store.ensure_hf_dir`): folder -> the file, its
# size and mtime then. Read from there whatever the record says by load time: another
# virtualenv's run may rewrite the record meanwhile and delete its copy, and a cache another
# user warmed may be read-only here.
_FOUND: dict[str, tuple[Path, int, int]] = {}


def recorded_source(folder: Path) -> dict | None:
    """The folder's record {"gguf": path, "size": bytes, "mtime_ns": ns}; None where it has
    none or a damaged one."""
    try:
        record = json.loads((Path(folder) / SOURCE_RECORD).read_text())
        return record if isinstance(record, dict) and isinstance(record.get("gguf"), str) else None
    except (OSError, ValueError):
        return None


def record_source(folder: Path, gguf: Path) -> None:
    """Record `gguf` (as it is now) as the folder's source, replacing the record whole."""
    st = gguf.stat()
    record = {"gguf": str(gguf.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    path = Path(folder) / SOURCE_RECORD
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)  # a reader beside sees the old record or the new one


def found_at(folder: Path, gguf: Path) -> None:
    """Read the folder's weights from `gguf` in this process while it stays as it is now."""
    st = gguf.stat()
    _FOUND[str(Path(folder).resolve())] = (gguf.resolve(), st.st_size, st.st_mtime_ns)


def _found(folder: Path) -> Path | None:
    """The GGUF this process found for `folder`, where it is still as it was then."""
    entry = _FOUND.get(str(Path(folder).resolve()))
    if entry is None:
        return None
    path, size, mtime = entry
    try:
        st = path.stat()
    except OSError:
        return None
    return path if (st.st_size, st.st_mtime_ns) == (size, mtime) else None


def records(folder: Path, gguf: Path) -> bool:
    """Whether the folder's record names `gguf` as it is now."""
    record = recorded_source(folder)
    try:
        st = gguf.stat()
    except OSError:
        return False
    return (record is not None and record["gguf"] == str(gguf.resolve()) and record.get("size") == st.st_size
            and record.get("mtime_ns") == st.st_mtime_ns)


def linked_gguf(folder: Path) -> Path | None:
    """The GGUF a converted folder without weight files reads its weights from; None for a
    folder that records none (a model folder of its own)."""
    if any(Path(folder).glob("*.safetensors")):
        return None
    found = _found(folder)
    record = recorded_source(folder)
    return found or (Path(record["gguf"]) if record is not None else None)


class GGUFTensors:
    """Tensors by their Hugging Face names (`weights.TensorReader`'s interface), each
    dequantized from the GGUF when read, in the layout `gguf_convert` writes."""

    def __init__(self, folder: Path):
        path = linked_gguf(folder)
        if path is None or (path != _found(folder) and not records(folder, path)):
            raise UsageError(f"{folder}: its GGUF ({path or 'none recorded'}) has changed or gone since it was "
                             "converted; run again to convert it afresh")
        self.path = path
        self.header = header = read_header(path)
        self._config = gguf_convert.weight_config(header)
        self._tensors = {name: tensor for tensor, name in gguf_convert.weight_names(header)}
        self.metadata: dict[str, str] = {}

    def names(self) -> list[str]:
        return list(self._tensors)

    def has(self, name: str) -> bool:
        return name in self._tensors

    def get(self, name: str) -> torch.Tensor:
        import torch  # (here: `model_store`, which the plan imports, imports this module)

        if name not in self._tensors:
            raise UsageError(f"weights lack tensor {name}")
        try:
            return torch.from_numpy(gguf_convert.hf_weights(self._tensors[name], self._config))
        except ValueError as e:  # `Tensor.data`: the file cut short since it was converted
            raise UsageError(f"{self._tensors[name].path}: {e}") from None

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.get(name) if name in self._tensors else None

    def close(self) -> None:
        pass  # each tensor's bytes are read with their own open (`gguf_header.Tensor.data`)

    def __enter__(self) -> GGUFTensors:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_safetensors(folder: Path, target: Path | None = None) -> None:
    """Write the float32 model.safetensors of a converted folder that reads its GGUF, for
    readers that need the file (transformers' loader), into the folder or to `target`."""
    own = target is None
    target = target or Path(folder) / "model.safetensors"
    if linked_gguf(folder) is None:
        return  # a folder with weight files of its own
    reader = GGUFTensors(folder)  # (says why where the GGUF has changed or gone)
    path = reader.path
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        gguf_convert.write_safetensors(reader.header, tmp)
        os.replace(tmp, target)
        if own:
            # The folder's weights are this file now, its packed ones keyed anew: those kept
            # under the old key (bf16, fp32: 807 MB for the bundled model) were never read
            # again, nor dropped (only int8 is packed again, and drops its older file).
            from ktcli.engine.pack_cache import PACKED_DIR, drop_packed

            drop_packed(Path(folder).resolve().parent.parent / PACKED_DIR, Path(folder).resolve().name)
    except OSError as e:  # a cache folder another user warmed, read-only here; a full disk
        raise CacheError(f"cannot write the float32 weights --engine hf reads into {target.parent} "
                         f"({e.strerror or e}): make it writable, or choose another with --cache-dir") from None
    except ValueError as e:  # `Tensor.data`: the GGUF cut short since it was converted
        raise UsageError(f"{path}: {e}") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
