"""Long context in the engine: the KV cache and attention on `kernels`' paged format.

The model's own cache (`kv_cache.PagedKVCache`) holds float pages and attends with SDPA.
For quantized pages (fp8, int8, int4), sparse policies (window, topk) or RoPE scaling the
engine swaps it for `KernelKVCache`: one `kernels.PagedKVLayer` per layer, K/V written
with `kernels.kv_store` (quantise, seal, page summaries) and read with
`kernels.attention_decode` / `kernels.paged_prefill_attention` (Triton on CUDA, the torch
reference on CPU; on the CPU, int8/int4 decode steps read their pages through
`engine.cpu_kivi_attention` and stage their rows with `store_mid_page`). The model calls
`attend_layer(li, q, k, v, step)` per layer instead of its SDPA path; the runner and block
manager are unchanged (a sequence's block table is read back from the step's `SeqAttn`).

Positions past the trained window (`position_remap`): keys are stored *unrotated*, so
page summaries and Quest scores compare content, not position. At attention time the keys
a query sees (sink pages, selected pages, its local pages, in document order) get compact
virtual positions 0..m-1, as if they were one short contiguous text, and the query the
position after the keys before it (`virtual_plan`): local keys keep their true distances,
and every distance stays below (sinks + top-k + local) pages, inside the trained range
whatever the length. (An earlier version put every far key at one fixed distance,
InfLLM-style; SmolLM2 then answered from the sink page.) Decode is the one-query case.

Keys may also be stored unrotated without remapping (`unroped_keys`; RoPE is then applied
at their true positions when they are read), as KVQuant proposes for low-bit keys: a
channel's magnitude is steady before RoPE, while after it each channel pair turns with
the position and a page's per-channel range spans the pair's whole circle. Measured on
SmolLM2 with int4 pages (BENCHMARKS.md) it cuts the perplexity cost at 8K tokens by 40% but
loses more needles (8 of 15 cells against 10 of 15, needle log-probability at 4K down
3.0 nats against 0.9), so it is not the default.

Which pages `topk` reads: each group of queries picks its own top-k by Quest's bound, and
the prompt's question adds pages of its own (`QuestionPages`): once the prompt's last
chunk has gone through every layer, the pages its last queries attend to most are known,
that chunk runs again with them (`replay`), and every decode step reads them too.

Quantized pages under a remapped policy keep their sink pages exact as well
(`engine.exact_sinks`): every query reads them, so their quantisation error would be in
every output. On SmolLM2 with int4 pages and topk at 8K tokens this halves what int4 adds
to the policy's perplexity cost (BENCHMARKS.md). There a step also reads its own rows as
it computed them, not back from the pages it just wrote (`KernelKVCache._exact_rows`): a
prefill chunk's quantisation error then reaches only later chunks, as in an unchunked
prefill. That is in the torch attention over remapped pages, the same on every device;
dense attention reads what the kernels read (their paged prefill would need a separate
pass over the chunk's own rows, merged by log-sum-exp, to do the same).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

import kernels
from kernels import AttentionPolicy
from kernels.reference import context_keys, context_kv
from ktcli.engine import cpu_attention, cpu_kivi_attention, key_calibration, prefill_attention
from ktcli.engine.exact_sinks import ExactRows, ExactSinks, overlay_keys
from ktcli.engine.page_groups import attend_columns, decode_remapped, group_page_plans, virtual_plan
from ktcli.engine.prefix_store import PrefixStore, prompt_cache_description, store_key, whole_chunks
from ktcli.engine.attention import decode_grouped
from ktcli.config import DEFAULT_LOCAL_PAGES, DEFAULT_TOPK_PAGES, canonical_rope_scaling, parse_attention
from ktcli.config import parse_rope_scaling as parse_rope_spec
from ktcli.engine.config import SLIDING_WINDOW_REFUSAL, ModelConfig
from ktcli.errors import InputError, OutOfMemoryError, UsageError
KV_DTYPES = kernels.KV_KINDS


@dataclass(frozen=True)
class LongContextOptions:
    kv_dtype: str = "fp32"
    policy: AttentionPolicy = AttentionPolicy()
    dense_layers: int = 0  # the first N layers attend densely whatever the policy
    position_remap: bool = False  # InfLLM-style distances (window / topk)
    block_size: int = kernels.KVCacheSpec(1, 2).block_size
    # topk with remapped positions: pages the prompt's last queries (the question) attend
    # to most, shared by every layer and head of the answer's steps (`QuestionPages`).
    question_pages: int = 8
    # Staging slots: one per sequence holding a partial page (serve batches up to 16-32).
    n_stage: int = 32
    stage_dtype: str = "fp32"  # the full-precision recent window of quantized kinds
    # Keys stored before RoPE (see the module doc); remapped positions always store them so.
    unroped_keys: bool = False
    # Quantized pages under remapped window/topk: the sink pages also kept at the staging
    # precision, one slot per sequence (`engine.exact_sinks`).
    exact_sinks: bool = True

    @property
    def keys_unroped(self) -> bool:
        return self.position_remap or self.unroped_keys

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_DTYPES:
            raise InputError(f"kv dtype {self.kv_dtype!r}: choose one of {', '.join(KV_DTYPES)}")
        if self.position_remap and self.policy.kind == "dense":
            raise InputError("position remapping needs a window or topk attention policy")


def make_policy(kind: str | AttentionPolicy, *, n_sink_pages: int = 1, n_local_pages: int = DEFAULT_LOCAL_PAGES,
                top_k_pages: int = DEFAULT_TOPK_PAGES) -> AttentionPolicy:
    # 8 Quest pages per step plus 8 question pages (LongContextOptions): with sinks and the
    # local window a query sees 21 pages, 1.3K tokens. On SmolLM2 a bigger budget hurt:
    # at 16K, 32 Quest + 16 question pages missed the needle where 8 + 8 found it at
    # every depth (more unrelated text for a 135M model to be distracted by), and each
    # page costs prefill time. Larger models take more (Quest / InfLLM use 2-4K tokens).
    if isinstance(kind, AttentionPolicy):
        return kind
    try:
        kind, pages = parse_attention(kind)  # "topk:16" = 16 pages per step; "window:8" = 8 local pages
    except ValueError as e:
        raise InputError(str(e)) from None
    if pages is not None:
        if kind == "topk":
            top_k_pages = pages
        else:
            n_local_pages = pages
    return AttentionPolicy(kind, n_sink_pages=n_sink_pages, n_local_pages=n_local_pages, top_k_pages=top_k_pages)


def float_pages_decode(q: torch.Tensor, layer, table: torch.Tensor, ctx: int, scale: float) -> torch.Tensor:
    """q [1, HQ, D] (one decode token, RoPE applied) over a sequence's first `ctx` tokens in
    `layer`'s fp32/fp16/bf16 pages (a kernels.PagedKVLayer; its rows are stored) -> [1, HQ,
    D] fp32, by the dense cache's decode kernel: the pages [NB, BS, H, D] are its [slots, H,
    D] rows, `table` its block table. The same attention as `decode_grouped` over
    `context_kv`, without the widened copy of the context."""
    spec = layer.spec
    shape = (-1, spec.n_kv_heads, spec.head_dim)
    first_key = torch.zeros(1, dtype=torch.int64)  # every key attended to
    batch = cpu_attention.DecodeBatch(table.to(torch.int32).reshape(1, -1).contiguous(), spec.block_size,
                                      torch.tensor([ctx], dtype=torch.int64), {None: first_key}, first_key)
    return batch.attend(q.reshape(1, q.shape[-2], q.shape[-1]).float().contiguous(), None, None,
                        layer.k_pages.view(shape), layer.v_pages.view(shape), None, scale)


def wants_kernels(kv_dtype: str, attention, rope_scaling) -> bool:
    """Whether a load needs the kernels cache (anything the SDPA path cannot do)."""
    kind = attention.kind if isinstance(attention, AttentionPolicy) else attention
    return kv_dtype in kernels.QUANT_KINDS or kind != "dense" or bool(rope_scaling)


# -- RoPE scaling ---------------------------------------------------------------------


def parse_rope_scaling(spec: str | dict | None, cfg: ModelConfig) -> dict:
    """'yarn:4', 'dynamic:2', 'linear:2', 'llama3:8' (or a dict of HF rope parameters) ->
    rope parameters overriding the model's. Factors stretch the trained window."""
    if not spec:
        return {}
    if isinstance(spec, dict):
        return dict(spec)
    try:
        parsed = parse_rope_spec(spec)
    except ValueError as e:
        raise InputError(str(e)) from None
    if parsed is None:
        return {"rope_type": "default"}
    kind, f = parsed
    params = {"rope_type": kind, "factor": f, "original_max_position_embeddings": cfg.max_position}
    if kind == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=4.0)
    return params


# -- the cache --------------------------------------------------------------------------



class KernelKVCache:
    """Drop-in for `PagedKVCache` (same sizing interface) over `kernels` pages, plus the
    attention of one layer. `rope` and `blocks` are attached by the loader."""

    written_at_allocation = True  # `kernels.allocate` fills every page (zeros, empty bounds)

    def __init__(self, cfg: ModelConfig, options: LongContextOptions, device: torch.device | str = "cpu"):
        if any(w is not None for w in cfg.sliding_windows):
            raise UsageError(SLIDING_WINDOW_REFUSAL)
        self.cfg, self.options = cfg, options
        self.device = torch.device(device)  # CUDA pages make `kernels` dispatch to Triton
        self.n_layers, self.n_kv_heads, self.head_dim = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim
        self.block_size = options.block_size
        self.spec = kernels.KVCacheSpec(cfg.n_kv_heads, cfg.head_dim, options.block_size, options.kv_dtype,
                                        stage_dtype=options.stage_dtype)
        self.policy = options.policy
        self.scale = cfg.head_dim**-0.5
        self.num_blocks = 0
        self.layers: list[kernels.PagedKVLayer] = []
        self.k: list[None] = [None] * cfg.n_layers  # the SDPA path's per-layer views: none here
        self.v: list[None] = [None] * cfg.n_layers
        self.rope = None  # RotaryTable, for position remapping
        # What dense prefill attention over the dequantised context computes in: the
        # model's choice (bf16 on a CPU with AMX under bf16/int8 weights; None: fp32).
        self.prefill_attn_dtype: torch.dtype | None = None
        self.blocks = None  # BlockManager, to reclaim staging slots of freed sequences
        self._step = None
        self._inverse: torch.Tensor | None = None  # the step's inverse rotations (`_unrotate`)
        self._tables: list[torch.Tensor] = []
        self._table_keys: dict[int, int] = {}  # id(table) -> its first page, per step (`_key`)
        self._lens: list[torch.Tensor] = []
        self._question: dict[int, QuestionPages] = {}  # first physical block -> the question's pages
        self._observing: list[bool] = []  # per sequence of the step: its prompt ends here
        self._asks = options.position_remap and self.policy.kind == "topk" and options.question_pages > 0
        self._replaying = False
        self._replay_of: list[bool] = []
        self._store_rows: torch.Tensor | None = None  # rows a replayed step stores again
        self._store_plan: kernels.StorePlan | None = None  # the step's, for every layer (`_store`)
        self.dtype = torch.float32
        # Decode rows of quantized pages on the CPU: `store_mid_page` where it applies
        self._fast_store = self.device.type == "cpu" and self.spec.quantized
        # Dense decode over int8/int4 pages on the CPU: our kernel (engine.cpu_kivi_attention)
        self._kivi_decode = self.device.type == "cpu" and cpu_kivi_attention.supports(self.spec, cfg.n_heads)
        # ... and over fp32/fp16/bf16 pages: the paged decode kernel reads them in place
        # (engine.cpu_attention). Each step gathered and widened the whole context first:
        # a 12K-token read under --rope-scaling (dense, fp16 pages) decoded at 1.4 tok/s.
        page_dtype = kernels.layout.TORCH_DTYPES.get(self.spec.kv_dtype)
        self._paged_decode = (self.device.type == "cpu" and page_dtype is not None
                              and cpu_attention.supports(self.spec.head_dim, cfg.n_heads, self.spec.n_kv_heads, page_dtype))
        # [L, H, D] while `key_calibration.measure` runs: each layer's queries' q^2 added up
        self.calibration: torch.Tensor | None = None
        self.sinks: ExactSinks | None = None  # made by `allocate` where it applies

    # sizing (the PagedKVCache interface) -------------------------------------------

    @property
    def bytes_per_block(self) -> int:
        return self.n_layers * kernels.bytes_per_block(self.spec)

    @property
    def _sink_shape(self) -> tuple[int, ...] | None:
        """ExactSinks' sizes where they apply (quantized pages read by a remapped policy
        with sink pages), else None."""
        o = self.options
        if not (o.exact_sinks and o.position_remap and self.spec.quantized and self.policy.n_sink_pages > 0):
            return None
        return (self.n_layers, self.policy.n_sink_pages * self.block_size, self.n_kv_heads, self.head_dim,
                o.n_stage)

    @property
    def fixed_bytes(self) -> int:
        n_stage = self.options.n_stage
        sink_pages = self.policy.n_sink_pages if self._sink_shape else 0
        return self.n_layers * (kernels.staging_bytes(self.spec, n_stage)
                                + kernels.exact_page_bytes(self.spec, n_stage, sink_pages))

    def blocks_for_budget(self, budget_bytes: int) -> int:
        return max(0, budget_bytes - self.fixed_bytes) // self.bytes_per_block

    def allocate(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise OutOfMemoryError(
                f"KV memory budget is below one page ({self.bytes_per_block} bytes for {self.block_size} tokens)"
            )
        try:
            self.layers = [kernels.allocate(self.spec, num_blocks, self.device, self.options.n_stage)
                           for _ in range(self.n_layers)]
        except RuntimeError as e:
            raise OutOfMemoryError(f"cannot allocate a KV cache of {num_blocks} pages: {e}") from None
        sinks = self._sink_shape
        self.sinks = ExactSinks(*sinks, kernels.layout.stage_dtype(self.spec), self.device) if sinks else None
        self.num_blocks = num_blocks

    @property
    def allocated_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block + self.fixed_bytes

    @contextmanager
    def dense_attention(self):
        """Attend densely at true positions (keys stored after RoPE) inside the block,
        whatever the load's policy: `key_calibration.measure` runs there, so a model's key
        weights do not depend on which policy happened to load it first."""
        saved = self.options, self.policy, self._asks
        self.options = replace(self.options, policy=kernels.reference.DENSE, dense_layers=0, position_remap=False,
                               unroped_keys=False)
        self.policy, self._asks = self.options.policy, False
        try:
            yield
        finally:
            self.options, self.policy, self._asks = saved

    @property
    def min_last_chunk(self) -> int:
        """The fewest tokens a prompt's last prefill chunk may have (`Engine._chunk_len`):
        QuestionPages observes the prompt's last WINDOW queries in it."""
        return QuestionPages.WINDOW if self._asks else 0

    def layer_policy(self, li: int) -> AttentionPolicy:
        return kernels.reference.DENSE if li < self.options.dense_layers else self.policy

    # prompt pages kept on disk (engine.prefix_store) ----------------------------------
    # Here a token's rows depend on the chunks the prompt was prefilled in (the pages a
    # chunk's queries pick, its own rows read exact, the rest quantized), so what serves a
    # later prompt is the whole chunks before the prompt's last one, as a fresh prefill of
    # that prompt would cut them (`Sequence.aligned`): whole pages, sealed, kept as they
    # are with their scales and summaries, and the sequence's exact sink rows.

    _PAGE_ARRAYS = ("k_pages", "v_pages", "k_min", "k_max", "k_scale", "v_scale", "v_zero", "k_bits")
    prefix_fixed = frozenset({"sink_k", "sink_v"})

    @property
    def prefix_unit(self) -> int:
        return self.block_size

    def reusable_prefix(self, shared: int, prompt_len: int, prefill_chunk: int, min_last_chunk: int = 0) -> int:
        """Of `shared` leading tokens held, how many a prompt of `prompt_len` reads: whole
        chunks that its own prefill would not end in, nor cut short before its last."""
        if prefill_chunk % self.block_size:
            return 0
        return whole_chunks(shared, prompt_len, prefill_chunk, min_last_chunk)

    def keepable_prefix(self, prompt_len: int, aligned: int) -> int:
        return aligned - aligned % self.block_size  # whole pages (a chunk that is not a page multiple)

    def prefix_arrays(self, li: int, block_table: list[int], n: int) -> dict[str, torch.Tensor] | None:
        """Layer li's pages of a sequence's first n tokens (whole pages); None where its sink
        rows could not be kept exact (no slot), which a read back could not restore."""
        layer = self.layers[li]
        blocks = torch.tensor(block_table[: n // self.block_size], dtype=torch.long, device=self.device)
        out = {name: t.index_select(0, blocks) for name in self._PAGE_ARRAYS
               if (t := getattr(layer, name)) is not None}
        if self.sinks is not None:
            rows = self.sinks.rows(block_table[0], li)
            if rows is None or n < self.sinks.n_tokens:
                return None
            out["sink_k"], out["sink_v"] = rows[1], rows[2]
        return out

    def write_prefix(self, li: int, block_table: list[int], n: int, arrays: dict[str, torch.Tensor]) -> None:
        """Pages read back from an entry into a sequence's first n // block_size blocks;
        ValueError for arrays of another kind or shape."""
        layer = self.layers[li]
        blocks = torch.tensor(block_table[: n // self.block_size], dtype=torch.long, device=self.device)
        if li == 0:  # whole pages, sealed: staging slots the blocks kept from earlier owners are stale
            for each in self.layers:  # in every layer at once, so a damaged entry leaves them all alike
                kernels.release_blocks(each, blocks)
        for name in self._PAGE_ARRAYS:
            t, got = getattr(layer, name), arrays.get(name)
            if t is None:
                continue
            if got is None or got.dtype != t.dtype or got.shape != (len(blocks), *t.shape[1:]):
                raise ValueError(f"{name} of another shape")
            t.index_copy_(0, blocks, got.to(self.device))
        if self.sinks is not None:
            k, v = arrays.get("sink_k"), arrays.get("sink_v")
            if k is None or v is None or k.shape[0] != self.sinks.n_tokens or v.shape != k.shape:
                raise ValueError("sink rows of another shape")
            is_free = self.blocks.is_free if self.blocks is not None else None
            self.sinks.store(block_table[0], li, 0, k.to(self.device), v.to(self.device), is_free)

    # attention -----------------------------------------------------------------------

    def attend_layer(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step) -> torch.Tensor:
        """Store the step's K/V [T, H, D] in layer li and attend q [T, HQ, D] (RoPE applied)
        -> [T, HQ, D] float32."""
        if step is not self._step:
            self._begin_step(step)
        layer = self.layers[li]
        remap = self.options.position_remap
        unroped = self.options.keys_unroped
        q_roped = q
        if self.calibration is not None:
            self.calibration[li] += key_calibration.query_square_sums(q, self.n_kv_heads)
        if unroped:
            q, k = self._unrotate(q, step), self._unrotate(k, step)
        if self.sinks is not None:
            self._store_sinks(li, k, v, step)
        if self._store_rows is None:
            decode_rows = self._fast_store and q.shape[0] == len(step.seqs) and kernels.get_backend() != "triton"
            if not (decode_rows and store_mid_page(layer, k, v, step.slot_mapping)):
                self._store(layer, k, v, step.slot_mapping)
        elif self._store_rows.numel():
            rows = self._store_rows
            self._store(layer, k[rows], v[rows], step.slot_mapping[rows])
        policy = self.layer_policy(li)
        flat_cpu = policy.kind == "dense" and q.device.type == "cpu" and kernels.get_backend() != "triton"
        outs = []
        for seq, table, lens, observe in zip(step.seqs, self._tables, self._lens, self._observing):
            qs = q[seq.start : seq.start + seq.n]
            start = seq.ctx - seq.n
            if remap or (unroped and not flat_cpu):
                # Torch attention over gathered pages: at remapped positions, or at true ones
                # for keys stored unroped (the kernels read keys as stored: RoPE them here).
                exact = self._exact_rows(li, table, start, k[seq.start : seq.start + seq.n],
                                         v[seq.start : seq.start + seq.n])
                extra = None
                if remap and policy.kind == "topk" and self.options.question_pages > 0:
                    extra = self._question_pages(li, qs, layer, table, seq.ctx, observe, exact)
                outs.append(self._remapped(qs, layer, table, start, policy, step.max_len, extra,
                                           true_positions=not remap, exact=exact))
            elif flat_cpu and seq.n == 1 and self._kivi_decode and not unroped:
                # int8/int4 pages read as they are, no dequantised copy (engine.cpu_kivi_attention)
                outs.append(cpu_kivi_attention.decode(qs, layer, table, seq.ctx, self.scale))
            elif flat_cpu and seq.n == 1 and self._paged_decode and not unroped:
                outs.append(float_pages_decode(qs, layer, table, seq.ctx, self.scale))
            elif flat_cpu:
                # The reference walks page tiles with masks and an online softmax; one
                # dequantisation of the context per call, then the flash kernels (prefill)
                # or two batched products (decode), is several times faster.
                k_all, v_all = context_kv(layer, table, seq.ctx)  # as the kernels read it: no `exact`
                if unroped:  # RoPE at true positions, as the model rotated q
                    k_all = self._rope_context(k_all, step.max_len)
                    qs = q_roped[seq.start : seq.start + seq.n]
                if seq.n == 1:
                    outs.append(decode_grouped(qs.float(), k_all, v_all, self.scale))
                else:
                    # bf16 out under a bf16 prefill: the o-projection takes it as is, and
                    # torch.cat below promotes a step's mixed dtypes
                    outs.append(prefill_attention.attend_prefix(qs, k_all, v_all, self.scale, self.prefill_attn_dtype))
            elif seq.n == 1:
                outs.append(kernels.attention_decode(qs, layer, table[None], lens, self.scale, policy))
            else:
                outs.append(kernels.paged_prefill_attention(qs, layer, table, start, self.scale, policy))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _store(self, layer, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """`kernels.kv_store` with its bookkeeping planned once per step, at the first layer
        that stores, and applied to every layer: the plan reads values back from the
        device, and on a GPU each such read waits for the queue to drain."""
        if self._store_plan is None:
            self._store_plan = kernels.plan_store(layer, slot_mapping)
        kernels.kv_store_planned(layer, k.contiguous(), v.contiguous(), self._store_plan)

    def _exact_rows(self, li: int, table: torch.Tensor, start: int, k: torch.Tensor, v: torch.Tensor) -> list[ExactRows]:
        """Rows of a sequence that attention reads at full precision instead of from its
        quantized pages: its exact sink rows (`ExactSinks`), and the step's own rows k, v
        [N, H, D] at positions start.. . A prefill chunk thus attends to itself as it
        computed itself, as an unchunked prefill would, and only what earlier steps left
        reads quantized. Only the torch attention over gathered pages takes these (see the
        module doc): the kernels' dense path reads the pages as stored. (At 16K tokens,
        topk int4 lost a needle that fp32 finds because the question's chunk read its own
        tokens back in int4; with them exact it found it.)"""
        if not self.spec.quantized:
            return []
        sink = self.sinks.rows(self._key(table), li) if self.sinks is not None else None
        return ([sink] if sink is not None else []) + [(start, k, v)]

    def _store_sinks(self, li: int, k: torch.Tensor, v: torch.Tensor, step) -> None:
        """Copy the step's rows at sink positions into the sequences' ExactSinks slots
        (a replay: those of the replayed sequences only, as `kv_store`)."""
        is_free = self.blocks.is_free if self.blocks is not None else None
        for i, (seq, table) in enumerate(zip(step.seqs, self._tables)):
            start = seq.ctx - seq.n
            if start >= self.sinks.n_tokens or (self._store_rows is not None and not self._replay_of[i]):
                continue
            rows = slice(seq.start, seq.start + seq.n)
            self.sinks.store(self._key(table), li, start, k[rows], v[rows], is_free)

    def _begin_step(self, step) -> None:
        self._step = step
        self._store_plan = None
        self._inverse = None  # the step's inverse rotations (`_unrotate`), made by its first layer
        self._tables = [s.block_table(self.block_size, self.device) for s in step.seqs]
        # [1] int32 context length per sequence, from the step's positions where they live
        # (a sequence's last query sits at ctx - 1): no host-to-device copy per layer.
        self._lens = [(step.positions[s.start + s.n - 1 : s.start + s.n] + 1).to(torch.int32) for s in step.seqs]
        replaying, self._replaying = self._replaying, False
        self._store_rows = self._replay_rows(step) if replaying else None
        self._observing = []
        # Each sequence's key (its first page), read once a step: read per layer, each read
        # waited for a GPU's queue to drain (~90 times a decode step for SmolLM2).
        self._table_keys = {id(table): int(table[0]) for table in self._tables}
        for seq, table in zip(step.seqs, self._tables):
            key = self._key(table)
            if not seq.samples:  # a prompt chunk before the last: any old entry is stale
                self._question.pop(key, None)
            fresh = seq.n > 1 or key not in self._question
            self._observing.append(self._asks and not replaying and seq.samples and fresh)
        if len(self._question) > 4 * max(1, len(step.seqs)) and self.blocks is not None:
            self._question = {k: v for k, v in self._question.items() if not self.blocks.is_free(k)}
        if self.spec.quantized:
            self._reclaim_staging(len(step.seqs))

    def _key(self, table: torch.Tensor) -> int:
        """The sequence key of one of the step's block tables (`_begin_step`)."""
        key = self._table_keys.get(id(table))
        return int(table[0]) if key is None else key

    def replay(self, step) -> bool:
        """After a forward: whether it must run again because a prompt ended in it and its
        question chose pages (`QuestionPages`). The replay reads those pages in every layer
        and stores the K/V it computes over the first pass's."""
        if step is not self._step or not any(self._observing):
            return False
        self._replay_of = list(self._observing)
        self._step, self._replaying = None, True
        return True

    def _replay_rows(self, step) -> torch.Tensor:
        """Rows of a replayed step to store again: the replayed sequences' only. Quantized
        pages take whole pages: rows before the chunk's first page boundary keep the first
        pass's values (rewriting part of a sealed page would re-seal it from a partly
        stale staging slot)."""
        rows = []
        for seq, again in zip(step.seqs, self._replay_of):
            if not again:
                continue
            skip = (-(seq.ctx - seq.n)) % self.block_size if self.spec.quantized else 0
            rows.append(torch.arange(seq.start + min(skip, seq.n), seq.start + seq.n))
        idx = torch.cat(rows) if rows else torch.empty(0, dtype=torch.long)
        return idx.to(step.slot_mapping.device)

    def _reclaim_staging(self, need: int) -> None:
        """Give back the staging slots of blocks the block manager has freed (a finished
        sequence's partial page), once the pool runs low."""
        first = self.layers[0]
        if self.blocks is None or int((first.block_of_stage < 0).sum()) > need:
            return
        owners = first.block_of_stage[first.block_of_stage >= 0].tolist()
        stale = torch.tensor([b for b in owners if self.blocks.is_free(b)], dtype=torch.long)
        if stale.numel():
            for layer in self.layers:
                kernels.release_blocks(layer, stale)

    def _unrotate(self, x: torch.Tensor, step) -> torch.Tensor:
        """Undo the model's RoPE on x [T, heads, D] (interleaved pairs)."""
        if self._inverse is None:  # the same for q and k of every layer of the step
            rot = self.rope.get(step.positions, step.max_len).unsqueeze(1)  # [T, 1, D/2]
            self._inverse = rot.conj() / (rot.abs() ** 2)
        t, h, d = x.shape
        xc = torch.view_as_complex(x.float().reshape(t, h, d // 2, 2).contiguous())
        return torch.view_as_real(xc * self._inverse).reshape(t, h, d)

    def _rope_context(self, k: torch.Tensor, max_len: int) -> torch.Tensor:
        """RoPE on a sequence's keys k [ctx, H, D] at positions 0..ctx-1 (one rotation per
        position, broadcast over the heads)."""
        ctx, h, d = k.shape
        rot = self.rope.get(torch.arange(ctx, device=k.device), max_len).unsqueeze(1)  # [ctx, 1, D/2]
        return torch.view_as_real(torch.view_as_complex(k.view(ctx, h, d // 2, 2)) * rot).view(ctx, h, d)

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor, max_len: int) -> torch.Tensor:
        """RoPE at ``positions`` on x [..., T, D] with positions [..., T] (clamped >= 0)."""
        shape = x.shape
        rot = self.rope.get(positions.clamp(min=0).reshape(-1), max_len).view(*positions.shape, shape[-1] // 2)
        xc = torch.view_as_complex(x.reshape(*shape[:-1], shape[-1] // 2, 2).contiguous())
        return torch.view_as_real(xc * rot).reshape(shape)

    def _question_pages(self, li: int, q, layer, table, ctx: int, observe: bool,
                        exact: Sequence[ExactRows] = ()) -> torch.Tensor | None:
        """Pages a sequence's question selects for layer li (see `QuestionPages`): updated
        while the prompt's last chunk goes up the layers, then fixed for the decode steps."""
        key = self._key(table)
        if observe:
            if li == 0 or key not in self._question:
                self._question[key] = QuestionPages(self.options.question_pages, self.policy)
            self._question[key].observe(q, layer, table, ctx, self.scale, exact)
        pages = self._question.get(key)
        return pages.chosen if pages is not None else None

    def _remapped(self, q, layer, table, start: int, policy: AttentionPolicy, max_len: int,
                  extra: torch.Tensor | None = None, true_positions: bool = False,
                  exact: Sequence[ExactRows] = ()) -> torch.Tensor:
        """Attention of unrotated queries q [N, HQ, D] at positions start.. over unrotated
        pages at compact virtual positions (see `virtual_plan`), or at their true positions
        (keys stored unroped, read by a policy without remapping).

        Queries go in groups of one page (the whole chunk for a dense layer); each group
        selects its own pages with its own queries (Quest bound at distance 0: keys are
        stored unrotated), so the prompt's last page, the question, picks what the answer
        reads. Keys and queries are rotated at their virtual positions and
        `engine.page_groups` does the rest: the groups' plans in one pass, then per group
        a gather and two products (a decode step: one C++ pass)."""
        spec = layer.spec
        n_q, hq, d = q.shape
        h, bs = spec.n_kv_heads, spec.block_size
        group = hq // h
        qt = q.float().transpose(0, 1).reshape(h, group, n_q, d)  # [H, G, N, D]
        end = start + n_q
        step = n_q if policy.kind == "dense" else bs
        first = start if policy.kind == "dense" else start // bs * bs
        out = torch.empty(n_q, h, group, d, device=q.device)
        plans = group_page_plans(q, layer, table, start, policy, extra) if policy.kind != "dense" else None
        for i, g0 in enumerate(range(first, end, step)):
            a, b = max(start, g0) - start, min(end, g0 + step) - start
            pages = plans[i] if plans is not None else None
            # Positions stay below the key count (virtual) or the step's length (true): both
            # known here, so no value is read back to size the rotation table.
            columns = (pages.shape[-1] if pages is not None else -(-(start + b) // bs)) * bs
            rope_len = max(max_len if policy.kind == "dense" or true_positions else 0, columns)
            # Virtual positions: key column c sits at position c, rotated as it is gathered.
            turn = None if true_positions else self.rope.first(columns, rope_len)
            if turn is not None and b - a == 1:  # a decode step: one C++ pass where it runs
                fused = decode_remapped(q[a:b], layer, table, start + a, policy, extra, exact, pages, turn, self.scale)
                if fused is not None:
                    out[a:b] = fused.view(1, h, group, d)
                    continue
            k, v, kpos, qpos, lead = virtual_plan(q[a:b], layer, table, start + a, policy, extra, true_positions,
                                                  exact, pages, turn)
            kr = self._rotate(k, kpos, rope_len) if true_positions else k
            qq = self._rotate(qt[:, :, a:b], qpos[:, None, :].expand(h, group, b - a), rope_len)
            o = attend_columns(qq.reshape(h, group * (b - a), d), kr, v, lead, b - a, self.scale)
            out[a:b] = o.view(h, group, b - a, d).permute(2, 0, 1, 3)
        return out.reshape(n_q, hq, d)


def store_mid_page(layer, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> bool:
    """`kernels.kv_store` for rows [N, H, D] that each land strictly inside a page already
    being staged (neither its first row, which takes a staging slot, nor its last, which
    seals the page), one row per page: the row goes into the staging slot and the page
    summary widens to include it. The reference recomputes the summary over every staged
    row and runs ~30 small torch ops for it (~0.5 ms a layer, more than the attention of a
    decode step); here it is four. Returns False, having written nothing, when any row is
    not such a row: the caller then runs `kernels.kv_store`."""
    done = cpu_kivi_attention.stage_mid_page_rows(layer, k, v, slot_mapping)  # the same in one C++ call
    if done is not None:
        return done
    bs = layer.spec.block_size
    blocks, offsets = slot_mapping // bs, slot_mapping % bs
    stage = layer.stage_of_block[blocks]
    if not bool(((offsets > 0) & (offsets < bs - 1) & (stage >= 0)).all()):
        return False
    if blocks.numel() > 1 and blocks.unique().numel() != blocks.numel():  # (one row: one page)
        return False
    slots = stage.long()
    layer.stage_k[slots, offsets] = k.to(layer.stage_k.dtype)
    layer.stage_v[slots, offsets] = v.to(layer.stage_v.dtype)
    stored = layer.stage_k[slots, offsets].float()  # as staged: what the reference's summary reads
    layer.k_min[blocks] = torch.minimum(layer.k_min[blocks], stored)
    layer.k_max[blocks] = torch.maximum(layer.k_max[blocks], stored)
    return True


class QuestionPages:
    """The pages a prompt's question reads, found once at the end of the prompt.

    Quest's per-page bound is loose for a small model: at 16K tokens the needle's page
    ranked about 100th of 245 by it, for every aggregation tried. The question's exact
    attention is sharp in a few retrieval heads (SmolLM2: layer 17 head 1, layer 18
    head 2): the needle's page gets the most attention mass of all pages there, while
    most heads spread theirs. So, at the prompt's last chunk, the last `WINDOW` queries
    attend (unrotated, at distance 0: keys are stored unrotated) over every page of each
    layer; each head's mass per page is z-scored over the candidate pages (neither sink
    nor local), and a page scores the largest z any head gave it so far. As the chunk goes
    up the layers each layer selects with the score so far (the retrieval layers and every
    layer above them see the needle), and the decode steps all use the final one (the
    needle page ranked first at 4K and 16K). SnapKV selects from the same observation
    window; here the result adds pages to Quest's per-step top-k instead of evicting.
    The cost is one pass over each layer's keys for `WINDOW` queries, once per prompt."""

    WINDOW = 32

    def __init__(self, n_pages: int, policy: AttentionPolicy):
        self.n_pages, self.policy = n_pages, policy
        self.score: torch.Tensor | None = None  # [pages of the prompt] best z so far
        self.chosen: torch.Tensor | None = None  # [<= n_pages] logical pages

    def observe(self, q: torch.Tensor, layer, table: torch.Tensor, ctx: int, scale: float,
                exact: Sequence[ExactRows] = ()) -> None:
        """Fold in layer attention of the prompt's last queries q [N, HQ, D] (unrotated);
        `exact`: rows read at full precision instead of the pages (`_exact_rows`)."""
        spec = layer.spec
        bs, h, d = spec.block_size, spec.n_kv_heads, spec.head_dim
        n_pages = -(-ctx // bs)
        lo, hi = self.policy.n_sink_pages, n_pages - self.policy.n_local_pages  # candidates [lo, hi)
        if hi <= lo:
            return
        obs = q[-self.WINDOW :].float()
        group = obs.shape[1] // h
        qg = obs.view(-1, h, group, d).permute(1, 0, 2, 3).reshape(h, -1, d)  # [H, N*G, D]
        mass = self._page_mass(qg, layer, table, ctx, scale, exact)  # [H, P]
        cand = mass[:, lo:hi]
        z = (mass - cand.mean(1, keepdim=True)) / (cand.std(1, keepdim=True, unbiased=False) + 1e-9)
        best = z.amax(0)
        self.score = best if self.score is None else torch.maximum(self.score, best)
        k_sel = min(self.n_pages, hi - lo)
        self.chosen = (self.score[lo:hi].topk(k_sel).indices + lo).to(torch.int32)

    # Pages of keys dequantised at a time: a whole context's fp32 keys, values and scores at
    # once added 205 MB to the peak RSS at 16K tokens (an RSS trace), growing with the context.
    BLOCK_PAGES = 32

    def _page_mass(self, qg: torch.Tensor, layer, table: torch.Tensor, ctx: int, scale: float,
                   exact: Sequence[ExactRows]) -> torch.Tensor:
        """Each query's softmax over the context's keys, summed per page and averaged over
        the queries: [H, P]. A block of pages at a time (one online softmax: a block's page
        sums are taken against its own max, rescaled to the overall one at the end)."""
        bs = layer.spec.block_size
        h, n_rows = qg.shape[:2]
        n_pages = -(-ctx // bs)
        sums = torch.empty(h, n_rows, n_pages, device=qg.device)
        block_max: list[torch.Tensor] = []
        total = torch.zeros(h, n_rows, device=qg.device)
        top = torch.full((h, n_rows), -math.inf, device=qg.device)
        for p0 in range(0, n_pages, self.BLOCK_PAGES):
            p1 = min(n_pages, p0 + self.BLOCK_PAGES)
            k = overlay_keys(exact, context_keys(layer, table, ctx, p0, p1), p0 * bs)  # [rows, H, D]
            s = torch.bmm(qg, k.permute(1, 2, 0)).mul_(scale)  # [H, N*G, rows]
            m = s.amax(-1, keepdim=True)
            e = torch.nn.functional.pad(s.sub_(m).exp_(), (0, (p1 - p0) * bs - k.shape[0]))  # the last page's tail: 0
            sums[..., p0:p1] = e.view(h, n_rows, p1 - p0, bs).sum(-1)
            new_top = torch.maximum(top, m[..., 0])
            total = total * (top - new_top).exp() + sums[..., p0:p1].sum(-1) * (m[..., 0] - new_top).exp()
            top = new_top
            block_max.append(m)
        for i, m in enumerate(block_max):
            p0 = i * self.BLOCK_PAGES
            sums[..., p0 : p0 + self.BLOCK_PAGES] *= (m - top[..., None]).exp()
        return (sums / total[..., None]).mean(1)


# -- loading ------------------------------------------------------------------------------


def _kv_budget(kv: KernelKVCache, window: int, exact: bool, n_windows: int, ram_share: float, available: int) -> int:
    """Bytes of pages for `n_windows` windows of `window` tokens. These pages are written
    when allocated (empty page summaries, zeroed codes), so every byte is resident from the
    start: a window the caller asked for (`exact`, a one-shot request sized to its input)
    gets exactly that, or a one-line error now rather than a full cache hours into a
    prefill; a default window is capped at 32K tokens and a share of free memory."""
    tokens = window if exact else min(window, 32768)
    want = int(n_windows * tokens * kv.bytes_per_block / kv.block_size) + kv.fixed_bytes + n_windows * kv.bytes_per_block
    if not exact:
        return int(min(want, ram_share * available))
    if want > available:
        raise OutOfMemoryError(f"a {tokens:,}-token window needs {want / 2**30:.2f} GiB of {kv.spec.kv_dtype} KV pages, "
                               f"{available / 2**30:.2f} GiB is free (try --kv-dtype int4 or --mode retrieval)")
    return want


def _staging_slots(n_windows: int, prefill_chunk: int, block_size: int) -> int:
    """Staging slots per layer. Every page a step writes passes through a slot until it
    seals, and the slots are written when allocated (fp32, ~3 MB a layer for SmolLM2's 32):
    a server batching many sequences keeps the default; one request needs a chunk's pages
    and its partial one (fewer would split each chunk's write into pieces)."""
    if n_windows > 1:
        return LongContextOptions.n_stage
    return -(-prefill_chunk // block_size) + 2


def check_attention_span(model_dir: Path, attention: str, rope_scaling=None, prefill_chunk: int = 512) -> None:
    """What `ktcli ask` and `ktcli serve` check before loading a model for a remapped
    policy (`_check_read_span`); engine tests run tiny models past it on purpose."""
    from ktcli.engine.config import load_config

    policy = make_policy(attention)
    if policy.kind == "dense":
        return
    cfg = load_config(Path(model_dir))
    rope = parse_rope_scaling(rope_scaling, cfg)
    window = cfg.window if not rope else replace(cfg, rope={**cfg.rope, **rope}).window
    _check_read_span(policy, LongContextOptions(policy=policy), window, prefill_chunk)


def _check_read_span(policy: AttentionPolicy, options: LongContextOptions, window: int, prefill_chunk: int) -> None:
    """The tokens a step reads (sink, local, top-k and question pages, and a prefill chunk
    of its own) are remapped into consecutive positions: past the model's window they leave
    the trained range, and answers are noise (`topk:100000` read a 16K-token input whole
    and answered "need"; `window:1000` is 64K tokens a step)."""
    chunk_pages = -(-prefill_chunk // options.block_size)
    fixed = policy.n_sink_pages + chunk_pages + (options.question_pages if policy.kind == "topk" else 0)
    own = policy.top_k_pages + policy.n_local_pages if policy.kind == "topk" else policy.n_local_pages
    most = window // options.block_size - fixed - (policy.n_local_pages if policy.kind == "topk" else 0)
    if fixed + own > window // options.block_size:
        pages = policy.top_k_pages if policy.kind == "topk" else policy.n_local_pages
        raise UsageError(f"--attention {policy.kind}:{pages} reads {(fixed + own) * options.block_size:,} tokens a step, "
                         f"past the model's {window:,}-token window, where its answers are noise: at most "
                         f"{policy.kind}:{max(1, most)}")


def load_backend(cls, model_dir: Path, *, weights: str, block_size: int | None, kv_budget_bytes: int | None,
                 prefill_chunk: int, kv_dtype: str, attention, dense_layers: int, position_remap: bool | None,
                 rope_scaling, context_window: int | None, budget_ram_share: float, kv_windows: int,
                 unroped_keys: bool = False, exact_sinks: bool = True, device: torch.device | str = "cpu",
                 pack_cache: Path | None = None, prefix_cache: Path | None = None, stage_dtype: str | None = None):
    """NativeBackend over a `KernelKVCache` (called by `NativeBackend.load`). `stage_dtype`
    overrides the device's staging precision (below): kernels.bench's end-to-end exactness
    rows stage at fp32 on a GPU, so its dots are fp32 like the CPU reference's."""
    from ktcli.engine.block_manager import BlockManager
    from ktcli.engine.config import load_config
    from ktcli.engine.device import available_bytes
    from ktcli.engine.model import Model
    from ktcli.engine.runner import Engine
    from ktcli.engine.tokenizer import load_chat_tokenizer
    from ktcli.engine.pack_cache import load_engine_weights

    model_dir = Path(model_dir)
    cfg = load_config(model_dir)
    rope = parse_rope_scaling(rope_scaling, cfg)
    if rope:
        cfg = replace(cfg, rope={**cfg.rope, **rope})
    policy = make_policy(attention)
    remap = policy.kind != "dense" if position_remap is None else bool(position_remap)
    block_size = block_size or LongContextOptions.block_size
    device = torch.device(device)
    # Staged rows at fp16 on a GPU: the kernels then dot quantized pages on tensor cores (fp32
    # staging makes them exact fp32 FMA dots), the variant kernels.bench times and
    # compile_check compiles. The CPU's fused C++ attention reads fp32 staging.
    options = LongContextOptions(kv_dtype=kv_dtype, policy=policy, dense_layers=max(0, dense_layers),
                                 position_remap=remap, block_size=block_size, n_stage=_staging_slots(kv_windows, prefill_chunk, block_size),
                                 stage_dtype=stage_dtype or ("fp16" if device.type == "cuda" else "fp32"),
                                 unroped_keys=bool(unroped_keys), exact_sinks=bool(exact_sinks))
    kv = KernelKVCache(cfg, options, device)
    # Remapped positions never leave the trained range: the window is what memory holds.
    window = context_window or (1 << 20 if remap else cfg.window)
    if kv_budget_bytes is None:
        kv_budget_bytes = _kv_budget(kv, window, bool(context_window), max(1, kv_windows), budget_ram_share,
                                     available_bytes(device))
    kv.allocate(kv.blocks_for_budget(kv_budget_bytes))
    # A request longer than the pool can never run, whatever else waits: a server said
    # `max_model_len` 1,048,576 over a 131K-token pool and took such a prompt in, which
    # then failed every request batched beside it ("KV cache full").
    window = min(window, kv.num_blocks * kv.block_size)
    w = load_engine_weights(model_dir, cfg, weights, device, pack_cache)
    model = Model(cfg, w, kv)
    kv.rope = model.rope
    kv.prefill_attn_dtype = model.prefill_attn_dtype
    blocks = BlockManager(kv.num_blocks, kv.block_size)
    kv.blocks = blocks
    engine = Engine(model, blocks, prefill_chunk=prefill_chunk)
    # Every running sequence keeps its partial page in a staging slot, and a prefill step
    # needs a chunk's pages more: past that, a batch failed whole ("KV staging pool
    # exhausted", 40 requests through serve with int8 pages).
    engine.max_batch = max(1, min(engine.max_batch, options.n_stage - (-(-prefill_chunk // block_size)) - 1))
    engine.context_window = window
    tokenizer = load_chat_tokenizer(model_dir) if (model_dir / "tokenizer.json").is_file() else None
    backend = cls(cfg, engine, tokenizer, kv, weights, w.nbytes())
    backend.model_dir = model_dir
    backend.context_window = window
    backend.long_context = options
    if options.kv_dtype == "int4":  # where the queries look, so int4 keys spend their bits there
        key_calibration.calibrate(backend, model_dir, pack_cache)
    if prefix_cache is not None:
        engine.prefix = _prompt_store(prefix_cache, model_dir, kv, model, weights, prefill_chunk, rope_scaling)
    return backend


def policy_spec(policy: AttentionPolicy) -> str:
    """The policy as `config.canonical_attention` spells it ('topk:8', 'window:4', 'dense')."""
    if policy.kind == "dense":
        return "dense"
    return f"{policy.kind}:{policy.top_k_pages if policy.kind == 'topk' else policy.n_local_pages}"


def _prompt_store(root: Path, model_dir: Path, kv: KernelKVCache, model, weights: str, prefill_chunk: int,
                  rope_scaling):
    """The prompt store for pages made this way: every option that shapes the rows (the
    policy, page size, chunk, key widths' weights, RoPE scaling in cfg) is in its key, so
    pages computed any other way are never read. Not the staging slots' count (a server's
    and the CLI's differ), which only changes how writes are split."""
    import hashlib

    from ktcli.engine.model_store import model_key

    weights_of_keys = hashlib.sha1()
    for layer in kv.layers:
        if layer.k_weight is not None:
            weights_of_keys.update(layer.k_weight.float().cpu().numpy().tobytes())
    key = store_key(model_key(model_dir, "prefix"), weights, replace(kv.options, n_stage=0), model.prefill_dtype,
                    kv.prefill_attn_dtype, kv.device.type, model.cfg, prefill_chunk, weights_of_keys.hexdigest())
    rope = canonical_rope_scaling(rope_scaling) if isinstance(rope_scaling, str) else str(rope_scaling or "")
    return PrefixStore(root, key, described=prompt_cache_description(
        model_dir, weights, kv.options.kv_dtype, kv.device.type, policy_spec(kv.options.policy), prefill_chunk,
        kv.min_last_chunk, rope))
