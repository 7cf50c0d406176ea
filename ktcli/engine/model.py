"""The decoder: embedding, N x (attention + gated MLP), final norm, LM head.

One forward runs a *step*: the new tokens of several sequences flattened into [T, hidden]
rows (prefill chunks or one token each in decode). Matmuls run on all rows at once;
attention runs per sequence over its pages. The layer loop is written out flat, with
fused weights; it is the readable path and the oracle. On a CPU a decode step over dense
pages runs the same loop in one C++ call instead (`engine.cpu_decode`, attention by
`engine.cpu_attention`), because ~20 small torch calls per layer cost several
milliseconds per token next to the weight reads.

Weight dtypes: fp32 runs everything in fp32. bf16 keeps the weights in bf16 (half the
bytes to read per token, which is what bounds decode on a CPU) and the residual stream,
norms, RoPE, attention and logits in fp32. On CPUs without native bf16 matmul (AVX2) a
bf16 GEMM with more than a couple of rows is slow, so wide steps (prefill) widen each
weight to fp32 on the fly and run the fp32 GEMM (oneDNN's on AMD CPUs, MKL's on Intel: `engine.cpu_gemm`). int8 (CPU, 9 bits a weight with its
block scales: `engine.int8_gemv`) is the same: our kernel for decode-sized steps, fp32
GEMMs over the unpacked weights for wide ones. On a CPU with AMX (bf16 matrix tiles)
wide steps under bf16 or int8 weights instead run bf16 GEMMs and bf16 prefill attention
(`engine.device.resolve_prefill_dtype`), each several times its fp32 speed there; the
residual stream, norms and RoPE stay fp32. Those GEMMs run on our AMX kernel
(`engine.amx_gemm`): fp32 activations as two bf16 parts and fp32 output, so their products
match fp32 ones over the same (bf16) weights, and greedy tokens stay with an fp32 prefill's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from ktcli.engine import amx_gemm, bf16_gemv, cpu_attention, cpu_decode, cpu_gemm, cpu_mlp, int8_gemv
from ktcli.engine.attention import SeqAttn, attend, make_masks, store_kv
from ktcli.engine.config import ModelConfig
from ktcli.engine.device import resolve_prefill_dtype
from ktcli.engine.kv_cache import PagedKVCache
from ktcli.engine.rope import RotaryTable
from ktcli.engine.weights import ModelWeights


@dataclass
class Step:
    """What one forward needs beyond token ids, built once by the runner."""

    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, where each row's K/V go
    seqs: list[SeqAttn]
    logit_rows: torch.Tensor | None  # rows to compute logits for (None: every row)
    max_len: int  # longest sequence after the step (RoPE tables, dynamic NTK)
    windows: set = field(default_factory=lambda: {None})


@dataclass(frozen=True)
class _ExactRows:
    """A wide step's rows split by the kernel they take (`Model._rows_by_kernel`)."""

    rows: int  # the step's rows
    exact: torch.Tensor  # on the AMX kernel, fp32-grade
    wide: torch.Tensor  # on torch's one-pass bf16 GEMM (may be empty)


class Model:
    # Up to this many rows a bf16 weight is used as is (a few matrix-vector products);
    # beyond, it is widened to fp32 for one GEMM. Measured on AVX2: bf16 cost grows
    # linearly with rows while fp32 GEMM barely grows, and they cross near 2-4 rows.
    BF16_MAX_ROWS = 2

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, kv: PagedKVCache):
        self.cfg, self.w, self.kv = cfg, weights, kv
        self.device = weights.embed.device  # where the weights are, every step's tensors are
        self.rope = RotaryTable(cfg.rope, cfg.head_dim, cfg.max_position, self.device)
        self.wdtype = weights.embed.dtype
        self.scale = cfg.head_dim**-0.5
        self.windows = list(cfg.sliding_windows) or [None] * cfg.n_layers
        self._cpu = self.device.type == "cpu"
        # A GPU runs half-precision GEMMs natively at any row count: no fp32 widening.
        self._gpu = self.device.type == "cuda"
        # bf16 and fp32 weights: our matrix-vector kernel for decode-sized steps (engine.bf16_gemv;
        # for fp32 it streams the weights ~3x faster than MKL's product on AMD CPUs)
        self._gemv = self._cpu and self.wdtype == torch.bfloat16 and bf16_gemv.available()
        self._gemv_f32 = self._cpu and self.wdtype == torch.float32 and bf16_gemv.available()
        self._int8_kernel = self.wdtype == torch.uint8 and int8_gemv.available()
        # Decode steps (one token per sequence) over dense CPU pages: our attention kernel
        # (engine.cpu_attention), all sequences in one call per layer.
        self._decode_kernel = (
            self.device.type == "cpu"
            and getattr(kv, "attend_layer", None) is None
            and cpu_attention.supports(cfg.head_dim, cfg.n_heads, cfg.n_kv_heads, getattr(kv, "dtype", None))
        )
        # ... and the whole layer loop of such a step in one C++ call (engine.cpu_decode),
        # up to the rows its bf16 products take.
        self._fused = None
        if self._decode_kernel and cpu_decode.FusedDecode.supports(weights.layers, weights.norm):
            self._fused = cpu_decode.FusedDecode(weights.layers, self.windows, cfg.n_heads, cfg.n_kv_heads, cfg.rms_eps,
                                                 self.scale, final_norm=weights.norm)
        self._fused_rows = {torch.bfloat16: bf16_gemv.MAX_ROWS, torch.uint8: int8_gemv.MAX_ROWS,
                            torch.float32: bf16_gemv.F32_MAX_ROWS}.get(self.wdtype, 1 << 30)
        # Wide CPU steps under bf16/int8 weights: bf16 GEMMs and attention where AMX makes
        # them fast (engine.device.resolve_prefill_dtype); fp32 otherwise.
        weights_name = {torch.uint8: "int8", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.wdtype, "fp32")
        self.prefill_dtype = resolve_prefill_dtype(weights_name, self.device.type)
        self._wide_bf16 = self._cpu and self.prefill_dtype == "bf16"
        # ... whose GEMMs, up to amx_gemm.EXACT_MAX_ROWS rows, run on our AMX kernel where it
        # is built (engine.amx_gemm): fp32 activations split into two bf16 parts and fp32
        # output, so the products equal fp32 ones to ~2e-6 instead of rounding in and out (~2e-3).
        self._amx = self._wide_bf16 and amx_gemm.available()
        # The rows of a wide step that take the AMX kernel although the step is past its rows
        # (`_rows_by_kernel`): set per forward.
        self._exact_rows: _ExactRows | None = None
        # KTCLI_NO_ROW_SPLIT=1: the kernel by the step's total rows, as before (for A/B:
        # benchmarks.batch_invariance)
        self._row_split = not os.environ.get("KTCLI_NO_ROW_SPLIT")
        # The dtype prefill attention computes in (None: the attention path's own choice).
        self.prefill_attn_dtype = torch.bfloat16 if self._wide_bf16 else None

    # -- matmuls ------------------------------------------------------------------

    def _linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rows: int, bf16_ok: bool = True,
                bf16_out: bool = False) -> torch.Tensor:
        """x @ w.T (+ b) -> fp32. `bf16_ok` False keeps a wide step off the bf16 GEMM;
        `bf16_out` True returns a bf16 GEMM's output as it is (its consumer reads bf16)."""
        wide_bf16 = self._wide_bf16 and bf16_ok
        if wide_bf16 and self._on_amx(w, rows):
            return amx_gemm.linear(x, w, b)  # int8 weights unpack tile by tile inside
        split = self._exact_rows if wide_bf16 and self._exact_rows is not None and rows == self._exact_rows.rows else None
        if split is not None:  # some sequences' rows on the kernel, the others' below
            if not split.wide.numel():
                return amx_gemm.linear(x, w, b)
            y = x.new_empty((rows, w.shape[0]), dtype=torch.float32)
            y[split.exact] = amx_gemm.linear(x.index_select(0, split.exact), w, b)
            y[split.wide] = self._linear(x.index_select(0, split.wide), w, b, len(split.wide), bf16_ok).float()
            return y
        keep_bf16 = wide_bf16 and bf16_out and b is None  # a bf16 GEMM's output, as it is
        if w.dtype == torch.float32:
            if self._f32_gemv(rows):
                y = bf16_gemv.gemv(x.float(), w)
                return y if b is None else y + b
            return self._f32_linear(x.float(), w, b)  # x may be half-precision attention output
        if w.dtype == torch.uint8:
            if self._int8_kernel and rows <= int8_gemv.MAX_ROWS:
                y = int8_gemv.gemv(x.float(), w)
            elif wide_bf16:
                y = F.linear(x.to(torch.bfloat16), int8_gemv.unpack(w, torch.bfloat16))
                y = y if keep_bf16 else y.float()
            else:
                y = cpu_gemm.linear(x.float(), int8_gemv.unpack(w))
            return y if b is None else y + b
        if self._gemv and rows <= bf16_gemv.MAX_ROWS and w.dtype == torch.bfloat16:
            y = bf16_gemv.gemv(x.float(), w)  # fp32 activations and sums: no bf16 rounding of x
        elif rows <= self.BF16_MAX_ROWS or self._gpu or wide_bf16:
            y = F.linear(x.to(w.dtype), w)
            y = y if keep_bf16 else y.float()
        else:
            y = cpu_gemm.linear(x.float(), w.float())  # x may be half-precision attention output
        return y if b is None else y + b

    def _linear_add(self, x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rows: int) -> torch.Tensor:
        """x + a @ w.T (+ b): the residual add fused into the GEMM where the dtype allows."""
        if w.dtype == torch.float32 and b is None and not self._f32_gemv(rows):
            return cpu_gemm.linear_add(x, a.float(), w) if self._cpu else torch.addmm(x, a.float(), w.t())
        if self._on_amx(w, rows):  # (only wide bf16 steps have it)
            return amx_gemm.linear(a, w, b, add=x)
        split = self._exact_rows if self._exact_rows is not None and rows == self._exact_rows.rows else None
        if split is not None:
            if not split.wide.numel():
                return amx_gemm.linear(a, w, b, add=x)
            y = torch.empty_like(x)
            y[split.exact] = amx_gemm.linear(a.index_select(0, split.exact), w, b, add=x.index_select(0, split.exact))
            y[split.wide] = x.index_select(0, split.wide) + self._linear(a.index_select(0, split.wide), w, b,
                                                                          len(split.wide))
            return y
        return x + self._linear(a, w, b, rows)

    def _on_amx(self, w: torch.Tensor, rows: int) -> bool:
        """Whether a wide bf16 step's product of `rows` rows with w runs on the AMX kernel
        (fp32-grade products) rather than torch's one-pass bf16 GEMM (engine.amx_gemm has the
        why): bf16 or int8 weights, past their matrix-vector kernel's rows, up to EXACT_MAX_ROWS."""
        if not self._amx or rows > amx_gemm.EXACT_MAX_ROWS:
            return False
        if w.dtype == torch.uint8:
            return not (self._int8_kernel and rows <= int8_gemv.MAX_ROWS)
        return w.dtype == torch.bfloat16 and not (self._gemv and rows <= bf16_gemv.MAX_ROWS)

    def _rows_by_kernel(self, step: Step, rows: int) -> _ExactRows | None:
        """In a wide step past EXACT_MAX_ROWS rows, the rows of the sequences that have at most
        that many in it: alone, their step would have had fp32-grade products (the AMX kernel,
        or the matrix-vector one for a few rows), so they take the AMX kernel here, and the
        others' rows torch's one-pass bf16 GEMM. (Split so, a step's gate/up output is fp32
        for all its rows, not bf16: twice that temporary.) Decided by the step's
        total, a short prompt's products were rounded to bf16 whenever others shared its step
        (a served request's greedy or seeded answer changed with the other requests' lengths:
        "What is 7 plus 8?" alone and 4 at once parted at the 6th token). None: one kernel
        for every row."""
        if not (self._amx and self._row_split) or rows <= amx_gemm.EXACT_MAX_ROWS or len(step.seqs) < 2:
            return None
        short = [s for s in step.seqs if s.n <= amx_gemm.EXACT_MAX_ROWS]
        if not short:
            return None
        exact = torch.cat([torch.arange(s.start, s.start + s.n) for s in short])
        wide = torch.cat([torch.arange(s.start, s.start + s.n) for s in step.seqs if s.n > amx_gemm.EXACT_MAX_ROWS]
                         or [torch.empty(0, dtype=torch.long)])
        return _ExactRows(rows, exact, wide)

    def _f32_gemv(self, rows: int) -> bool:
        """Whether fp32 weights take our matrix-vector kernel for a step of `rows` rows."""
        return self._gemv_f32 and rows <= bf16_gemv.F32_MAX_ROWS

    def _f32_linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """An fp32 GEMM: engine.cpu_gemm on the CPU (oneDNN, ~2x MKL's on AMD; MKL on Intel), cuBLAS on a GPU."""
        return cpu_gemm.linear(x, w, b) if self._cpu else F.linear(x, w, b)

    # -- forward ------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, step: Step) -> torch.Tensor:
        """ids [T] -> logits [R, vocab] float32 for step.logit_rows (R = T when None)."""
        logits = self._forward(ids, step)
        # Sparse pages chosen by the question (engine.longctx.QuestionPages) are known only
        # once the prompt's last chunk has been through every layer; that chunk runs again
        # with them, so every layer of the question and the answer reads the same pages.
        replay = getattr(self.kv, "replay", None)
        if replay is not None and replay(step):
            logits = self._forward(ids, step)
        return logits

    def _forward(self, ids: torch.Tensor, step: Step) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        T = ids.shape[0]
        H, Hq, Hkv, D = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q_size, qk_size = cfg.q_size, cfg.q_size + cfg.kv_size
        eps = cfg.rms_eps
        lin, lin_add = self._linear, self._linear_add

        x = self._embed(ids)  # [T, H]
        self._exact_rows = self._rows_by_kernel(step, T)
        # [T, D/2] complex -> [T, 1, D/2]: one rotation per position, broadcast over heads
        rot = self.rope.get(step.positions, step.max_len).unsqueeze(1)
        one_seq = len(step.seqs) == 1
        kernel_attend = getattr(self.kv, "attend_layer", None)  # quantized/sparse pages: engine.longctx
        decode = None
        if self._decode_kernel and T == len(step.seqs):  # one new token per sequence
            decode = cpu_attention.DecodeBatch.from_seqs(step.seqs, self.kv.block_size, step.slot_mapping)
        layers = w.layers
        # Prefill: the last layer's attention output and MLP feed only the logit rows.
        host = ids.device.type == "cpu"
        trim = self._last_layer_seqs(step, T) if host and decode is None and kernel_attend is None else None
        last = len(layers) - 1
        if decode is not None and self._fused is not None and T <= self._fused_rows:
            # Every row of a decode step is a logit row: the C++ loop ends with the final norm.
            x = self._fused.forward(x, rot, decode, self.kv.k, self.kv.v)
            return self._logits(x)  # [T, vocab]
        for li, lw in enumerate(layers):
            h = F.rms_norm(x, (H,), lw.in_norm, eps)
            qkv = lin(h, lw.qkv, lw.qkv_bias, T)  # [T, q + 2 kv]
            # [T, q + kv] -> [T, Hq + Hkv, D/2, 2]: q and k heads rotated in one multiply
            qk = qkv[:, :qk_size].view(T, Hq + Hkv, D // 2, 2)
            if cfg.qk_norm:
                qk = self._qk_norm(qk, lw, T)
            qk = torch.view_as_real(torch.view_as_complex(qk) * rot).view(T, Hq + Hkv, D)
            q, k = qk[:, :Hq], qk[:, Hq:]  # [T, Hq, D], [T, Hkv, D]
            v = qkv[:, qk_size:].view(T, Hkv, D)
            kc, vc = self.kv.k[li], self.kv.v[li]
            if decode is None and kernel_attend is None:
                store_kv(kc, vc, k, v, step.slot_mapping)
            window = self.windows[li]
            if li == last and trim is not None:  # every row's K/V is stored; go on with R rows
                q, x = q.index_select(0, step.logit_rows), x.index_select(0, step.logit_rows)
                T, one_seq, step = x.shape[0], len(trim) == 1, replace(step, seqs=trim, logit_rows=None)
                self._exact_rows = self._rows_by_kernel(step, T)
            if decode is not None:  # stores this step's K/V rows itself
                o = decode.attend(q, k, v, kc, vc, window, self.scale).view(T, q_size)
            elif kernel_attend is not None:
                o = kernel_attend(li, q, k, v, step).reshape(T, q_size)
            elif one_seq:
                o = attend(q, kc, vc, step.seqs[0], window, self.scale, self.prefill_attn_dtype).reshape(T, q_size)
            else:
                o = torch.cat(
                    [attend(q[s.start : s.start + s.n], kc, vc, s, window, self.scale, self.prefill_attn_dtype)
                     for s in step.seqs]
                ).reshape(T, q_size)  # [T, Hq, D] -> [T, q]
            x = lin_add(x, o, lw.o, lw.o_bias, T)
            h = F.rms_norm(x, (H,), lw.post_norm, eps)
            gu = lin(h, lw.gate_up, lw.gate_up_bias, T, bf16_out=True)  # [T, 2 * inter]
            a = self._silu_mul(gu)  # [T, inter]
            x = lin_add(x, a, lw.down, lw.down_bias, T)

        if step.logit_rows is not None:
            x = x.index_select(0, step.logit_rows)  # [R, H]
        x = F.rms_norm(x, (H,), w.norm, eps)
        return self._logits(x)  # [R, vocab]

    def _silu_mul(self, gu: torch.Tensor) -> torch.Tensor:
        """SwiGLU's silu(gate) * up: on the CPU one C++ pass (engine.cpu_mlp), bf16 out of a
        bf16 wide step's product (the down GEMM reads it as it is), else fp32."""
        if self._cpu:
            return cpu_mlp.silu_mul(gu, torch.bfloat16 if gu.dtype == torch.bfloat16 else torch.float32)
        return cpu_mlp.silu_mul_reference(gu)  # torch ops: the same on any device

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """[R, H] -> [R, vocab] fp32. Never through a bf16 wide GEMM: its output would be
        rounded to bf16 (a step of 1/16 at a logit of 10), which moves greedy ties and every
        log-probability; the head runs on the logit rows only, so fp32 costs little."""
        return self._linear(x, self.w.lm_head, None, x.shape[0], bf16_ok=False)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.wdtype == torch.uint8:  # packed rows: gather, then unpack only those
            return int8_gemv.unpack(self.w.embed.index_select(0, ids))
        return F.embedding(ids, self.w.embed).float()

    def _last_layer_seqs(self, step: Step, T: int) -> list[SeqAttn] | None:
        """One-query SeqAttn records at the logit rows when they are the last row of each
        sequence (prefill): the last layer then attends and runs its MLP for those rows
        only. None when every row is wanted."""
        if step.logit_rows is None or T == len(step.seqs):
            return None
        if step.logit_rows.tolist() != [s.start + s.n - 1 for s in step.seqs]:
            return None
        return [
            SeqAttn(i, 1, s.ctx, s.first_slot, s.slots, make_masks(1, s.ctx, step.windows))
            for i, s in enumerate(step.seqs)
        ]

    def _qk_norm(self, qk: torch.Tensor, lw, T: int) -> torch.Tensor:
        cfg = self.cfg
        D = cfg.head_dim
        # [T, Hq + Hkv, D/2, 2] -> [T, Hq + Hkv, D] (a copy: qk is a strided slice)
        flat = qk.reshape(T, cfg.n_heads + cfg.n_kv_heads, D)
        q = F.rms_norm(flat[:, : cfg.n_heads], (D,), lw.q_norm, cfg.rms_eps)
        k = F.rms_norm(flat[:, cfg.n_heads :], (D,), lw.k_norm, cfg.rms_eps)
        return torch.cat([q, k], dim=1).view(T, cfg.n_heads + cfg.n_kv_heads, D // 2, 2)
