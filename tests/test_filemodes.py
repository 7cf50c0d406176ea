"""What ktcli writes to its cache gets the modes the umask allows: a cache warmed as one user
(a Docker image built as root, a CI cache) is readable by another."""

from __future__ import annotations

import os
import stat

import torch

from ktcli import filemodes


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_cache_writers_give_what_the_umask_allows(tmp_path, monkeypatch):
    from ktcli.engine import pack_cache
    from ktcli.retrieval.store import IndexStore

    old = os.umask(0o022)
    filemodes._umask.cache_clear()
    try:
        folder = tmp_path / "model.tmp-x"
        folder.mkdir(mode=0o700)
        (folder / "model.safetensors").touch(mode=0o600)
        filemodes.as_umask_allows(folder)
        assert (_mode(folder), _mode(folder / "model.safetensors")) == (0o755, 0o644)
        store = IndexStore(tmp_path / "index")
        store._atomic_write(tmp_path / "index" / "entry.json", b"{}")
        assert _mode(tmp_path / "index" / "entry.json") == 0o644
        # packed weights: safetensors' own file is owner-only
        from safetensors.torch import save_file

        monkeypatch.setattr("safetensors.torch.save_file",
                            lambda tensors, name, metadata=None: (save_file(tensors, name, metadata=metadata),
                                                                  os.chmod(name, 0o600)))
        w = type("W", (), {})()
        w.embed, w.norm, w.lm_head, w.layers = torch.zeros(2, 2), torch.ones(2), torch.zeros(2, 2), []
        assert pack_cache.save(tmp_path / "packed" / "m.int8.safetensors", w)
        assert _mode(tmp_path / "packed" / "m.int8.safetensors") == 0o644
        os.umask(0o077)  # a user who wants the cache private keeps it so
        filemodes._umask.cache_clear()
        filemodes.as_umask_allows(folder)
        assert _mode(folder / "model.safetensors") == 0o600
    finally:
        os.umask(old)
        filemodes._umask.cache_clear()
