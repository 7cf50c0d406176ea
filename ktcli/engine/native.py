"""NativeBackend: ktcli's own engine behind the `Backend` protocol.

    backend = NativeBackend.load(model_dir, weights="bf16", threads=2)
    backend = NativeBackend.load(model_dir, device="cuda")  # bf16 weights and pages on the GPU
    for delta in backend.stream_chat(messages, SamplingParams(max_new_tokens=128)):
        ...
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from kernels.layout import TORCH_DTYPES
from ktcli.engine.backend import GenStats, Message, SamplingParams
from ktcli.engine.block_manager import BlockManager
from ktcli.engine.config import ModelConfig, load_config
from ktcli.engine.detokenize import IncrementalDetokenizer, StopStrings
from ktcli.engine.host_alloc import keep_freed_blocks
from ktcli.engine.device import available_bytes, peak_memory_mb, resolve_device, resolve_kv_dtype, resolve_weights
from ktcli.engine.kv_cache import PagedKVCache
from ktcli.engine.model import Model
from ktcli.engine.runner import DEFAULT_PREFILL_CHUNK, Engine
from ktcli.engine.tokenizer import load_chat_tokenizer, no_tokenizer
from ktcli.engine.model_store import model_key
from ktcli.engine.pack_cache import load_engine_weights
from ktcli.engine.prefix_store import PrefixStore, prompt_cache_description, store_key
from ktcli.errors import InputError, UsageError

# Default KV budget: room for this many full context windows (`ktcli serve` runs several
# requests at once; a one-shot ask passes kv_windows=1), capped by a share of the
# device's free memory (RAM on the CPU, GPU memory after the weights on CUDA).
_DEFAULT_WINDOWS = 4
_DEFAULT_RAM_SHARE = 0.3
_MAX_DEFAULT_WINDOW = 32768  # tokens per window counted for the default budget
# A one-shot request gives its window (`context_window`, the plan's): its pages are sized
# to it, not capped at 32K tokens like a server's default (a 128K-window model's full
# read of a 43K-token input failed "KV cache full" after its plan said it fits). On the
# CPU up to this share of free RAM, where pages are resident only once written; on a GPU
# `torch.empty` holds them at once, so there the default share stays.
_EXACT_RAM_SHARE = 0.9


class NativeBackend:
    name = "ktcli"
    model_dir: Path | None = None  # the folder it was loaded from

    def __init__(self, cfg: ModelConfig, engine: Engine, tokenizer, kv: PagedKVCache, weights_name: str, weight_bytes: int):
        self.cfg, self.engine, self.tokenizer, self.kv = cfg, engine, tokenizer, kv
        self.device = engine.device
        self.context_window = engine.context_window  # the model's window, or what its pages hold
        self.weights_name, self.weight_bytes = weights_name, weight_bytes
        self._stats = GenStats()
        self.eos_ids = self._eos_ids(tokenizer, cfg)
        self._decode = tokenizer.decode if tokenizer is not None else None
        # Told (prompt tokens read, of all) after each prefill step of a long prompt: the
        # caller's progress bar (`pipeline.runner`); None: nothing told.
        self.on_prefill: Callable[[int, int], None] | None = None

    @property
    def outputs_key(self) -> str | None:
        """A name for what makes this backend's outputs for a prompt: model files, weights,
        pages, policy, prefill dtype, device. The prompt store's key holds them all; None
        without a store (`pipeline.notes_memo` keeps notes beside prompts or not at all)."""
        prefix = self.engine.prefix
        return prefix.folder.name if prefix is not None else None

    # -- loading ------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        model_dir: Path,
        *,
        device: str | torch.device = "cpu",
        weights: str = "auto",
        threads: int = 0,
        block_size: int | None = None,
        kv_budget_bytes: int | None = None,
        prefill_chunk: int | None = None,
        kv_dtype: str = "auto",
        attention="dense",
        dense_layers: int = 0,
        position_remap: bool | None = None,
        rope_scaling=None,
        context_window: int | None = None,
        kv_windows: int = _DEFAULT_WINDOWS,
        unroped_keys: bool = False,
        exact_sinks: bool = True,
        pack_cache: Path | None = None,
        prefix_cache: Path | None = None,
        stage_dtype: str | None = None,
    ) -> "NativeBackend":
        """Load a Hugging Face folder (config.json, *.safetensors, tokenizer). GGUF models
        are converted to such a folder once by `model_store.ensure_hf_dir`.

        `device` "auto" | "cpu" | "cuda" (`engine.device`): weights, KV pages and every
        step's tensors live there. weights / kv_dtype "auto": `engine.device` (int8 weights
        and fp16 pages on the CPU; bf16 and pages of the weights' dtype on CUDA).

        Quantized pages (kv_dtype fp8/int8/int4), attention "window"/"topk" (or an
        AttentionPolicy), dense_layers, position_remap and rope_scaling load the kernels
        cache of `engine.longctx` (block_size then defaults to the kernels' page size);
        unroped_keys stores its keys before RoPE (see `engine.longctx`); exact_sinks=False
        reads the sink pages of remapped policies quantized (`engine.exact_sinks`, for A/B
        runs). `kv_windows`: how many context windows the default KV budget holds (one per
        request served at once); a `context_window` given here is sized exactly, not capped
        at `_MAX_DEFAULT_WINDOW`. `pack_cache`: a folder
        where int8 weights are kept once packed (`engine.pack_cache`; None: pack every load).
        `prefix_cache`: a folder where prompts' K/V are kept for later prompts that start
        the same way (`engine.prefix_store`; None: off). `stage_dtype`: the precision of
        quantized kinds' staged rows (None: fp16 on CUDA, fp32 on the CPU; kernels.bench's
        end-to-end exactness rows ask fp32).
        The CLI and the server then let `engine.threads.govern` choose the thread count."""
        if threads > 0:
            torch.set_num_threads(threads)
        from ktcli.engine import longctx

        device = resolve_device(device)
        if device.type == "cpu":
            keep_freed_blocks()  # prefill temporaries are reused, not faulted in afresh (engine.host_alloc)
        model_dir = Path(model_dir)
        cfg = load_config(model_dir)
        weights = resolve_weights(weights, device, cfg)
        kv_dtype = resolve_kv_dtype(kv_dtype, weights, device)
        if longctx.wants_kernels(kv_dtype, attention, rope_scaling) or position_remap or unroped_keys:
            return longctx.load_backend(
                cls, model_dir, device=device, weights=weights, block_size=block_size, kv_budget_bytes=kv_budget_bytes,
                prefill_chunk=prefill_chunk or 512, kv_dtype=kv_dtype, attention=attention, dense_layers=dense_layers,
                position_remap=position_remap, rope_scaling=rope_scaling, context_window=context_window,
                unroped_keys=unroped_keys, exact_sinks=exact_sinks, budget_ram_share=_DEFAULT_RAM_SHARE, kv_windows=kv_windows,
                pack_cache=pack_cache, prefix_cache=prefix_cache, stage_dtype=stage_dtype,
            )
        block_size = block_size or 16
        w = load_engine_weights(model_dir, cfg, weights, device, pack_cache)
        # The default page dtype per device and weights: engine.device.auto_kv_dtype.
        kv_torch = TORCH_DTYPES.get(kv_dtype)
        if kv_torch is None:
            raise InputError(f"kv dtype {kv_dtype!r}: choose fp32, bf16 or fp16")
        kv = PagedKVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, block_size, kv_torch, device)
        if kv_budget_bytes is None:
            window = context_window if context_window else min(cfg.window, _MAX_DEFAULT_WINDOW)
            element = torch.empty(0, dtype=kv_torch).element_size()
            want = max(1, kv_windows) * (window + block_size) * cfg.kv_bytes_per_token(element)
            share = _EXACT_RAM_SHARE if context_window and device.type == "cpu" else _DEFAULT_RAM_SHARE
            kv_budget_bytes = int(min(want, share * available_bytes(device)))
        kv.allocate(kv.blocks_for_budget(kv_budget_bytes))
        model = Model(cfg, w, kv)
        engine = Engine(model, BlockManager(kv.num_blocks, block_size), prefill_chunk=prefill_chunk or DEFAULT_PREFILL_CHUNK)
        # A request longer than the pool can never run (as `longctx.load_backend` says): a
        # server's pages sized by --max-memory may hold less than the model's window.
        engine.context_window = min(cfg.window, kv.num_blocks * block_size)
        if prefix_cache is not None:
            # Rows computed any other way (model, weights, pages, prefill dtype, device) are never read.
            key = store_key(model_key(model_dir, "prefix"), weights, kv_dtype, model.prefill_dtype, device.type, cfg)
            engine.prefix = PrefixStore(prefix_cache, key, described=prompt_cache_description(
                model_dir, weights, kv_dtype, device.type))
        # A folder without tokenizer.json (a test model) still runs on token ids.
        tokenizer = load_chat_tokenizer(model_dir) if (model_dir / "tokenizer.json").is_file() else None
        backend = cls(cfg, engine, tokenizer, kv, weights, w.nbytes())
        backend.model_dir = model_dir
        return backend

    def _kv_dtype_name(self) -> str:
        """The dtype the KV pages hold, by the name --kv-dtype takes."""
        options = getattr(self, "long_context", None)
        if options is not None:
            return options.kv_dtype
        return next((name for name, dtype in TORCH_DTYPES.items() if dtype == self.kv.dtype), str(self.kv.dtype))

    @staticmethod
    def _eos_ids(tokenizer, cfg: ModelConfig) -> frozenset[int]:
        ids = set(cfg.eos_token_ids)
        if tokenizer is None:
            return frozenset(ids)
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        gen_cfg = Path(tokenizer.name_or_path) / "generation_config.json"
        if gen_cfg.is_file():
            eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
            ids.update([eos] if isinstance(eos, int) else (eos or []))
        return frozenset(ids)

    # -- tokens -------------------------------------------------------------------

    @property
    def _text(self):
        """The tokenizer, for what needs text: a folder without tokenizer.json loads and runs
        on token ids (tests), where a question was an internal AttributeError."""
        if self.tokenizer is None:
            raise UsageError(no_tokenizer(self.model_dir))
        return self.tokenizer

    def count_tokens(self, text: str) -> int:
        return len(self._text.encode(text, add_special_tokens=False))

    def chat_ids(self, messages: list[Message], template_kwargs: dict | None = None) -> list[int]:
        return self._text.apply_chat_template(messages, add_generation_prompt=True, template_kwargs=template_kwargs)

    def prompt_tokens(self, messages: list[Message]) -> int:
        return len(self.chat_ids(messages))

    # -- generation ---------------------------------------------------------------

    def stream_chat(self, messages: list[Message], params: SamplingParams) -> Iterator[str]:
        yield from self.stream_ids(self.chat_ids(messages), params)

    def stream_ids(self, prompt: list[int], params: SamplingParams) -> Iterator[str]:
        detok = IncrementalDetokenizer(self._decode, prompt)
        stops = StopStrings(params.stop)
        # A prompt to keep is written by `finish`, once the caller has shown the answer's sources.
        gen = self.engine.generate([prompt], params, self.eos_ids, keep_later=True, on_prefill=self.on_prefill)
        try:
            for _, tok in gen:
                text = stops.feed(detok.push(tok))
                if text:
                    yield text
                if stops.stopped:
                    break
            if not stops.stopped:
                tail = stops.feed(detok.flush()) + stops.flush()
                if tail:
                    yield tail
        finally:
            gen.close()
            self._record()

    def generate_chat_batch(self, batch: list[list[Message]], params: SamplingParams) -> list[str]:
        return self.generate_ids_batch([self.chat_ids(m) for m in batch], params)[0]

    def generate_ids_batch(self, prompts: list[list[int]], params: SamplingParams) -> tuple[list[str], list[list[int]]]:
        """Texts and token ids for several prompts, run together."""
        detoks = [IncrementalDetokenizer(self._decode, p) for p in prompts]
        stops = [StopStrings(params.stop) for _ in prompts]
        texts = [[] for _ in prompts]
        ids = [[] for _ in prompts]
        gen = self.engine.generate(prompts, params, self.eos_ids)
        try:
            for i, tok in gen:
                if stops[i].stopped:
                    continue
                ids[i].append(tok)
                texts[i].append(stops[i].feed(detoks[i].push(tok)))
                if stops[i].stopped:
                    self.engine.abort(i)
        finally:
            gen.close()
            self._record()
        for i in range(len(prompts)):
            if not stops[i].stopped:
                texts[i].append(stops[i].feed(detoks[i].flush()) + stops[i].flush())
        return ["".join(t) for t in texts], ids

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
        """Token ids only (EOS excluded): the form tests compare with transformers."""
        out = [[] for _ in prompts]
        for i, tok in self.engine.generate(prompts, params, self.eos_ids):
            out[i].append(tok)
        self._record()
        return out

    def prompt_logits(self, ids: list[int]) -> torch.Tensor:
        return self.engine.prompt_logits(ids)

    def answer_logits(self, prompt: list[int], answer: list[int]) -> torch.Tensor:
        return self.engine.answer_logits(prompt, answer)

    def finish(self) -> str | None:
        """Write the prompt K/V a stream kept for later prompts (`Engine.keep_deferred`),
        counted in `last_stats`; a warning where the disk refused it."""
        self.engine.keep_deferred()
        self._record()
        trouble = self.engine.stats.keep_error
        return f"the prompt cache could not keep this prompt for the next question: {trouble}" if trouble else None

    # -- figures ------------------------------------------------------------------

    def _record(self) -> None:
        st = self.engine.stats
        page_bytes = self.kv.bytes_per_block
        self._stats = GenStats(
            prompt_tokens=st.prompt_tokens,
            new_tokens=st.new_tokens,
            prefill_s=st.prefill_s,
            decode_s=st.decode_s,
            ttft_s=st.ttft_s,
            extra={
                "engine": "ktcli",
                "weights": self.weights_name,
                "prefill_dtype": self.engine.model.prefill_dtype,
                "weight_bytes": self.weight_bytes,
                "prefill_tok_s": st.prefill_tokens / st.prefill_s if st.prefill_s else 0.0,
                "decode_tok_s": st.decode_tokens / st.decode_s if st.decode_s else 0.0,
                "kv_pages_peak": st.peak_pages,
                "kv_pages_in_use": self.engine.blocks.num_used,
                "kv_pages_total": self.kv.num_blocks,
                "kv_page_bytes": page_bytes,
                "kv_dtype": self._kv_dtype_name(),  # the pages' own (a plan's "model": the engine's default)
                "kv_bytes_peak": st.peak_pages * page_bytes,
                "kv_bytes_allocated": self.kv.allocated_bytes,
                "preemptions": st.preemptions,
                **({"reused_tokens": st.reused_tokens, "reuse_s": round(st.reuse_s, 3)} if st.reused_tokens else {}),
                **({"kept_tokens": st.kept_tokens} if st.kept_tokens else {}),
                **({"shared_tokens": st.shared_tokens} if st.shared_tokens else {}),
                "device": self.device.type,
                **({"threads": self.engine.threads.current, "thread_switches": self.engine.threads.switches}
                   if self.engine.threads is not None else {"threads": torch.get_num_threads()}),  # --threads N
                **peak_memory_mb(self.device),
            },
        )

    @property
    def last_stats(self) -> GenStats:
        return self._stats
