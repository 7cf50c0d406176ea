"""How much each key channel matters to the model's queries: the weights that int4 pages
use to share out their key bits (`kernels.reference.key_widths`).

Why: an int4 page has 4 x head_dim bits per key row and kv head. Spending them where the
queries look (channel c weighted by the mean q_c^2 over the kv head's query heads) cuts
int4's KL to fp32 on SmolLM2 by 44% and its perplexity cost by a third (BENCHMARKS.md,
"int4 with per-channel key widths"). The channels a head's queries use are a property of
the model, not of the document: weights measured once on a fixed text
(`data/key_calibration.txt`, 1,024 tokens) did as well as each sequence's own queries,
and far better than a prior from the weights alone (W_q rows times the RMSNorm gains).

Measured here by running the text through the engine's own prefill (int4 pages, dense
attention at true positions whatever the load's policy) while
`KernelKVCache.attend_layer` adds up q^2 per layer, kv head and channel, RoPE applied:
over 1,024 positions a fast-turning RoPE pair spreads its q^2 evenly over its two
channels, while a slow pair (the ones long-range heads read) keeps its own per-channel
profile, as the keys it meets do. (Averaging every pair, which would make the weights
independent of the rotation, did worse in an A/B on SmolLM2, dense int4, 2,048 tokens:
KL 0.0150 against 0.0144, needle log-probability -1.79 / -2.86 at 2K / 4K against -1.64
/ -2.67; perplexity +2.06% against +2.31%.) Kept next to the packed weights
(`engine.pack_cache`, ~23 KB for SmolLM2); a model without a tokenizer keeps weight 1
everywhere (widths by range alone).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ktcli.engine.model_store import model_key
from ktcli.engine.safetensors_header import crc32

# bump when the text, the token count or the statistic changes (4: the file holds the
# weights' CRC32 beside them)
FORMAT = 4
TEXT = Path(__file__).parent / "data" / "key_calibration.txt"
TOKENS = 1024
_memo: dict[str, torch.Tensor] = {}  # model key -> weights [L, H, D], for loads in one process


def query_square_sums(q: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """q [T, HQ, D] -> sum over tokens and the kv head's query heads of q^2: [H, D] float32."""
    t, hq, d = q.shape
    return q.float().square().view(t, n_kv_heads, hq // n_kv_heads, d).sum((0, 2))


def measure(backend) -> torch.Tensor | None:
    """Weights [L, H, D] from a prefill of the calibration text, normalised to mean 1 per
    layer and head; None without a tokenizer."""
    if backend.tokenizer is None:
        return None
    kv = backend.kv
    # No more than the pages hold: a model of a 512-token window has pages for ~600, and
    # the 1,024-token measurement filled them ("KV cache full" for any --kv-dtype int4 run).
    room = min(backend.context_window, kv.num_blocks * kv.block_size) - kv.block_size
    ids = backend.tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)[:max(1, min(TOKENS, room))]
    kv.calibration = torch.zeros(kv.n_layers, kv.n_kv_heads, kv.head_dim, device=kv.device)
    try:
        with kv.dense_attention():  # the same queries whatever policy this load uses
            backend.engine.prompt_logits(ids, all_rows=False)
        sums = kv.calibration.cpu()
    finally:
        kv.calibration = None
    return sums / sums.mean(-1, keepdim=True).clamp(min=1e-30)


def _read(path: Path, shape: tuple[int, ...] | None = None) -> torch.Tensor | None:
    """The weights kept at `path` (of `shape`, where given), where their CRC32 is the one
    written beside them: bytes changed in place inside the tensor's record (a disk error, a
    stray write) loaded as other finite weights, and int4 pages shared their key bits by
    them, silently (torch.load checks no checksum). ~1 ms for SmolLM2's 23 KB."""
    try:
        kept = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # absent, truncated, foreign: measure afresh
        return None
    if not isinstance(kept, dict):  # an older FORMAT's bare tensor, or foreign
        return None
    w, crc = kept.get("weights"), kept.get("crc32")
    ok = isinstance(w, torch.Tensor) and w.dtype == torch.float32 and (shape is None or tuple(w.shape) == shape)
    return w if ok and _crc(w) == crc and bool(torch.isfinite(w).all()) else None


def _crc(w: torch.Tensor) -> int:
    return crc32(w.contiguous().view(-1).view(torch.uint8).numpy())


def _write(path: Path, w: torch.Tensor) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        w = w.contiguous()
        torch.save({"weights": w, "crc32": _crc(w)}, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError):  # torch.save raises RuntimeError for an unwritable file
        # a cache that cannot be written costs a measurement next time, nothing else
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _kept_at(model_dir: Path, cache_root: Path | None) -> tuple[str, Path | None]:
    """This model's memo key and the file under `cache_root` that keeps its weights."""
    key = model_key(model_dir, f"keys-{FORMAT}")
    return key, Path(cache_root) / f"{key}.keyweights.pt" if cache_root is not None else None


def is_kept(model_dir: Path, cache_root: Path | None) -> bool:
    """Whether this model's key weights are on hand already (else a load measures them:
    a prefill of the 1,024-token calibration text: 0.6 s for SmolLM2 on the 2-core Xeon)."""
    key, path = _kept_at(model_dir, cache_root)
    # (read and checked, as `calibrate` will: by existence, a damaged file was said to be
    # on hand and its load then measured for seconds, unannounced)
    return key in _memo or (path is not None and _read(path) is not None)


def calibrate(backend, model_dir: Path, cache_root: Path | None) -> bool:
    """Give every layer of an int4 `KernelKVCache` its key weights: from this process's
    memo, the cache under `cache_root`, or a measurement (then kept in both). Must run
    before any real sequence seals a page. False when no weights could be had."""
    kv = backend.kv
    shape = (kv.n_layers, kv.n_kv_heads, kv.head_dim)
    key, path = _kept_at(model_dir, cache_root)
    w = _memo.get(key)
    if w is None and path is not None:
        w = _read(path, shape)
    if w is None:
        w = measure(backend)
        if w is None:
            return False
        if path is not None:
            _write(path, w)
    _memo[key] = w
    for layer, lw in zip(kv.layers, w):
        layer.k_weight.copy_(lw.to(layer.k_weight.device))
    return True
