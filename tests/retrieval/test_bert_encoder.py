"""The plain-torch BERT encoder against sentence-transformers on the bundled MiniLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ktcli.retrieval.bert_encoder import BertSentenceEncoder, supports
from ktcli.retrieval.embedder import Embedder, bundled_model_dir

TUTORIAL = Path(__file__).resolve().parents[2] / "sample_docs" / "python-tutorial-3.11.rst"


def _copy_model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(bundled_model_dir(), folder)
    return folder


def test_bundled_model_has_the_supported_shape():
    assert supports(bundled_model_dir())


@pytest.mark.parametrize(
    "change",
    [
        lambda f: (f / "1_Pooling" / "config.json").write_text(
            json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True})),
        lambda f: (f / "modules.json").write_text(json.dumps(
            json.loads((f / "modules.json").read_text())
            + [{"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}])),
        lambda f: (f / "config.json").write_text(json.dumps(
            dict(json.loads((f / "config.json").read_text()), model_type="roberta"))),
        lambda f: (f / "model.safetensors").unlink(),
    ],
    ids=["cls-pooling", "dense-layer", "not-bert", "no-safetensors"],
)
def test_other_shapes_are_not_claimed(tmp_path, change):
    folder = _copy_model(tmp_path)
    change(folder)
    assert not supports(folder)


def test_same_vectors_as_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    text = TUTORIAL.read_text(encoding="utf-8")
    texts = [
        "  How do I define a function?  ",  # surrounding whitespace
        "",
        "x",
        "Ünïcödé 中文 text\twith tabs\n\nand newlines",
        text[:3000],  # far past 256 word pieces: truncated the same way
        text[5000:5600],
        "def f(a, b=2):\n    return a + b",
    ]
    folder = bundled_model_dir()
    ours = BertSentenceEncoder(folder, dtype="fp32").encode(texts)
    ref = SentenceTransformer(str(folder), device="cpu", local_files_only=True).encode(
        texts, batch_size=len(texts), convert_to_numpy=True, normalize_embeddings=True)
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (len(texts), 384)
    np.testing.assert_allclose(ours, ref, atol=2e-6)
    # Batching (padding to the longest text) does not change a text's vector
    alone = BertSentenceEncoder(folder, dtype="fp32").encode([texts[5]])
    np.testing.assert_allclose(alone[0], ours[5], atol=2e-6)
    # bf16 products (the default on a CPU with AMX): the same directions, to 1e-4
    fast = BertSentenceEncoder(folder, dtype="bf16").encode(texts)
    assert fast.dtype == np.float32 and ((fast * ours).sum(1) > 1 - 1e-4).all()


def test_embedder_runs_supported_folders_here_and_others_through_sentence_transformers(tmp_path, real_embedder):
    from sentence_transformers import SentenceTransformer

    assert isinstance(real_embedder._load(), BertSentenceEncoder)
    assert real_embedder.max_tokens == 256
    folder = _copy_model(tmp_path)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True}))
    other = Embedder(str(folder))
    vec = other.embed(["a question about lighthouses"])
    assert isinstance(other._load(), SentenceTransformer)
    assert vec.shape == (1, 384) and abs(float(np.linalg.norm(vec)) - 1) < 1e-5
