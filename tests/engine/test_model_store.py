"""The converted-model cache: a damaged conversion is made again, never loaded; a cache
folder that cannot be written is one line, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ktcli.engine import model_store
from ktcli.engine.model_store import ModelSource, converted_dir, ensure_hf_dir, is_converted
from ktcli.engine.safetensors_header import DamagedWeightsError
from ktcli.engine.weights import TensorReader
from ktcli.errors import InputError


def _fake_convert(calls: list[Path]):
    def convert(gguf: Path, target: Path) -> None:
        calls.append(target)
        target.mkdir(parents=True)
        save_file({"w": torch.arange(4096, dtype=torch.float32)}, str(target / "model.safetensors"))
    return convert


@pytest.fixture
def source(tmp_path) -> ModelSource:
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF not really")
    return ModelSource("tiny", "gguf", gguf)


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
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # the damaged copy is gone


def test_a_cache_folder_that_cannot_be_written_is_one_line(source, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("")  # a file where the cache folder should be: nothing can be made under it
    with pytest.raises(InputError, match="cannot convert tiny.gguf into the cache folder"):
        ensure_hf_dir(source, blocked / "cache")
    assert not converted_dir(source, blocked / "cache").exists()
