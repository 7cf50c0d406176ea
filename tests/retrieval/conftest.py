from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def real_embedder():
    """The bundled all-MiniLM-L6-v2, loaded once for the whole session (~5 s)."""
    from ktcli.retrieval.embedder import Embedder

    embedder = Embedder("minilm")
    embedder.embed(["warm up"])
    return embedder
