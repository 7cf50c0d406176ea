"""What this machine's CPU does fast, asked by the engine (its prefill dtype) and by the
embedder (its matmul dtype) alike."""

from __future__ import annotations


def native_bf16_matmul() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX tiles), where oneDNN's
    bf16 GEMM is several times its fp32 one (measured on a 2-core Xeon with AMX: 3.2-3.6x
    on SmolLM2's prefill shapes, and SDPA's CPU flash kernel 2.4-2.6x in bf16). Without AMX
    (AVX2) bf16 GEMMs are no faster than fp32, often slower. AVX512-BF16 alone (AMD Zen 5)
    is a middle case: bf16 GEMMs ran 2x oneDNN's fp32 ones there, but the flash kernel did
    not gain, so a bf16 prefill was only 1.15-1.26x the fp32 one (benchmarks.prefill_dtype,
    int8 weights) for 2.5x the worst logit error and a third fewer greedy tokens kept:
    not worth being the default."""
    import torch

    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private: absent in some torch
    try:
        return bool(probe and probe())
    except Exception:
        return False
