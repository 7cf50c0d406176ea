"""The store across processes: a build killed with SIGKILL, and two builds at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ktcli.retrieval.retriever import HybridIndex
from ktcli.retrieval.store import IndexStore
from tests.retrieval import build_worker
from tests.retrieval.fakes import HashEmbedder

REPO = Path(__file__).resolve().parents[2]
TOTAL = build_worker.N_DOCS * build_worker.CHUNKS_PER_DOC


def _start(cache_dir: Path, out: Path, delay_s: float, commit_every: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.retrieval.build_worker", str(cache_dir), str(out), str(delay_s), str(commit_every)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _reference(tmp_path: Path) -> dict:
    index = HybridIndex.build(build_worker.corpus(), embedder=HashEmbedder(), store=IndexStore(tmp_path / "ref"))
    return build_worker.summary(index)


def test_kill_9_mid_build_then_rebuild_completes(tmp_path):
    cache = tmp_path / "cache"
    proc = _start(cache, tmp_path / "never.json", delay_s=0.05, commit_every=6)
    embedded = 0
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while embedded < 14 and time.monotonic() < deadline:  # past two commits of 6 chunks
        line = proc.stdout.readline()
        if not line:
            break
        stage, done, _total = line.split()
        embedded = int(done) if stage == "embed" else embedded
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert embedded >= 14, proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "never.json").exists()

    index = HybridIndex.build(build_worker.corpus(), embedder=HashEmbedder(), store=IndexStore(cache))
    stats = index.stats
    assert 12 <= stats["n_reused"] < TOTAL  # the committed groups survived the kill
    assert stats["n_reused"] + stats["n_embedded_now"] == TOTAL
    reference = _reference(tmp_path)
    assert build_worker.summary(index)["hits"] == reference["hits"]
    again = HybridIndex.build(build_worker.corpus(), embedder=HashEmbedder(), store=IndexStore(cache))
    assert again.stats["n_embedded_now"] == 0


def test_two_processes_build_the_same_corpus_at_once(tmp_path):
    cache = tmp_path / "cache"
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    procs = [_start(cache, out, delay_s=0.01, commit_every=3) for out in outs]
    for proc in procs:
        _stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    a, b = (json.loads(out.read_text()) for out in outs)
    assert a["hits"] == b["hits"]
    assert a["vectors_sha256"] == b["vectors_sha256"]
    assert a["stats"]["n_chunks"] == b["stats"]["n_chunks"] == TOTAL

    reference = _reference(tmp_path)
    assert a["hits"] == reference["hits"]
    # what they left behind is complete and consistent
    index = HybridIndex.build(build_worker.corpus(), embedder=HashEmbedder(), store=IndexStore(cache))
    assert index.stats["n_embedded_now"] == 0
    assert build_worker.summary(index)["hits"] == reference["hits"]
    assert not list((cache / "index" / "tmp").iterdir())
