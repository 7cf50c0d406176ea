"""Run several independent requests through one engine together, streaming each one.

This is the step-level API `ktcli serve` needs, built on the engines' public pieces:
a request (a `Job`) carries token ids in and emits text deltas out, and a runner
drives a group of jobs through one batched generation:

- `NativeRunner`: our engine's `Engine.generate(prompts)`, which yields (index, token)
  across a batch with paged KV, and `Engine.abort(index)` for jobs that finish early
  (their own token limit, a stop string, a client that went away).
- `HFRunner`: transformers' `generate` with left padding, a streamer that sees every
  step's tokens for all rows, and a per-row stopping criterion.

The scheduler gathers concurrent requests for a moment and runs them as one batch.
`NativeRunner` also takes requests that arrive while a batch runs, at the next engine
step (`run(jobs, join)`: continuous batching); `HFRunner` cannot (transformers'
`generate` takes its rows up front), so there they form the next batch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from ktcli.engine.backend import Message, SamplingParams
from ktcli.engine.detokenize import IncrementalDetokenizer, StopStrings


@dataclass(eq=False)
class Job:
    """One request in flight. The runner writes events; the HTTP thread reads them:
    ("text", str), then ("done", "stop"|"length") or ("error", message)."""

    prompt: list[int]
    params: SamplingParams
    events: "queue.Queue[tuple[str, str]]" = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose K/V the engine read back, not prefilled (usage)
    finished: bool = False
    outcome: str = ""  # its finish reason, or "error" (for the server's log)

    def emit(self, text: str) -> None:
        if text and not self.finished:
            self.events.put(("text", text))

    def finish(self, reason: str) -> None:
        if not self.finished:
            self.finished, self.outcome = True, reason
            self.events.put(("done", reason))

    def fail(self, message: str) -> None:
        if not self.finished:
            self.finished, self.outcome = True, "error"
            self.events.put(("error", message))

    def cancel(self) -> None:
        """The client went away: stop spending compute on this one."""
        self.cancelled.set()

    @property
    def live(self) -> bool:
        return not self.finished and not self.cancelled.is_set()


def sampling_key(params: SamplingParams) -> tuple:
    """Jobs with equal keys can share one batch where a runner samples a batch with one
    set of parameters (HFRunner; ours mixes them: `mixes_sampling`). Token limits and stop
    strings are per job, handled here."""
    if params.temperature <= 0:
        return ("greedy",)
    return (params.temperature, params.top_k, params.top_p, params.seed)


class Runner(Protocol):
    name: str
    context_window: int
    vocab_size: int  # rows of the model's embedding: a prompt's ids must be below it
    max_prompt_chars: int  # text longer than this cannot fit the window (`longest_token`)
    message_tokens: int  # the fewest tokens a chat message costs (`message_tokens`)
    max_batch: int
    bos_id: int | None  # what a prompt of no tokens starts from (`start_token`); None: nothing

    def encode_chat(self, messages: list[Message], template_kwargs: dict | None = None) -> list[int]:
        """The model's chat template applied, with the generation prompt (and the
        client's `chat_template_kwargs`)."""

    def encode_text(self, text: str, special: bool = False) -> list[int]: ...

    def run(self, jobs: list[Job], join: Callable[[int], list[Job]] | None = None) -> None:
        """Generate for every job; each ends with exactly one done/error event. `join(room)`
        hands over jobs that arrived since, to add to the running batch where the runner
        can (`joins`)."""


def longest_token(vocab: dict[str, int]) -> int:
    """The most characters one token of `vocab` stands for (its spelled form is at least
    as long: a byte-level token spells each byte as one character). A text longer than the
    window times this cannot fit, and is refused before its tokenisation, which holds the
    GIL: a 20 MB body stalled every other client of `ktcli serve` for 13 s."""
    return max((len(t) for t in vocab), default=1) or 1


def message_tokens(encode_chat: Callable[[list[Message]], list[int]]) -> int:
    """The tokens one more (empty) message costs under the chat template: its role's header
    and end, 5 for SmolLM2's. A chat of more messages than the window over this cannot fit,
    and is refused before its template is rendered (8,000 empty messages took 5 s to
    render into their 400). The cheaper of a user and an assistant turn (an assistant's may
    hold an empty thinking block), added as templates that want roles to alternate accept;
    1 where the template refuses even that."""
    user, assistant = {"role": "user", "content": ""}, {"role": "assistant", "content": ""}
    try:
        lengths = [len(encode_chat(chat)) for chat in ([user], [user, assistant], [user, assistant, user])]
    except Exception:  # noqa: BLE001 - a template's own refusal: no estimate, count messages only
        return 1
    return max(1, min(lengths[1] - lengths[0], lengths[2] - lengths[1]))


def start_token(tokenizer, config_bos: int | None) -> int | None:
    """The model's beginning-of-sequence token, which a completion of an empty prompt is
    written from (as OpenAI's are, from the start of a text): the tokenizer's, else the
    model config's; None where neither names one."""
    found = getattr(tokenizer, "bos_token_id", None)
    return int(found) if found is not None else config_bos


class _Stream:
    """Per-job text state: incremental detokenizing, stop strings, token limit."""

    def __init__(self, job: Job, decode: Callable[[list[int]], str], window: int) -> None:
        self.job = job
        self.detok = IncrementalDetokenizer(decode, job.prompt)
        self.stops = StopStrings(job.params.stop)
        self.window = window

    def push(self, token: int) -> bool:
        """Take one generated token; True once the job needs no more."""
        job = self.job
        if not job.live:
            return True
        job.completion_tokens += 1
        job.emit(self.stops.feed(self.detok.push(token)))
        if self.stops.stopped:
            job.finish("stop")
            return True
        if job.completion_tokens >= job.params.max_new_tokens or len(job.prompt) + job.completion_tokens >= self.window:
            self.close("length")
            return True
        return False

    def close(self, reason: str) -> None:
        """End of generation for this job (EOS, limit): flush what is held back."""
        if not self.job.live:
            self.job.finish(reason)  # a cancelled job still gets its one final event
            return
        if not self.stops.stopped:
            self.job.emit(self.stops.feed(self.detok.flush()) + self.stops.flush())
        self.job.finish(reason)


def _group_params(jobs: list[Job]) -> SamplingParams:
    # The batch runs to the longest limit; shorter jobs are aborted at their own.
    return replace(jobs[0].params, max_new_tokens=max(j.params.max_new_tokens for j in jobs), stop=())


class NativeRunner:
    """Our engine: batched chunked prefill and batched decode over the paged KV cache."""

    name = "ktcli"
    joins = True  # takes requests into a running batch (`run`'s `join`)
    # Samples each request with its own temperature, top-k, top-p and seed in one batch
    # (`sampler.sample`): a request at OpenAI's default temperature 1 waited 5.4 s behind
    # a greedy stream for its first token (0.11 s when it could join).
    mixes_sampling = True

    def __init__(self, backend, max_batch: int = 16) -> None:
        self.backend = backend
        self.engine = backend.engine
        self.tokenizer = backend.tokenizer
        self.context_window = int(backend.context_window)
        self.vocab_size = int(backend.cfg.vocab_size)
        # (a test model without a tokenizer runs on token ids: one character per token)
        vocab = self.tokenizer.get_vocab() if self.tokenizer is not None else {}
        self.max_prompt_chars = self.context_window * longest_token(vocab)
        self.max_batch = max(1, min(max_batch, getattr(self.engine, "max_batch", max_batch)))
        # the tokens its KV pages hold, all requests together (what `ktcli serve` says on start)
        self.kv_tokens = int(backend.kv.num_blocks * backend.kv.block_size)
        # What they take when full, where, and what of it the process holds only once
        # requests write the pages (float pages; quantized ones are written at start).
        self.kv_bytes = int(backend.kv.allocated_bytes)
        self.kv_device = backend.kv.device.type
        self.kv_unwritten_bytes = 0 if getattr(backend.kv, "written_at_allocation", True) else self.kv_bytes
        # what a prefill step's activations scale with (`ktcli serve` sizes its working memory by them)
        self.prefill_chunk = int(getattr(self.engine, "prefill_chunk", 0))
        self.widths = backend.cfg.hidden_size + backend.cfg.intermediate_size
        self._decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)
        self.message_tokens = message_tokens(self.encode_chat) if self.tokenizer is not None else 1
        self.bos_id = start_token(self.tokenizer, backend.cfg.bos_token_id)

    def encode_chat(self, messages: list[Message], template_kwargs: dict | None = None) -> list[int]:
        return list(self.backend.chat_ids(messages, template_kwargs))

    def encode_text(self, text: str, special: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def run(self, jobs: list[Job], join: Callable[[int], list[Job]] | None = None) -> None:
        """Run `jobs` as one batch; `join(room)`, asked before every engine step, hands
        over requests that arrived since (same sampling), which join the running batch:
        a 5-token request sent during a 300-token one waited 2.9 s for it to end."""
        jobs = list(jobs)
        streams = [_Stream(j, self._decode, self.context_window) for j in jobs]
        ended = [False] * len(jobs)

        def joining() -> list[tuple[list[int], SamplingParams]]:
            # Asked before every engine step, also between the chunks of a long prompt,
            # which yield no token: a client gone (or a server stopping) then frees the
            # engine at the next step, not after the whole prompt (a SIGTERM during an
            # 8K-token prompt waited 60 s, then aborted inside the kernels, exit 134).
            self._drop_cancelled(jobs, ended)
            new = join(self.max_batch - ended.count(False)) if join is not None else []
            for job in new:
                jobs.append(job)
                streams.append(_Stream(job, self._decode, self.context_window))
                ended.append(False)
            return [(job.prompt, job.params) for job in new]  # stop strings are the streams' (_Stream)

        def on_eos(i: int) -> None:  # answered now, not when the whole batch ends
            if not ended[i]:
                ended[i] = True
                streams[i].close("stop")

        reused = getattr(self.engine, "reused", None)
        gen = self.engine.generate([j.prompt for j in jobs], _group_params(jobs), self.backend.eos_ids, joining,
                                   on_eos, own_params=[j.params for j in jobs])
        try:
            for i, token in gen:
                if not ended[i] and not jobs[i].completion_tokens:  # its prompt is read by now
                    jobs[i].cached_tokens = reused(i) if reused is not None else 0
                if not ended[i] and streams[i].push(token):
                    ended[i] = True
                    self.engine.abort(i)
                self._drop_cancelled(jobs, ended)
        except Exception as e:  # noqa: BLE001 - reported to the waiting clients
            gen.close()
            _after_failure(jobs, e, self.run)
            return
        finally:
            gen.close()
        for i, s in enumerate(streams):
            if not ended[i]:
                s.close("stop")  # the engine ended it without reaching a limit: EOS

    def _drop_cancelled(self, jobs: list[Job], ended: list[bool]) -> None:
        for k, job in enumerate(jobs):
            if not ended[k] and job.cancelled.is_set():
                ended[k] = True
                job.finish("cancelled")
                self.engine.abort(k)


class HFRunner:
    """transformers: one left-padded batch per group, streamed step by step."""

    name = "hf"

    def __init__(self, backend, max_batch: int = 8) -> None:
        self.backend = backend
        self.model = backend.model
        self.tokenizer = backend.tokenizer
        self.context_window = int(backend.context_window)
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        self.max_prompt_chars = self.context_window * longest_token(self.tokenizer.get_vocab())
        self.max_batch = max(1, max_batch)
        self._decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)
        self.message_tokens = message_tokens(self.encode_chat)
        self.bos_id = start_token(self.tokenizer, getattr(self.model.config, "bos_token_id", None))
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            self.eos_ids.add(int(self.tokenizer.eos_token_id))

    def encode_chat(self, messages: list[Message], template_kwargs: dict | None = None) -> list[int]:
        # a message's "<|im_end|>" stays text (`ChatTokenizer`)
        return list(self.backend.chat_ids(messages, template_kwargs))

    def encode_text(self, text: str, special: bool = False) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=special))

    def run(self, jobs: list[Job], join: Callable[[int], list[Job]] | None = None) -> None:  # noqa: ARG002 - no joining
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList
        from transformers.generation.streamers import BaseStreamer

        params = jobs[0].params
        if len(jobs) > 1 and params.temperature > 0 and params.seed is not None:
            # transformers samples a batch from one generator: a seeded request's tokens
            # would depend on its batch-mates. Alone, they are the seed's.
            for job in jobs:
                self.run([job])
            return
        streams = [_Stream(j, self._decode, self.context_window) for j in jobs]
        ended = [False] * len(jobs)
        runner = self

        class RowStreamer(BaseStreamer):
            first = True

            def put(self, value) -> None:
                if self.first:  # generate hands over the prompt first
                    self.first = False
                    return
                for i, token in enumerate(value.reshape(-1).tolist()):
                    if ended[i]:
                        continue
                    if token in runner.eos_ids:
                        ended[i] = True
                        streams[i].close("stop")
                    elif streams[i].push(token):
                        ended[i] = True

            def end(self) -> None:
                pass

        class RowsDone(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                for k, job in enumerate(jobs):
                    if not ended[k] and job.cancelled.is_set():
                        ended[k] = True
                        job.finish("cancelled")
                return torch.tensor(ended, dtype=torch.bool, device=input_ids.device)

        pad = self.tokenizer.pad_token_id or self.tokenizer.eos_token_id
        width = max(len(j.prompt) for j in jobs)
        # Left padding keeps every prompt's last token at the end, where generation starts.
        input_ids = torch.tensor([[pad] * (width - len(j.prompt)) + j.prompt for j in jobs])
        mask = torch.tensor([[0] * (width - len(j.prompt)) + [1] * len(j.prompt) for j in jobs])
        kwargs = _hf_sampling(_group_params(jobs), pad)
        try:
            with torch.inference_mode():
                self.model.generate(input_ids, attention_mask=mask, streamer=RowStreamer(),
                                    stopping_criteria=StoppingCriteriaList([RowsDone()]), **kwargs)
        except Exception as e:  # noqa: BLE001 - reported to the waiting clients
            _after_failure(jobs, e, self.run)
            return
        for i, s in enumerate(streams):
            if not ended[i]:
                s.close("length")


def _after_failure(jobs: list[Job], error: Exception, run: Callable[[list[Job]], None]) -> None:
    """A batch failed. One request must not fail the others it was batched with: where
    no job of the batch had a token yet (the failure came in the prefill, where a bad
    prompt fails), each runs again alone and only the one that fails alone gets the error.
    A batch that failed mid-answer cannot be replayed without repeating text: it all fails."""
    if len(jobs) > 1 and not any(j.completion_tokens for j in jobs):
        for job in jobs:
            if job.live:
                run([job])
            else:
                job.finish("cancelled")
        return
    for job in jobs:
        job.fail(f"generation failed: {type(error).__name__}: {error}")


def _hf_sampling(params: SamplingParams, pad: int) -> dict:
    import torch

    kwargs: dict = {"max_new_tokens": params.max_new_tokens, "pad_token_id": pad}
    if params.temperature > 0:
        kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or None)
        if params.seed is not None:
            torch.manual_seed(params.seed)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    return kwargs


def make_runner(backend, max_batch: int = 16) -> Runner:
    """The runner for a loaded backend (NativeBackend or HFBackend)."""
    if getattr(backend, "name", "") == "ktcli" and hasattr(backend, "engine"):
        return NativeRunner(backend, max_batch)
    if getattr(backend, "name", "") == "hf":
        return HFRunner(backend, max_batch)
    raise TypeError(f"cannot serve a {getattr(backend, 'name', type(backend).__name__)!r} backend")
