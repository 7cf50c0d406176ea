"""Safetensors files written one tensor at a time (`safetensors_header.write_file`) read
back the same through the safetensors library, bf16 included; a tensor of the wrong size
or a missing one is an error, not a file whose offsets lie."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open

from ktcli.engine.pack_cache import _host_array
from ktcli.engine.safetensors_header import read_header, write_file


def test_a_streamed_file_reads_back_through_safetensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 5, generator=g), "b": torch.randn(7, generator=g).to(torch.bfloat16),
               "c": torch.randint(0, 255, (2, 9), dtype=torch.uint8, generator=g),
               "d": torch.randn(4, 4, generator=g).half()[:, ::2]}  # not contiguous
    dtypes = {torch.float32: "F32", torch.bfloat16: "BF16", torch.uint8: "U8", torch.float16: "F16"}
    entries = [(k, dtypes[t.dtype], tuple(t.shape), t.numel() * t.element_size()) for k, t in tensors.items()]
    path = tmp_path / "x.safetensors"
    with open(path, "wb") as f:
        write_file(f, entries, (_host_array(t) for t in tensors.values()), {"format": "1"})
    header, start = read_header(path)
    assert start % 8 == 0 and header["__metadata__"] == {"format": "1"}
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "1"}
        for k, t in tensors.items():
            assert torch.equal(f.get_tensor(k), t)


@pytest.mark.parametrize("arrays", [[np.zeros(3, np.float32), np.zeros(1, np.float32)], [np.zeros(4, np.float32)]],
                         ids=["wrong size", "one missing"])
def test_a_wrong_size_or_a_missing_tensor_is_refused(tmp_path, arrays):
    with open(tmp_path / "x.safetensors", "wb") as f, pytest.raises(ValueError):
        write_file(f, [("a", "F32", (4,), 16), ("b", "F32", (1,), 4)], iter(arrays))


def test_checksums_are_added_to_a_file_another_writer_made_and_checked(tmp_path):
    """transformers' converter writes no CRC32s: `add_checksums` rewrites its file with them
    (the same tensors and metadata), and `verify_checksums` finds a byte changed in place."""
    from safetensors.torch import load_file, save_file

    from ktcli.engine.safetensors_header import add_checksums, checksums_of, read_header, verify_checksums

    tensors = {"b": torch.arange(300, dtype=torch.float32), "a": torch.ones(7, 3, dtype=torch.bfloat16)}
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    assert verify_checksums(path)  # records none: nothing to check
    add_checksums(path)
    header, base = read_header(path)
    assert header["__metadata__"]["format"] == "pt" and set(checksums_of(header["__metadata__"])) == {"a", "b"}
    got = load_file(str(path))
    assert all(torch.equal(got[k], v) for k, v in tensors.items())
    assert verify_checksums(path) and verify_checksums(path, chunk=64)
    with open(path, "r+b") as f:
        f.seek(base + header["b"]["data_offsets"][0] + 600)
        f.write(b"\x01")
    assert not verify_checksums(path) and not verify_checksums(path, chunk=64)


@pytest.mark.parametrize(("old", "new"), [(b'"F32"', b'"F16"'), (b'"shape":[300]', b'"shape":[3x0]'),
                                          (b'"shape":[300]', b'"shape":["30"]')])
def test_a_header_changed_in_place_is_a_damaged_file(tmp_path, old, new):
    """A dtype or a shape changed in the header (the file keeps its size): our engine said
    so at load, but `--engine hf` was "internal error: SafetensorError", and a shape of text
    was blamed on config.json by the plan. Said by the header's reader, before either."""
    from safetensors.torch import save_file

    from ktcli.engine.safetensors_header import DamagedWeightsError, read_header

    path = tmp_path / "m.safetensors"
    save_file({"b": torch.arange(300, dtype=torch.float32)}, str(path))
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    head = raw[8:8 + n].rstrip(b" ").replace(old, new)  # (the header's padding takes a longer text)
    assert old in raw and len(head) <= n
    changed = raw[:8] + head + b" " * (n - len(head)) + raw[8 + n:]
    path.write_bytes(changed)
    with pytest.raises(DamagedWeightsError, match="a damaged file|not a readable safetensors file"):
        read_header(path)
