"""A BERT sentence encoder in plain torch, for sentence-transformers folders of the
common shape: a BERT model, mean pooling, then (optionally) L2 normalisation.

Why not sentence-transformers itself: importing it takes ~6 s on this 2-core machine
(it pulls in transformers, scikit-learn, scipy and torch.distributed), and every
`ktcli ask` whose chunk embeddings are all cached still embeds the question. Here the
cost is reading a 90 MB safetensors file and `tokenizers`' tokenizer.json: well under
a second. It computes the same function (same tokenizer file, same weights, fp32, exact
GELU, the same mean pooling); tests hold it to sentence-transformers' vectors. On a CPU
with AMX tiles its matrix products run in bf16 (autocast; layer norms, softmax and pooling
stay fp32): 3.1x the fp32 speed on a 2-core Xeon, the vectors within 3e-5 of fp32's in
cosine (benchmarks/embed_dtype.py), so a cold index of a repo takes a third of the time
and an index cached either way serves the other. Folders of
any other shape (a Dense layer, CLS pooling, another architecture) still go through
sentence-transformers (`retrieval.embedder`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"


def _read_json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def supports(folder: Path) -> bool:
    """True when `folder` is a BERT + mean pooling (+ normalize) sentence-transformers
    model with safetensors weights and a tokenizer.json: what this module computes."""
    modules = _read_json(folder / "modules.json")
    config = _read_json(folder / "config.json")
    if not isinstance(modules, list) or not isinstance(config, dict):
        return False
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    if types not in ([_TRANSFORMER, _POOLING], [_TRANSFORMER, _POOLING, _NORMALIZE]):
        return False
    if modules[0].get("path", "") != "":
        return False
    pooling = _read_json(folder / modules[1].get("path", "") / "config.json")
    if not isinstance(pooling, dict):
        return False
    other_modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens" and v]
    if not pooling.get("pooling_mode_mean_tokens") or other_modes:
        return False
    return (
        config.get("model_type") == "bert"
        and config.get("position_embedding_type", "absolute") == "absolute"
        and config.get("hidden_act") == "gelu"
        and (folder / "model.safetensors").is_file()
        and (folder / "tokenizer.json").is_file()
    )


class BertSentenceEncoder:
    """encode(texts) -> float32 [n, dim]; rows L2-normalised when the folder says so."""

    def __init__(self, folder: Path, device: str = "cpu", dtype: str = "auto"):
        """dtype: the matrix products' (`auto`: bf16 on a CPU with AMX, else fp32)."""
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        folder = Path(folder)
        cfg = _read_json(folder / "config.json")
        st_cfg = _read_json(folder / "sentence_bert_config.json") or {}
        modules = _read_json(folder / "modules.json")
        assert isinstance(cfg, dict) and isinstance(modules, list)
        self.normalize = len(modules) == 3
        self.n_layers = int(cfg["num_hidden_layers"])
        self.n_heads = int(cfg["num_attention_heads"])
        self.hidden = int(cfg["hidden_size"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        max_positions = int(cfg.get("max_position_embeddings", 512))
        # sentence-transformers' max_seq_length, else the tokenizer's, capped by positions
        tok_cfg = _read_json(folder / "tokenizer_config.json") or {}
        limit = st_cfg.get("max_seq_length") or tok_cfg.get("model_max_length") or max_positions
        self.max_seq_length = int(min(int(limit), max_positions))
        if st_cfg.get("do_lower_case"):
            raise ValueError("do_lower_case in sentence_bert_config.json is not supported here")

        self.device = torch.device(device)
        if dtype == "auto":
            from ktcli.hardware import native_bf16_matmul

            dtype = "bf16" if self.device.type == "cpu" and native_bf16_matmul() else "fp32"
        if dtype not in ("fp32", "bf16"):
            raise ValueError(f"embedding dtype {dtype!r}: fp32 or bf16")
        self.dtype = dtype
        w = {k: v.to(self.device, torch.float32) for k, v in load_file(str(folder / "model.safetensors")).items()
             if v.is_floating_point()}
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in w else ""
        self.w = {k[len(prefix):]: v for k, v in w.items() if k.startswith(prefix)}
        # q, k, v of a layer as one [3 * hidden, hidden] product
        for i in range(self.n_layers):
            p = f"encoder.layer.{i}.attention.self."
            self.w[p + "qkv.weight"] = torch.cat([self.w[p + n + ".weight"] for n in ("query", "key", "value")])
            self.w[p + "qkv.bias"] = torch.cat([self.w[p + n + ".bias"] for n in ("query", "key", "value")])

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # The file carries its own fixed padding/truncation (128 here); transformers
        # overrides them per call, and so do we: truncate to max_seq_length, pad to the
        # longest text of the batch.
        self.tokenizer.enable_truncation(self.max_seq_length)
        pad_id = int(cfg.get("pad_token_id", 0) or 0)
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=self.tokenizer.id_to_token(pad_id) or "[PAD]")

    @property
    def dim(self) -> int:
        return self.hidden

    def encode(self, texts: list[str]) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        encodings = self.tokenizer.encode_batch(texts)
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long, device=self.device)
        types = torch.tensor([e.type_ids for e in encodings], dtype=torch.long, device=self.device)
        mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.bool, device=self.device)
        n, length = ids.shape
        H, heads = self.hidden, self.n_heads
        w = self.w

        def ln(x: torch.Tensor, name: str) -> torch.Tensor:
            return F.layer_norm(x, (H,), w[name + ".weight"], w[name + ".bias"], self.eps)

        def dense(x: torch.Tensor, name: str) -> torch.Tensor:
            return F.linear(x, w[name + ".weight"], w[name + ".bias"])

        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.dtype == "bf16")
        with torch.inference_mode(), autocast:
            positions = torch.arange(length, device=self.device)
            x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][positions]
                 + w["embeddings.token_type_embeddings.weight"][types])
            x = ln(x, "embeddings.LayerNorm")  # [n, L, H]
            # Padding keys are masked out for every query: [n, 1, 1, L] broadcast over heads and rows
            key_mask = mask[:, None, None, :]
            for i in range(self.n_layers):
                p = f"encoder.layer.{i}."
                qkv = dense(x, p + "attention.self.qkv")  # [n, L, 3H]
                # [n, L, 3H] -> [3, n, heads, L, H / heads]
                q, k, v = qkv.view(n, length, 3, heads, H // heads).permute(2, 0, 3, 1, 4)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)  # [n, heads, L, H / heads]
                o = o.transpose(1, 2).reshape(n, length, H)
                x = ln(dense(o, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
                h = F.gelu(dense(x, p + "intermediate.dense"))  # exact (erf) GELU, as BERT's "gelu"
                x = ln(dense(h, p + "output.dense") + x, p + "output.LayerNorm")
            # Mean over the real tokens of each text
            m = mask.unsqueeze(-1).to(x.dtype)  # [n, L, 1]
            pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)  # [n, H]
            if self.normalize:
                pooled = F.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()
