"""Scheduler and step loop: turns sequences into model steps and sampled tokens.

Every step processes, for each scheduled sequence, the tokens whose K/V are not cached
yet: a chunk of the prompt (prefill) or the one token sampled last (decode). Prefill
steps go first, packing chunks of several prompts up to `prefill_chunk` tokens, so no
step ever builds more than a [chunk, context] score matrix; once every running sequence
has its prompt cached, decode steps advance all of them together.

Memory: a sequence is admitted with pages for its whole prompt; decode adds a page when
the last one fills. When a page is missing, the most recently admitted other sequence
is preempted (its pages freed, recomputed later); a sequence that cannot fit alone
raises OutOfMemoryError. Nothing is ever overwritten.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ktcli.engine.attention import SeqAttn, block_slots, make_masks
from ktcli.engine.backend import SamplingParams
from ktcli.engine.block_manager import BlockManager
from ktcli.engine.host_alloc import release_idle_heap
from ktcli.engine.model import Model, Step
from ktcli.engine.prefix_store import MIN_REUSE, PrefixStore, whole_chunks
from ktcli.engine.sampler import make_generator, sample
from ktcli.engine.sequence import Sequence, Status
from ktcli.threads import ThreadGovernor


@dataclass
class RunStats:
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # includes recomputation after preemption
    new_tokens: int = 0
    decode_tokens: int = 0  # tokens produced by decode steps (the first comes from prefill)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    ttft_s: float = 0.0
    peak_pages: int = 0
    preemptions: int = 0
    steps: int = 0
    reused_tokens: int = 0  # prompt tokens whose K/V came from the prefix store, not a prefill
    reuse_s: float = 0.0  # reading them in (counted in prefill_s too)
    kept_tokens: int = 0  # prompt tokens written to the prefix store
    shared_tokens: int = 0  # prompt tokens whose K/V were copied from another sequence of the run
    keep_error: str | None = None  # why a prompt asked to be kept was not (the disk's refusal)
    extra: dict = field(default_factory=dict)


# Prompt tokens per prefill step when none is given. Attention work does not depend on
# it (engine.prefill_attention); longer chunks make taller GEMMs and fewer steps. At 2048
# the step's largest activation ([chunk, 2 * intermediate] fp32) is 25 MB for SmolLM2.
DEFAULT_PREFILL_CHUNK = 2048
# A prefill chunk taken between two decode steps of other sequences: a bound on how long
# their streams pause for it (~0.2 s on a 2-core CPU for SmolLM2). At 512 a short request
# that arrived during a 6K-token prompt took 3.6 s for its 9 tokens, at 256 2.1 s, and the
# long prompt's own time was the same (1.14-1.15x alone; benchmarks/serve_join.py).
MIXED_PREFILL_CHUNK = 256
STARVED_STEPS = 2
# Sequences admitted past a waiting one whose pages do not fit yet, before it holds the rest
# back: short requests go on while long ones wait for pages, and a stream of them cannot
# keep a long one waiting for ever.
HEAD_PASSES = 8


class Engine:
    def __init__(self, model: Model, blocks: BlockManager, prefill_chunk: int = DEFAULT_PREFILL_CHUNK, max_batch: int = 64):
        self.model, self.blocks = model, blocks
        self.block_size = blocks.block_size
        self.prefill_chunk = max(1, prefill_chunk)
        self.max_batch = max_batch
        self.context_window = model.cfg.window
        self.windows = set(model.windows) | {None}
        self.device = getattr(model, "device", torch.device("cpu"))
        self.stats = RunStats()
        self._aborted: set[int] = set()
        self._keep_prompts = False
        self._next_id = 0
        self._current: list[Sequence] = []
        self.threads: ThreadGovernor | None = None  # CPU threads per step (engine.threads); None: as set
        # Prompt K/V on disk (engine.prefix_store), for the dense paged cache only; None: off.
        self.prefix: PrefixStore | None = None
        # Prompts a `generate(keep_later=True)` asked to keep, written when `keep_deferred` is
        # called, not when their sequence ends: a CLI prints its sources first (a 400 MB
        # entry took 0.8 s). Their pages stay taken until then; the next run writes them first.
        self._keep_later = False
        self._to_keep: list[tuple[list[int], list[int]]] = []  # (prompt ids, block table)
        # Fewest leading prompt tokens worth copying from a sibling sequence (or waiting for
        # it to compute); 0 turns sharing off.
        self.min_share = MIN_REUSE

    # -- public -------------------------------------------------------------------

    def keep_deferred(self) -> str | None:
        """Write the prompts whose keeping was deferred (`generate(keep_later=True)`) and
        give their pages back; counted in the last run's `stats.kept_tokens`. A failed
        write loses only the entry: why is returned (and in `stats.keep_error`)."""
        refused = None
        while self._to_keep:
            ids, table = self._to_keep.pop()
            try:
                refused = self._keep(ids, table) or refused
            finally:
                self.blocks.free(table)
        return refused

    def abort(self, index: int) -> None:
        """Stop the sequence of prompt `index` in the running `generate` call (a stop
        string matched, say); its pages are freed before the next step."""
        self._aborted.add(self._current[index].seq_id)

    def reused(self, index: int) -> int:
        """Prompt tokens of prompt `index` in the running `generate` whose K/V were read
        back from the prefix store, not prefilled (a server's usage says them)."""
        return self._current[index].reused

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, eos_ids: set[int] | frozenset = frozenset(),
        joining: Callable[[], list[tuple[list[int], SamplingParams]]] | None = None,
        on_eos: Callable[[int], None] | None = None, keep_later: bool = False,
        own_params: list[SamplingParams] | None = None,
        on_prefill: Callable[[int, int], None] | None = None,
    ) -> Iterator[tuple[int, int]]:
        """Yield (prompt index, token id) as tokens are produced, until every sequence
        finishes (EOS, max tokens, context window or abort). EOS is not yielded.

        `joining`, asked before every step, gives more (prompt, its sampling params) to
        run: a server's requests that arrive mid-run join it at the next step (continuous
        batching), numbered on after the prompts before them. `own_params`: each prompt's
        sampling params (max new tokens, temperature, top-k, top-p, seed), where they
        differ; `params` then holds what the run shares (keep_prompt). A batch's rows
        are sampled each with its own (`sampler.sample`). `on_prefill(done, total)`: the
        prompt tokens read so far, after each prefill step of prompts longer than one
        (a 30K-token prompt read for a minute with no sign of life).
        `on_eos(index)` is told the step a sequence ends with EOS (not yielded), so a
        server answers it then, not when the whole batch ends. `keep_later`: prompts kept
        (params.keep_prompt) are written by `keep_deferred`, not as their sequence ends.

        With sequences both in prefill and in decode, steps alternate between a prefill
        chunk (of at most MIXED_PREFILL_CHUNK tokens) and a decode step: a long prompt
        that joined froze every running stream for its whole prefill (29 s)."""
        refused = self.keep_deferred()  # an earlier prompt's write, made just now: still said
        self.stats = RunStats(keep_error=refused)
        seqs: list[Sequence] = []
        index: dict[int, int] = {}
        waiting: deque[Sequence] = deque()

        def add(prompt: list[int], own: SamplingParams | None) -> None:
            if not prompt:
                raise ValueError("empty prompt")
            max_new = (own or params).max_new_tokens
            s = Sequence(self._next_id, list(prompt), len(prompt), max_new, params=own,
                         generator=make_generator(own or params, self.device))
            self._next_id += 1
            index[s.seq_id] = len(seqs)
            seqs.append(s)
            self.stats.prompt_tokens += len(prompt)
            if max_new > 0:
                waiting.append(s)

        for k, p in enumerate(prompts):
            add(p, own_params[k] if own_params is not None else None)
        self._current = seqs
        self._keep_prompts = params.keep_prompt
        self._keep_later = keep_later
        running: list[Sequence] = []
        last_was_prefill = False
        prefill_told = False  # its start said (`_report_prefill`)
        start = time.perf_counter()
        try:
            while True:
                for prompt, own in joining() if joining is not None else ():
                    add(prompt, own)
                if not (waiting or running):
                    break
                self._drop_aborted(running, waiting)
                self._admit(waiting, running)
                if not running:
                    break
                held = self._share_prefixes(running)
                # Shortest prompt first: a 5-token request that joined during another's
                # 5K-token prompt got no budget until that prompt was read (43 s). One left
                # out for STARVED_STEPS steps goes first, so a stream of short requests
                # cannot hold a long prompt back for ever.
                prefill = sorted((s for s in running if s.in_prefill and s not in held),
                                 key=lambda s: (s.waited < STARVED_STEPS, s.pending))
                decoding = any(not s.in_prefill for s in running)
                if prefill and not (decoding and last_was_prefill):
                    if self.threads is not None:
                        self.threads.for_prefill()
                    if on_prefill is not None and not prefill_told:
                        # Said as it starts (with a prefix read back, from there): told only
                        # after each step, a 6K-token part's first sign of life came a chunk
                        # in, and a log's first line (one each 30 s of a phase) at its end.
                        prefill_told = True
                        self._report_prefill(seqs, on_prefill)
                    t0 = time.perf_counter()
                    budget = self._step_budget(prefill, decoding)
                    produced = self._step(self._take_chunks(prefill, budget), params)
                    self.stats.prefill_s += time.perf_counter() - t0
                    if on_prefill is not None:
                        self._report_prefill(seqs, on_prefill)
                    if produced and not self.stats.ttft_s:
                        self.stats.ttft_s = time.perf_counter() - start
                    last_was_prefill = True
                else:
                    last_was_prefill = False
                    self._ensure_decode_pages(running, waiting)
                    batch = [(s, 1) for s in running[: self.max_batch] if not s.in_prefill]
                    if not batch:  # its decoders were preempted for pages: prefill again
                        continue
                    if self.threads is not None:
                        self.threads.for_decode()
                    t0 = time.perf_counter()
                    produced = self._step(batch, params)
                    elapsed = time.perf_counter() - t0
                    self.stats.decode_s += elapsed
                    self.stats.decode_tokens += len(produced)
                    if self.threads is not None:
                        self.threads.decode_done(elapsed, len(batch))
                self.stats.peak_pages = max(self.stats.peak_pages, self.blocks.num_used)
                for s, tok in produced:
                    self._finish_if_done(s, tok, eos_ids)
                    if s.finish_reason != "stop":
                        self.stats.new_tokens += 1
                        yield index[s.seq_id], tok
                    elif on_eos is not None:
                        on_eos(index[s.seq_id])
                    if s.status is Status.FINISHED:
                        running.remove(s)
                        self._release(s)
        finally:
            # A consumer that stops early (or an error) must not leak pages.
            for s in seqs:
                if s.block_table:
                    self._release(s)
            self._aborted.clear()
            if self.device.type == "cpu":
                release_idle_heap()  # the run's temporaries, not kept for the next one (engine.host_alloc)

    @torch.inference_mode()
    def prompt_logits(self, ids: list[int], all_rows: bool = True) -> torch.Tensor:
        """Logits [n, vocab] at every position of one prompt, computed with the same
        chunked, paged prefill as generation (for tests and the benchmark); on the CPU
        whatever the engine's device. all_rows=False: the last position of each chunk
        only (a prefill run for its side effects, without the vocabulary products)."""
        self.keep_deferred()
        s = Sequence(self._next_id, list(ids), len(ids), 0)
        self._next_id += 1
        try:
            self.blocks.grow(s.block_table, len(ids))
            return torch.cat(self._prefill_alone(s, all_rows)).cpu()
        finally:
            self.blocks.free(s.block_table)

    @torch.inference_mode()
    def answer_logits(self, prompt: list[int], answer: list[int]) -> torch.Tensor:
        """Logits [len(answer), vocab] predicting each token of `answer` after `prompt`, as
        generation computes them: the prompt prefilled in the chunks `generate` cuts (its
        last chunk replayed where a policy asks), then the answer fed one decode step per
        token (teacher forcing). Unlike `prompt_logits` over prompt + answer, a sparse
        policy chooses its pages from the prompt alone, as it does while answering."""
        if not prompt or not answer:
            raise ValueError("empty prompt or answer")
        self.keep_deferred()
        s = Sequence(self._next_id, list(prompt), len(prompt), len(answer))
        self._next_id += 1
        try:
            self.blocks.grow(s.block_table, len(prompt) + len(answer))
            out = self._prefill_alone(s, all_rows=False)[-1:]  # the prompt's last row
            for tok in answer[:-1]:
                s.token_ids.append(tok)
                step, ids = self._build_step([(s, 1)])
                out.append(self.model.forward(ids, step))
                s.num_cached += 1
            return torch.cat(out).float().cpu()
        finally:
            self.blocks.free(s.block_table)

    def _prefill_alone(self, s: Sequence, all_rows: bool) -> list[torch.Tensor]:
        """Prefill s's pending tokens, alone, in the chunks generation cuts: the logits of
        each chunk (every row, or its last)."""
        out = []
        while s.pending:
            n = self._chunk_len(s, self.prefill_chunk)
            step, ids = self._build_step([(s, n)], all_rows=all_rows)
            out.append(self.model.forward(ids, step))
            s.num_cached += n
        return out

    # -- scheduling ---------------------------------------------------------------

    def _report_prefill(self, seqs: list[Sequence], on_prefill: Callable[[int, int], None]) -> None:
        total = sum(s.prompt_len for s in seqs)
        if total > self.prefill_chunk:  # a prompt read in one step needs no progress
            on_prefill(sum(min(s.num_cached, s.prompt_len) for s in seqs), total)

    def _admit(self, waiting: deque[Sequence], running: list[Sequence]) -> None:
        """Waiting sequences into the run, in order, as far as the free pages hold their
        prompts (or prompt and generated tokens, after a preemption). One that does not fit
        waits; those behind it that fit go past it, up to HEAD_PASSES times, then it holds
        them back until pages free up for it. (Only the first was looked at: a 5-token
        request waited 151 s behind 7K-token ones with 690 tokens of pages free, probe 119.)"""
        at = 0
        while at < len(waiting) and len(running) < self.max_batch:
            s = waiting[at]
            if not self.blocks.can_grow(s.block_table, s.num_tokens):
                if not running and at == 0:
                    self.blocks.grow(s.block_table, s.num_tokens)  # raises OutOfMemoryError
                if waiting[0].passed >= HEAD_PASSES:
                    return
                at += 1
                continue
            self.blocks.grow(s.block_table, s.num_tokens)
            if self.prefix is not None and s.num_cached == 0 and s.num_generated == 0:
                self._reuse_prefix(s)
            s.status = Status.RUNNING
            del waiting[at]
            running.append(s)
            if at:
                waiting[0].passed += 1

    # -- prompt K/V kept on disk (engine.prefix_store) ----------------------------

    def _reuse_prefix(self, s: Sequence) -> None:
        """Fill s's first prompt tokens' K/V from the store's longest match, as far as the
        cache's kind lets a prefix be read back (`reusable_prefix`: token rows, or whole
        chunks of pages). The last prompt token is always computed: its logits give the
        first answer token."""
        t0 = time.perf_counter()
        kv = self.model.kv
        match = self.prefix.longest(s.token_ids[: s.prompt_len])
        if match is None:
            return
        s.held = match.n_tokens
        n = kv.reusable_prefix(match.n_tokens, s.prompt_len, self.prefill_chunk, getattr(kv, "min_last_chunk", 0))
        if n < self.prefix.min_reuse:
            return
        try:
            layers = 0
            for layer, arrays in enumerate(self.prefix.layers(match, n // kv.prefix_unit)):
                if layer >= kv.n_layers:
                    raise ValueError("too many layers")
                kv.write_prefix(layer, s.block_table, n, arrays)
                layers += 1
            if layers != kv.n_layers:
                raise ValueError("too few layers")
        except (OSError, ValueError):
            s.held = 0  # a damaged entry holds nothing: kept afresh
            return  # the prompt is prefilled whole (rows written are overwritten)
        s.num_cached = s.reused = s.aligned = n
        elapsed = time.perf_counter() - t0
        self.stats.reused_tokens += n
        self.stats.reuse_s += elapsed
        self.stats.prefill_s += elapsed

    # -- prompt K/V shared between the sequences of one run ---------------------------

    def _share_prefixes(self, running: list[Sequence]) -> set[Sequence]:
        """Copy into each fresh prompt the K/V rows another running sequence has computed
        for the tokens they start with, and return the prompts that wait this step for an
        earlier one still computing them. Four questions sent at once about one new
        document each prefilled it (24.8 s, against 8.7 s one after another, when the
        later ones read it from the prefix store).

        Only whole prefill chunks are copied, as a fresh prefill of the prompt would cut
        them (`whole_chunks`), from a source that computed them so (`Sequence.aligned`):
        the prompt then computes the rest in the chunks it would alone, and gets its own
        answer bit for bit. Rows are equal in exact arithmetic whatever the chunks, not in
        floating point: copied up to its last token, a prompt computed its ten question
        tokens as a step of ten rows, not inside its 670-token last chunk, and one of four
        identical greedy requests answered otherwise (probe 96). Rows are copied, not
        shared page by page, so pages keep one owner each (the store, preemption and the
        sparse caches' per-page state stay as they are). A prompt only waits for one
        admitted before it that is still cutting whole chunks (one cut short by a mixed
        step never gets further: the waits lined requests up one behind another), so waits
        cannot form a cycle or last in vain."""
        held: set[Sequence] = set()
        if self.min_share <= 0 or len(running) < 2:
            return held
        kv = self.model.kv
        min_last = getattr(kv, "min_last_chunk", 0)

        def shareable(shared: int, prompt_len: int) -> int:
            return min(kv.reusable_prefix(shared, prompt_len, self.prefill_chunk, min_last),
                       whole_chunks(shared, prompt_len, self.prefill_chunk, min_last))

        for s in running:
            if s.num_cached or s.num_generated or s.prompt_len <= self.min_share:
                continue
            prompt = s.token_ids[: s.prompt_len]
            best, best_n, coming = None, 0, 0
            for r in running:
                if r is s:
                    continue
                common = _common_start(prompt, r.token_ids)
                whole = shareable(common, s.prompt_len)
                if whole < self.min_share:
                    continue
                n = shareable(min(common, kv.keepable_prefix(r.aligned, r.aligned)), s.prompt_len)
                if n < whole and r.seq_id < s.seq_id and r.in_prefill and r.aligned == r.num_cached:
                    coming = max(coming, whole)  # it is computing them now, in whole chunks
                if n >= self.min_share and n > best_n:
                    best, best_n = r, n
            if best is not None and best_n >= coming and self._copy_prefix(best, s, best_n):
                continue
            if coming:
                held.add(s)
        return held

    def _copy_prefix(self, src: Sequence, dst: Sequence, n: int) -> bool:
        """dst's first n tokens' K/V copied from src's pages, layer by layer; False (dst
        prefilled whole, the rows written overwritten) where a layer's cannot be."""
        t0 = time.perf_counter()
        kv = self.model.kv
        for layer in range(kv.n_layers):
            arrays = kv.prefix_arrays(layer, src.block_table, n)
            if arrays is None:
                return False
            kv.write_prefix(layer, dst.block_table, n, arrays)
        dst.num_cached = dst.aligned = n
        dst.held = max(dst.held, n)  # its rows are another's: not worth an entry of their own
        self.stats.shared_tokens += n
        self.stats.prefill_s += time.perf_counter() - t0
        return True

    def _keepable(self, s: Sequence) -> int:
        """Leading prompt tokens of s an entry would keep (all, or its whole chunks)."""
        return self.model.kv.keepable_prefix(s.prompt_len, s.aligned)

    def _release(self, s: Sequence) -> None:
        """Give s's pages back, first keeping its prompt's K/V where asked (after the
        answer, so writing the entry never delays the first token; with `keep_later`, at
        `keep_deferred`, after the caller's own work too)."""
        try:
            if s.keep_prompt and self.prefix is not None:
                s.keep_prompt = False
                ids = s.token_ids[: self._keepable(s)]
                if self._keep_later:
                    self._to_keep.append((ids, s.block_table))
                    s.block_table = []  # its pages are the entry's until keep_deferred
                else:
                    self._keep(ids, s.block_table)
        finally:
            self.blocks.free(s.block_table)

    def _keep(self, ids: list[int], block_table: list[int]) -> str | None:
        """Save one prompt's K/V; why not, where the disk refused."""
        kv, n = self.model.kv, len(ids)
        if self.prefix.save(ids, lambda i: kv.prefix_arrays(i, block_table, n), kv.n_layers,
                            unit=kv.prefix_unit, fixed=kv.prefix_fixed):
            self.stats.kept_tokens += n
            return None
        if self.prefix.last_error:
            self.stats.keep_error = self.prefix.last_error
        return self.prefix.last_error

    def _ensure_decode_pages(self, running: list[Sequence], waiting: deque[Sequence]) -> None:
        for s in list(running):
            if s not in running:
                continue  # preempted below for an earlier sequence
            while not self.blocks.can_grow(s.block_table, s.num_tokens):
                victims = [v for v in running if v is not s]
                if not victims:
                    self.blocks.grow(s.block_table, s.num_tokens)  # raises OutOfMemoryError
                victim = victims[-1]  # the most recently admitted
                running.remove(victim)
                self.blocks.free(victim.block_table)
                # its rows are gone: nothing to keep (a recompute is not a prompt's first prefill)
                victim.num_cached, victim.aligned, victim.status, victim.keep_prompt = 0, 0, Status.WAITING, False
                waiting.appendleft(victim)
                self.stats.preemptions += 1
            self.blocks.grow(s.block_table, s.num_tokens)

    def _step_budget(self, prefill: list[Sequence], decoding: bool) -> int:
        """Prompt tokens this prefill step may take. Alone, prompts read whole chunks. While
        others decode, or where a short prompt (under a mixed step) waits beside a longer
        one (a request that arrived during a long prompt's prefill), the longer ones read a
        mixed step's worth, so streams pause little and the short prompt's first token does
        not wait for a whole chunk (a 6K-token prompt's 2,048-token steps held one for
        1.9-5.5 s on 2 cores); the short prompts all fit the step, however many arrived
        together (one a step, a burst of 16 took 13 steps)."""
        short = [s.pending for s in prefill if s.pending < MIXED_PREFILL_CHUNK]
        if not decoding and (not short or len(short) == len(prefill)):
            return self.prefill_chunk
        return min(self.prefill_chunk, max(MIXED_PREFILL_CHUNK, sum(short)))

    def _take_chunks(self, prefill: list[Sequence], budget: int) -> list[tuple[Sequence, int]]:
        batch = []
        # A chunk cut as if alone (question pages) may be longer than a mixed step's budget:
        # the first prompt still gets it (the step was empty and failed). Other policies
        # keep the budget, which bounds how long running streams pause.
        whole = getattr(self.model.kv, "min_last_chunk", 0) > 0
        for s in prefill:
            if budget <= 0:
                break
            n = self._chunk_len(s, max(budget, self.prefill_chunk) if whole and not batch else budget)
            if n > 0:
                batch.append((s, n))
                budget -= n
        for s in prefill:  # those left out this step go first after STARVED_STEPS more
            s.waited = 0 if any(t is s for t, _ in batch) else s.waited + 1
        return batch

    def _chunk_len(self, s: Sequence, budget: int) -> int:
        """Tokens of s to prefill in a step with `budget` tokens left (0: wait for the next
        step; the first sequence of a step always gets some).

        With question pages (the cache's `min_last_chunk` > 0, topk) where a prompt's
        chunks end changes what it attends to: the pages are chosen from the prompt's last
        queries, which must all be in its last chunk, and only that chunk is replayed with
        the choice. So such a prompt is cut as it would be alone, whatever it shares steps
        with (a chunk that does not fit waits), and its last chunk is never shorter than
        `min_last_chunk`: the same request gets the same greedy answer in any batch."""
        want = min(getattr(self.model.kv, "min_last_chunk", 0), self.prefill_chunk)
        n = min(s.pending, self.prefill_chunk if want else budget)
        if n < s.pending and s.pending - n < want:
            n = s.pending - want
        return n if n <= budget else 0

    def _drop_aborted(self, running: list[Sequence], waiting: deque[Sequence]) -> None:
        if not self._aborted:
            return
        for group in (running, waiting):
            for s in list(group):
                if s.seq_id in self._aborted:
                    group.remove(s)
                    s.status, s.finish_reason = Status.FINISHED, "abort"
                    self._release(s)

    def _finish_if_done(self, s: Sequence, tok: int, eos_ids) -> None:
        if tok in eos_ids:
            s.status, s.finish_reason = Status.FINISHED, "stop"
        elif s.num_generated >= s.max_new_tokens or s.num_tokens >= self.context_window:
            s.status, s.finish_reason = Status.FINISHED, "length"

    # -- one step -----------------------------------------------------------------

    def _build_step(self, batch: list[tuple[Sequence, int]], all_rows: bool = False) -> tuple[Step, torch.Tensor]:
        """The step and its token ids [T], on the model's device."""
        ids, positions, slots, seq_attn, last_rows = [], [], [], [], []
        row = 0
        max_len = 0
        bs = self.block_size
        on_host = self.device.type == "cpu"
        for s, n in batch:
            lo, ctx = s.num_cached, s.num_cached + n
            ids.extend(s.token_ids[lo:ctx])
            first, slot_index = block_slots(s.block_table, bs, ctx)
            positions.append(torch.arange(lo, ctx))
            if first is not None:
                slots.append(torch.arange(first + lo, first + ctx))
            else:
                slots.append(slot_index[lo:ctx])
            masks = make_masks(n, ctx, self.windows, None if on_host else self.device)
            seq_attn.append(SeqAttn(row, n, ctx, first, slot_index, masks, samples=ctx == s.num_tokens))
            row += n
            last_rows.append(row - 1)
            max_len = max(max_len, ctx)
        pos = torch.cat(positions) if len(positions) > 1 else positions[0]
        slot_mapping = torch.cat(slots) if len(slots) > 1 else slots[0]
        logit_rows = None if all_rows else torch.tensor(last_rows)
        ids_t = torch.tensor(ids)
        if not on_host:
            ids_t, pos, slot_mapping, logit_rows = self._to_device(ids_t, pos, slot_mapping, logit_rows, seq_attn)
        step = Step(
            positions=pos,
            slot_mapping=slot_mapping,
            seqs=seq_attn,
            logit_rows=logit_rows,
            max_len=max_len,
            windows=self.windows,
        )
        return step, ids_t

    def _to_device(self, ids, positions, slot_mapping, logit_rows, seq_attn: list[SeqAttn]):
        """Move a step's host-built int64 tensors (and the slot index of each sequence
        whose pages are not consecutive) to the device in one copy: a step then costs one
        host-to-device transfer and one sync, when its sampled tokens come back."""
        gathered = [a for a in seq_attn if a.slots is not None]
        parts = [ids, positions, slot_mapping] + ([logit_rows] if logit_rows is not None else [])
        parts += [a.slots for a in gathered]
        moved = torch.cat(parts).to(self.device).split([p.numel() for p in parts])
        for a, slots in zip(gathered, moved[4 if logit_rows is not None else 3 :]):
            a.slots = slots
        return moved[0], moved[1], moved[2], (moved[3] if logit_rows is not None else None)

    def _step(self, batch: list[tuple[Sequence, int]], params: SamplingParams) -> list[tuple[Sequence, int]]:
        """Run one forward; sample for the sequences whose pending tokens are all in."""
        step, ids = self._build_step(batch)
        logits = self.model.forward(ids, step)  # [B, vocab]
        self.stats.steps += 1
        done, rows = [], []
        for i, (s, n) in enumerate(batch):
            if s.aligned == s.num_cached and n == self.prefill_chunk and s.num_cached + n < s.prompt_len:
                s.aligned += n  # a whole chunk, not the prompt's last: as a fresh prefill cuts it
            s.num_cached += n
            if s.num_cached == s.num_tokens:
                done.append(s)
                rows.append(i)
                # A prompt just cached whole, most of what an entry keeps new to the store: worth
                # one. New to the store, not to this run: a sparse read keeps whole chunks, so
                # every question wrote its own copy of the document's pages (158 MB each for a
                # 12K-token one) for the one chunk that held its first words.
                if (self._keep_prompts and self.prefix is not None and s.num_generated == 0
                        and self._keepable(s) - max(s.reused, s.held) >= self.prefix.min_tokens):
                    s.keep_prompt = True
            if s.num_generated == 0 or n > 1:
                self.stats.prefill_tokens += n
        if not done:
            return []
        if len(rows) != len(batch):
            logits = logits[rows]
        own = [s.params for s in done]
        tokens = sample(logits, params if all(p is None for p in own) else [p or params for p in own],
                        [s.generator for s in done])
        for s, t in zip(done, tokens):
            s.token_ids.append(t)
        return list(zip(done, tokens))


def _common_start(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share: a binary search over slice comparisons,
    which run in C (a token-by-token loop over two 8K-token prompts took milliseconds,
    a decode step's worth, on every step a prompt waits)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
