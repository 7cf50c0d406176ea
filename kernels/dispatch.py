"""Which implementation runs each kernel: Triton for CUDA tensors, ``kernels.reference``
otherwise (see the package docstring). The package re-exports everything public here."""

from __future__ import annotations

import importlib.util
import os
import warnings

import torch

from . import reference
from .layout import PagedKVLayer
from .reference import AttentionPolicy
from .store_plan import StorePlan, plan_store

# triton is optional (without it every call takes the reference path) and imported only
# when a kernel first runs: triton chooses between compiling and interpreting
# (TRITON_INTERPRET) when its modules are first imported, so importing it here would
# fix that choice before a test or the bench could make it.
HAS_TRITON = importlib.util.find_spec("triton") is not None

_BACKENDS = ("auto", "reference", "triton")
_backend = os.environ.get("KTCLI_KERNELS", "auto")


def set_backend(name: str) -> None:
    """'auto' (Triton for CUDA tensors), 'reference' (always torch), 'triton' (always)."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}")
    _backend = name


def get_backend() -> str:
    return _backend


def _use_triton(t: torch.Tensor, layer: PagedKVLayer | None = None) -> bool:
    """Triton for CUDA tensors (or always, if forced) when the layer's shapes suit the
    kernels (power-of-two block_size, head_dim, group >= 16); the reference otherwise.
    No layer: a kernel that reads no pages (selection), with no shapes to check."""
    if _backend == "reference" or not HAS_TRITON:
        return False
    if not (_backend == "triton" or t.is_cuda):
        return False
    if layer is None:
        return True
    from ._page_io import triton_supports

    return triton_supports(layer)


def kv_store(layer: PagedKVLayer, k_new: torch.Tensor, v_new: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write K/V rows [N, H, D] to ``slot_mapping`` [N] (block * BS + offset), quantising
    and sealing pages and refreshing the key summaries of every touched block."""
    kv_store_planned(layer, k_new, v_new, plan_store(layer, slot_mapping))


def kv_store_planned(layer: PagedKVLayer, k_new: torch.Tensor, v_new: torch.Tensor, plan: StorePlan) -> None:
    """``kv_store`` with its bookkeeping planned beforehand (``plan_store``, once for all
    the layers of a step): device work only, no value read back to the host."""
    if _use_triton(k_new, layer):
        from .kv_store_triton import kv_store_planned_triton

        return kv_store_planned_triton(layer, k_new, v_new, plan)
    return reference.apply_store(reference.TORCH_OPS, layer, k_new, v_new, plan)


# (kernel, page spec, device) that this GPU cannot load: Triton raised OutOfResources (a
# block needing more shared memory than its SMs give; e.g. decode over fp32 pages at
# head_dim 128 takes 139 KB, which sm_86 / sm_89 GPUs lack: `python -m
# kernels.compile_check --arch 89`). Those calls run on the reference, after one warning.
_UNFIT: set[tuple] = set()


def _fitted(name: str, layer: PagedKVLayer, device: torch.device, triton_call, reference_call):
    key = (name, layer.spec, str(device))
    if key not in _UNFIT:
        from triton.runtime.errors import OutOfResources

        try:
            return triton_call()
        except OutOfResources as e:  # raised as the kernel loads, before it writes anything
            _UNFIT.add(key)
            spec = layer.spec
            warnings.warn(f"{name}: this GPU cannot run the Triton kernel on {spec.kv_dtype} pages of "
                          f"{spec.block_size} tokens at head_dim {spec.head_dim} ({e}); using the torch version",
                          RuntimeWarning, stacklevel=3)
    return reference_call()


def paged_attention_decode(q, layer, block_tables, context_lens, scale, out=None):
    """Dense decode: q [S, HQ, D], one query per sequence -> [S, HQ, D]."""
    def ref():
        return reference.paged_attention_decode(q, layer, block_tables, context_lens, scale, out=out)

    if _use_triton(q, layer):
        from .paged_attention import paged_attention_decode_triton

        return _fitted("paged_attention_decode", layer, q.device,
                       lambda: paged_attention_decode_triton(q, layer, block_tables, context_lens, scale, out=out), ref)
    return ref()


def score_pages(q, layer, block_tables, context_lens, per_kv_head=True, out=None):
    """Quest upper bound per page: q [S, HQ, D] -> [S, H or 1, max_pages] float32."""
    def ref():
        return reference.score_pages(q, layer, block_tables, context_lens, per_kv_head=per_kv_head, out=out)

    if _use_triton(q, layer):
        from .sparse_attention import score_pages_triton

        return _fitted("score_pages", layer, q.device,
                       lambda: score_pages_triton(q, layer, block_tables, context_lens, per_kv_head=per_kv_head, out=out),
                       ref)
    return ref()


def select_pages(scores, context_lens, block_size, policy: AttentionPolicy, max_pages=None, last_page=None):
    """Sinks + local + top-k pages by logical index (see ``reference.select_pages``); a
    decode step's selection (no ``last_page``) on CUDA runs as one Triton kernel."""
    if last_page is None and _use_triton(context_lens):
        from .sparse_attention import select_pages_triton

        return select_pages_triton(scores, context_lens, block_size, policy, max_pages=max_pages)
    return reference.select_pages(scores, context_lens, block_size, policy, max_pages=max_pages, last_page=last_page)


def sparse_attention_decode(q, layer, block_tables, selected, n_selected, context_lens, scale, out=None):
    """Decode over the selected logical pages ``selected`` [S, 1 or H, K] (first
    ``n_selected[s]`` valid) -> [S, HQ, D]."""
    def ref():
        return reference.sparse_attention_decode(q, layer, block_tables, selected, n_selected, context_lens, scale,
                                                 out=out)

    if _use_triton(q, layer):
        from .sparse_attention import sparse_attention_decode_triton

        return _fitted("sparse_attention_decode", layer, q.device,
                       lambda: sparse_attention_decode_triton(q, layer, block_tables, selected, n_selected,
                                                              context_lens, scale, out=out), ref)
    return ref()


def attention_decode(q, layer, block_tables, context_lens, scale, policy: AttentionPolicy | None = None):
    """One decode step under ``policy``: dense, or select pages then sparse attention."""
    policy = policy or AttentionPolicy()
    if policy.kind == "dense":
        return paged_attention_decode(q, layer, block_tables, context_lens, scale)
    scores = None
    if policy.kind == "topk" and policy.top_k_pages > 0:
        scores = score_pages(q, layer, block_tables, context_lens, per_kv_head=policy.per_kv_head)
    selected, n_selected = select_pages(
        scores, context_lens, layer.spec.block_size, policy, max_pages=block_tables.shape[1]
    )
    return sparse_attention_decode(q, layer, block_tables, selected, n_selected, context_lens, scale)


def paged_prefill_attention(q, layer, block_table, start_pos, scale, policy: AttentionPolicy | None = None, out=None):
    """A chunk of one sequence: q [N, HQ, D] at positions start_pos .. start_pos+N-1,
    causal over its stored pages (the chunk's own K/V stored first) -> [N, HQ, D]."""
    def ref():
        return reference.paged_prefill_attention(q, layer, block_table, start_pos, scale, policy=policy, out=out)

    if _use_triton(q, layer):
        from .prefill_attention import paged_prefill_attention_triton

        return _fitted("paged_prefill_attention", layer, q.device,
                       lambda: paged_prefill_attention_triton(q, layer, block_table, start_pos, scale, policy=policy,
                                                              out=out), ref)
    return ref()
