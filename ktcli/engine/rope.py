"""Rotary position embeddings, with the scaling schemes as data.

`inv_freq(params, head_dim, max_position, seq_len)` returns (inverse frequencies,
attention factor) for rope_type default | linear | dynamic | yarn | llama3, computing the
same numbers as transformers' ROPE_INIT_FUNCTIONS (tested against them).

The engine applies RoPE as a complex multiplication on *interleaved* pairs (dims 2i,
2i+1), which is one kernel instead of the rotate-half dance. HF checkpoints rotate the
halves (dims i, i + D/2), so the loader permutes the rows of W_q and W_k (and the Qwen3
q/k norm weights) once; a dot product q.k is unchanged when both sides are permuted the
same way, so attention is exact and V is left alone.
"""

from __future__ import annotations

import math

import torch


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    # int64 arange then float, as transformers does, so the floats are bit-identical.
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def inv_freq(params: dict, head_dim: int, max_position: int, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """[dim/2] float32 inverse frequencies and the factor cos/sin are multiplied by."""
    kind = params.get("rope_type", "default")
    theta = float(params.get("rope_theta", 10000.0))
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    if kind == "default":
        return _base_inv_freq(theta, dim), 1.0
    if kind == "linear":
        return _base_inv_freq(theta, dim) / float(params["factor"]), 1.0
    if kind == "dynamic":
        # NTK-aware: the base grows with the sequence once it passes the trained length.
        factor = float(params["factor"])
        length = max(seq_len or max_position, max_position)
        base = theta * ((factor * length / max_position) - (factor - 1)) ** (dim / (dim - 2))
        return _base_inv_freq(base, dim), 1.0
    if kind == "llama3":
        return _llama3(params, theta, dim), 1.0
    if kind == "yarn":
        return _yarn(params, theta, dim, max_position)
    raise ValueError(f"unsupported rope_type {kind!r}")


def _llama3(params: dict, theta: float, dim: int) -> torch.Tensor:
    freq = _base_inv_freq(theta, dim)
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_len = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / freq
    # Long wavelengths (low frequencies) are interpolated by `factor`, short ones kept,
    # the band between blended linearly in 1/wavelength.
    scaled = torch.where(wavelen > old_len / low, freq / factor, freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, blended, scaled)


def _yarn(params: dict, theta: float, dim: int, max_position: int) -> tuple[torch.Tensor, float]:
    original = int(params.get("original_max_position_embeddings") or max_position)
    factor = params.get("factor")
    factor = float(factor) if factor is not None else max_position / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the ramp needs a non-empty interval
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: keep the original frequency (high-frequency dims)
    return interpolation * (1 - keep) + extrapolation * keep, float(attention)


class RotaryTable:
    """Complex rotations e^{i p f} (times the attention factor) for positions 0..n-1,
    grown on demand.

    Dynamic NTK uses one base, the one for the scaled window (max_position x factor), as
    vLLM does. transformers recomputes the base from each forward's length; with chunked
    prefill that rotated a prompt's early chunks with smaller bases than its later ones
    (and a batched sequence with its neighbours' length), so attention stopped depending
    on distance alone and a 900-token prompt's answer changed with the chunk size."""

    def __init__(self, params: dict, head_dim: int, max_position: int, device: torch.device | str = "cpu"):
        self.params, self.head_dim, self.max_position = params, head_dim, max_position
        self.device = torch.device(device)  # the table lives where the positions do
        self.dynamic = params.get("rope_type") == "dynamic"
        self.rot_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        if self.rot_dim != head_dim:
            raise ValueError("partial rotary embeddings are not supported by the ktcli engine")
        self._table = torch.empty(0, head_dim // 2, dtype=torch.complex64, device=self.device)
        self._base_len = int(max_position * float(params["factor"])) if self.dynamic else None

    def _build(self, n: int, seq_len: int | None) -> torch.Tensor:
        freq, factor = inv_freq(self.params, self.head_dim, self.max_position, seq_len)
        # [n, D/2]: the outer product is one multiply per entry, bit-equal to HF's matmul.
        angles = torch.outer(torch.arange(n, dtype=torch.float32), freq)
        return torch.polar(torch.full_like(angles, factor), angles).to(self.device)

    def get(self, positions: torch.Tensor, seq_len: int) -> torch.Tensor:
        """[T, D/2] complex64 rotations for int64 `positions`; `seq_len`, the longest
        sequence in the step, sizes the table."""
        return self._ready(seq_len)[positions]

    def first(self, n: int, seq_len: int) -> torch.Tensor:
        """`get` of positions 0..n-1: a view of the table, no gather (a sparse decode step
        asks for one per layer)."""
        return self._ready(max(seq_len, n))[:n]

    def _ready(self, seq_len: int) -> torch.Tensor:
        """The table, grown for a step whose longest sequence is `seq_len`."""
        if self._table.shape[0] < seq_len:
            self._table = self._build(max(seq_len, min(self.max_position, 1 << 15), 2 * self._table.shape[0]),
                                      self._base_len)
        return self._table


def interleave_permutation(head_dim: int) -> torch.Tensor:
    """Index that maps HF's half-split layout to interleaved pairs: new dim 2i takes old
    dim i, new dim 2i+1 takes old dim i + D/2."""
    half = head_dim // 2
    # [2, D/2] -> transpose -> [D/2, 2] -> flat [D]: (0, h, 1, h+1, ...)
    return torch.arange(head_dim).view(2, half).t().reshape(-1)
