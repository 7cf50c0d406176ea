"""fp32 GEMMs of wide CPU steps (prefill chunks) through oneDNN instead of MKL.

torch's `F.linear` on fp32 CPU tensors calls MKL's sgemm. oneDNN, which torch also ships
(`torch.ops.mkldnn._linear_pointwise`, the op its own compiler emits for CPU linears), runs
the same fp32 product 2.0-2.4x faster on the 2-core Zen 5 EPYC: 306-396 against 135-174
GFLOPS on SmolLM2's shapes from 64 to 4,096 rows (MKL takes a generic path on AMD CPUs).
Both accumulate in fp32; the results differ only in summation order (~4e-6 relative).

On Intel CPUs MKL has its own fast paths and the gain is gone: on the 2-core Xeon with
AMX (model 207) oneDNN ran the same shapes at 0.83-1.08x MKL, and the blocked prefill
attention built on it (`engine.prefill_attention`) at 0.72-0.75x torch's flash kernel
(`python -m benchmarks.cpu_gemm`, results/cpu_gemm_xeon.json). So the engine uses oneDNN
only on other vendors' CPUs (`available()`); KTCLI_ONEDNN=1 uses it on any CPU where the
op works, KTCLI_NO_ONEDNN=1 nowhere (A/B, or a torch whose oneDNN misbehaves).

The op is private, so `usable()` probes it once against `F.linear` and callers fall
back to `F.linear` where it is absent, fails or disagrees.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

_state: list[bool] = []  # [usable] once probed
_choice: list[bool] = []  # [available] once decided: it is asked on every wide product


def available() -> bool:
    """Whether the engine runs its fp32 GEMMs (and the blocked prefill attention) on oneDNN
    (decided once per process)."""
    if not _choice:
        if os.environ.get("KTCLI_NO_ONEDNN"):
            _choice.append(False)
        else:
            _choice.append(usable() and (bool(os.environ.get("KTCLI_ONEDNN")) or cpu_vendor() != "GenuineIntel"))
    return _choice[0]


def usable() -> bool:
    """Whether torch's oneDNN linear op is here and agrees with F.linear (probed once)."""
    if not _state:
        _state.append(_probe())
    return _state[0]


@functools.lru_cache(maxsize=1)
def cpu_vendor() -> str:
    """The CPU's vendor id ("GenuineIntel", "AuthenticAMD", ...; "" where unknown)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _probe() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if op is None:
        return False
    try:
        g = torch.Generator().manual_seed(0)
        x, w, r = torch.randn(40, 48, generator=g), torch.randn(24, 48, generator=g), torch.randn(40, 24, generator=g)
        b = torch.randn(24, generator=g)
        want = F.linear(x, w, b)
        ok = torch.allclose(op(x, w, b, "none", [], ""), want, rtol=1e-5, atol=1e-5)
        ok = ok and torch.allclose(op.binary(x, r, w, None, "add"), r + F.linear(x, w), rtol=1e-5, atol=1e-5)
        return bool(ok)
    except Exception:  # a torch built without it, or an op whose signature moved
        return False


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] @ w[N, K].T (+ b), fp32 on the CPU: oneDNN where usable, else F.linear."""
    if available() and x.dim() == 2:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    return F.linear(x, w, b)


def linear_add(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x + a @ w.T (a new tensor), the residual add fused into the product."""
    if available() and a.dim() == 2:
        return torch.ops.mkldnn._linear_pointwise.binary(a, x, w, None, "add")
    return torch.addmm(x, a, w.t())
