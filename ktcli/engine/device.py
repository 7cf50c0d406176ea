"""Where the engine runs: the `--device` option and the defaults that follow from it.

    device = resolve_device("auto")          # cuda when torch sees a GPU, else cpu
    weights = resolve_weights("auto", device) # bf16 on CUDA, int8 on CPU
    kv = resolve_kv_dtype("auto", weights, device)

On the CPU the weights default to int8 (`engine.int8_gemv`: decode reads 9 bits a weight,
about 2.5x fp32's decode speed; fp32 where the C++ kernels cannot be built or a model's
widths are not whole 32-value blocks) and the pages to fp16, which halves the bytes every
decode step reads from the cache (our attention kernel widens them with F16C; prefill
widens the keys it reads), except under fp32 weights, whose pages stay fp32 so that
configuration stays exact against transformers. On CUDA the model runs in bf16 (fp16 on request) and the dense
KV pages follow the weights, so attention is one bf16 SDPA call; quantized or sparse
pages go through `kernels`, which dispatch to Triton because the tensors are CUDA.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ktcli.config import PREFILL_DTYPES
from ktcli.errors import UsageError
from ktcli.hardware import native_bf16_matmul  # the engine's wide steps and the embedder both ask

if TYPE_CHECKING:
    import torch

    from ktcli.engine.config import ModelConfig

DEVICES = ("auto", "cpu", "cuda")
GPU_WEIGHTS = ("bf16", "fp16", "fp32")
CPU_WEIGHTS = ("fp32", "bf16", "fp16", "int8")
# What `--weights auto` loads on each device type (the planner reads this too, without
# torch); on a CPU, fp32 instead where int8 cannot run (resolve_weights).
AUTO_WEIGHTS = {"cpu": "int8", "cuda": "bf16"}


def resolve_device(spec: str | torch.device | None = "auto", named: str = "--device") -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cpu'; 'cuda' or 'cuda:N' (an error when
    torch sees no GPU). `named`: where the value came from, as errors name it
    (`Settings.named`: "KTCLI_DEVICE" was said as "--device")."""
    import torch  # here, not at the top: the planner asks device_kind without a model

    if isinstance(spec, torch.device):
        return spec
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise UsageError(f"{_said(named, spec)}: torch sees no CUDA GPU here ("
                             + ("try --device cpu)" if named == "--device" else "set it to cpu)"))
        return torch.device(spec)
    raise UsageError(f"{_said(named, repr(spec))}: choose auto, cpu or cuda")


def _said(named: str, value: str) -> str:
    return f"{named} {value}" if named.startswith("--") else f"{named} = {value}"


def device_kind(spec: str | None, named: str = "--device") -> str:
    """'cpu' or 'cuda' for a --device value, without importing CUDA state when no NVIDIA
    driver is present (the planner runs before any model loads)."""
    spec = (spec or "auto").strip().lower()
    if spec == "cpu":
        return "cpu"
    if spec == "auto" and not os.path.exists("/proc/driver/nvidia/version"):
        return "cpu"
    return resolve_device(spec, named).type


def resolve_weights(weights: str | None, device: torch.device, cfg: ModelConfig | None = None) -> str:
    """'auto' (or empty) -> bf16 on CUDA; on the CPU int8 where our kernels run and `cfg`'s
    widths pack into 32-value blocks, else fp32."""
    if not weights or weights == "auto":
        if device.type == "cuda":
            return AUTO_WEIGHTS["cuda"]
        from ktcli.engine import int8_gemv

        int8_runs = cfg is not None and int8_gemv.available() and int8_gemv.misfit_width(cfg) is None
        return AUTO_WEIGHTS["cpu"] if int8_runs else "fp32"
    allowed = GPU_WEIGHTS if device.type == "cuda" else CPU_WEIGHTS
    if weights not in allowed:
        raise UsageError(f"--weights {weights}: choose one of {', '.join(allowed)} on {device.type}")
    return weights


def resolve_kv_dtype(kv_dtype: str | None, weights: str, device: torch.device) -> str:
    """'auto'/'model' (or empty) -> `auto_kv_dtype`, but fp32 on a CPU where our decode
    attention kernel cannot run (torch's path would attend in fp16); anything else as given."""
    if not kv_dtype or kv_dtype in ("auto", "model"):
        kv = auto_kv_dtype(weights, device.type)
        if device.type == "cpu" and kv != "fp32":
            from ktcli.engine import cpu_attention

            kv = kv if cpu_attention.available() else "fp32"
        return kv
    return kv_dtype


def auto_kv_dtype(weights: str, device_type: str) -> str:
    """The dense pages' dtype under `weights` on a device type ('cpu' or 'cuda'; the
    planner calls this without torch). CUDA: the weights' dtype. CPU: fp32 under fp32
    weights, else fp16. fp16 rather than bf16: on SmolLM2 over a 1,024-token prompt, fp16
    pages move fp32's logits by 0.28% (relative norm) and bf16 pages by 1.9%, for the same
    bytes (our decode kernel widens fp16 with F16C, bf16 with a shift). Keys or values
    beyond fp16's range saturate at +-65,504 when stored (the models we run stay far below)."""
    if device_type == "cuda":
        return weights
    return "fp32" if weights == "fp32" else "fp16"


def resolve_prefill_dtype(weights: str, device_type: str) -> str:
    """The dtype a CPU's wide steps (prefill chunks: GEMMs over more rows than the decode
    kernels take, and prefill attention) compute in: 'bf16' or 'fp32'.

    KTCLI_PREFILL_DTYPE=auto (default) gives bf16 under bf16 or int8 weights on a CPU with
    AMX, else fp32; =bf16 forces it under those weights anywhere (slow without AMX: for
    tests and A/B); =fp32 never uses it. On AMX the GEMMs keep fp32-grade products
    (`engine.amx_gemm`); only attention then computes in bf16. fp32 weights always prefill in fp32, so that
    configuration stays exact against transformers. GPUs compute in the weights' dtype."""
    choice = (os.environ.get("KTCLI_PREFILL_DTYPE") or "auto").strip().lower()
    if choice not in PREFILL_DTYPES:
        raise UsageError(f"KTCLI_PREFILL_DTYPE={choice!r}: choose {', '.join(PREFILL_DTYPES)}")
    if device_type != "cpu" or weights not in ("bf16", "int8") or choice == "fp32":
        return "fp32" if device_type == "cpu" else weights
    return "bf16" if choice == "bf16" or native_bf16_matmul() else "fp32"


def available_bytes(device: torch.device) -> int:
    """Memory a new allocation can take: free GPU memory, or available RAM."""
    if device.type == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """The peak figure that means something on this device: torch's peak CUDA allocation
    on a GPU (the process RSS says little there), peak RSS on the CPU."""
    if device.type == "cuda":
        import torch

        return {"peak_gpu_mb": torch.cuda.max_memory_allocated(device) / 2**20}
    import resource

    return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB
