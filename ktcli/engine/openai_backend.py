"""A Backend that drives an OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI, or
`ktcli serve`): the server does the parallel inference, ktcli keeps ingestion, planning,
retrieval, memory passing and citations.

    ktcli ask report.pdf "..." --backend openai --base-url http://gpu-box:8000/v1 --model NAME
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

from ktcli.config import Settings
from ktcli.engine.backend import GenStats, Message, SamplingParams
from ktcli.engine.detokenize import StopStrings
from ktcli.engine.openai_http import Endpoint, HttpClient, ServerStatusError, StreamCutOffError, StreamTimeoutError
from ktcli.errors import BackendError, UsageError
from ktcli.types import ModelFacts

# Chat templates add a few tokens per message (role markers, separators) and a
# generation prompt; used only when the server cannot count a chat for us.
TEMPLATE_TOKENS_PER_MESSAGE = 4
TEMPLATE_TOKENS_FIXED = 3
MAX_PARALLEL_REQUESTS = 8  # map steps sent at once; the server batches them
CUT_OFF_MARK = "\n[answer cut off: {reason}]"
CUT_RETRIES = 2  # streams cut before their first word are asked again this many times
SERVER_STOPS = 4  # the most stop strings OpenAI's API accepts
# Keys servers use for the context window in /v1/models entries: vLLM and SGLang say
# max_model_len; ktcli serve also says context_window; llama.cpp puts n_ctx_train in meta.
WINDOW_KEYS = ("max_model_len", "context_window", "context_length", "max_context_length")
# /v1/models is the first call to the server: any working one lists its models at once, so
# one that took the connection and says nothing for this long (a wrong port, a stuck
# proxy) is said now, not after the request timeout (600 s) meant for answers.
PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ServedModel:
    id: str
    context_window: int


def client_for(settings: Settings) -> HttpClient:
    key = settings.api_key or os.environ.get("OPENAI_API_KEY", "")
    return HttpClient(settings.base_url, key, timeout_s=settings.request_timeout)


def server_address(settings: Settings) -> str:
    """The server as the status and errors name it; a --base-url that is no URL is refused
    here (a usage error)."""
    return Endpoint.parse(settings.base_url).display


def _window_of(entry: dict) -> int:
    for key in WINDOW_KEYS:
        if isinstance(entry.get(key), int) and entry[key] > 0:
            return int(entry[key])
    meta = entry.get("meta")
    if isinstance(meta, dict):
        for key in ("n_ctx", "n_ctx_train"):
            if isinstance(meta.get(key), int) and meta[key] > 0:
                return int(meta[key])
    return 0


def discover_model(client: HttpClient, requested: str, window_flag: int, default_model: str) -> ServedModel:
    """Which model to call and its window: from /v1/models, capped by --context-window.

    The default --model ("smollm2") names a local model, so when the user did not pick one
    and the server serves something else, the server's first model is used."""
    missing = False
    try:
        listing = client.get_json("/models", timeout_s=PROBE_TIMEOUT_S)
    except ServerStatusError as e:
        if e.status != 404:
            raise
        listing, missing = {}, True  # some servers have no /v1/models: trust the user
    entries = [m for m in listing.get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if not entries:
        if window_flag <= 0:
            if missing:  # more often a wrong path than a server without the route
                raise UsageError(f"the server at {client.endpoint.display} has no {client.url('/models')} (404): "
                                 "is --base-url right (it usually ends in /v1)? If it is, pass --context-window N")
            raise UsageError(f"the server at {client.endpoint.display} lists no models; pass --context-window N")
        return ServedModel(requested, window_flag)
    by_id = {m["id"]: m for m in entries}
    if requested in by_id:
        entry = by_id[requested]
    elif requested == default_model:
        entry = entries[0]
    else:
        raise BackendError(
            f"the server at {client.endpoint.display} does not serve model {requested!r}; it serves: "
            + ", ".join(sorted(by_id))
        )
    window = _window_of(entry)
    if window and window_flag > 0:
        window = min(window, window_flag)
    window = window or window_flag
    if window <= 0:
        raise UsageError(f"the server does not say the context window of {entry['id']!r}; pass --context-window N")
    return ServedModel(entry["id"], window)


@lru_cache(maxsize=8)
def _discover_cached(base_url: str, api_key: str, timeout: float, model: str, window: int) -> ServedModel:
    settings = Settings(base_url=base_url, api_key=api_key, request_timeout=timeout)
    return discover_model(client_for(settings), model, window, Settings().model)


def served_model(settings: Settings) -> ServedModel:
    """One /v1/models call per process, however often planning and loading ask."""
    return _discover_cached(settings.base_url, settings.api_key, settings.request_timeout,
                            settings.model, settings.context_window)


def remote_model_facts(settings: Settings) -> ModelFacts:
    """What the planner needs. Weights and KV live on the server: no local memory to plan."""
    served = served_model(settings)
    return ModelFacts(name=served.id, context_window=served.context_window, n_layers=0, n_kv_heads=0,
                      head_dim=0, n_params=0, weight_bytes=0)


class _TooLong(Exception):
    """/tokenize refused a text for its length, not for its shape."""


class TokenCounter:
    """The server's tokenizer through /tokenize (vLLM, llama.cpp, ktcli serve) when it has
    one, else tiktoken's cl100k as an estimate. Probed once, then remembered."""

    def __init__(self, client: HttpClient, model: str) -> None:
        self.client, self.model = client, model
        self.remote: bool | None = None  # None: not probed yet
        self.remote_chat: bool | None = None
        self._count = lru_cache(maxsize=4096)(self._count_uncached)

    @property
    def source(self) -> str:
        return "server" if self.remote else "tiktoken"

    def count(self, text: str) -> int:
        return self._count(text) if text else 0

    def _count_uncached(self, text: str) -> int:
        if self.remote is not False:
            try:
                n = self._remote({"model": self.model, "prompt": text, "content": text, "add_special_tokens": False})
            except _TooLong:
                # The server's tokenizer is there, the text is past what it counts at once
                # (ktcli serve: the window's worth): counted in halves, split at a space.
                cut = max(text.rfind(" ", 0, len(text) // 2), text.rfind("\n", 0, len(text) // 2), len(text) // 2)
                return self._count_uncached(text[:cut]) + self._count_uncached(text[cut:])
            self.remote = n is not None
            if n is not None:
                return n
        from ktcli.ingest.tokens import count_tokens

        return count_tokens(text)

    def chat(self, messages: list[Message]) -> int:
        estimate = sum(self.count(m["content"]) + TEMPLATE_TOKENS_PER_MESSAGE for m in messages) + TEMPLATE_TOKENS_FIXED
        if self.remote and self.remote_chat is not False:
            n = self._remote({"model": self.model, "messages": messages, "add_generation_prompt": True})
            # A server that ignores "messages" (llama.cpp) counts an empty prompt: too few.
            content = sum(self.count(m["content"]) for m in messages)
            self.remote_chat = n is not None and n >= content
            if self.remote_chat:
                return int(n)  # type: ignore[arg-type]
        return estimate

    @staticmethod
    def local_chat(messages: list[Message]) -> int:
        """A chat's tokens by tiktoken, asking the server nothing: for a call the server
        cut off, which may be gone."""
        from ktcli.ingest.tokens import count_tokens

        return sum(count_tokens(m["content"]) + TEMPLATE_TOKENS_PER_MESSAGE for m in messages) + TEMPLATE_TOKENS_FIXED

    def _remote(self, body: dict) -> int | None:
        try:
            data = self.client.post_json("/tokenize", body, root=True)
        except ServerStatusError as e:
            if e.status == 400 and "context window" in str(e) and len(body.get("prompt") or "") > 1:
                raise _TooLong from None
            return None  # no /tokenize (404), or it rejects this shape (400)
        if isinstance(data.get("count"), int):
            return int(data["count"])
        if isinstance(data.get("tokens"), list):
            return len(data["tokens"])
        return None


class OpenAIBackend:
    name = "openai"

    def __init__(self, client: HttpClient, model: str, context_window: int) -> None:
        self.client = client
        self.model = model
        self.context_window = context_window
        self.tokens = TokenCounter(client, model)
        self._stats = GenStats()
        self._text_events: list[float] = []

    @classmethod
    def from_settings(cls, settings: Settings) -> "OpenAIBackend":
        served = served_model(settings)
        return cls(client_for(settings), served.id, served.context_window)

    def finish(self) -> str | None:
        return None  # nothing held back

    @property
    def last_stats(self) -> GenStats:
        return self._stats

    def count_tokens(self, text: str) -> int:
        return self.tokens.count(text)

    def prompt_tokens(self, messages: list[Message]) -> int:
        return self.tokens.chat(messages)

    def _body(self, messages: list[Message], params: SamplingParams, stream: bool) -> dict:
        body: dict = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "stream": stream,
        }
        if params.temperature > 0 and params.top_p < 1.0:
            body["top_p"] = params.top_p
        if params.top_k:
            body["top_k"] = params.top_k  # vLLM, SGLang and llama.cpp read this extension
        if params.stop:
            # OpenAI's API takes at most 4 stop strings (a 400 beyond that). The server gets
            # the first 4, to stop early; all of them are applied here as text arrives.
            body["stop"] = list(params.stop)[:SERVER_STOPS]
        if params.seed is not None:
            body["seed"] = params.seed
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def stream_chat(self, messages: list[Message], params: SamplingParams) -> Iterator[str]:
        start = time.perf_counter()
        ttft = 0.0
        parts: list[str] = []
        usage: dict = {}
        body = self._body(messages, params, True)
        stops = StopStrings(params.stop)
        # One budget for the request, retries included (each started its own: 3 x the
        # timeout, and the server did the work three times).
        deadline = time.monotonic() + self.client.timeout_s
        try:
            for attempt in range(CUT_RETRIES + 1):
                # when the server's events carrying text came (the decode time between them), this attempt's
                self._text_events = []
                try:
                    for event in self.client.post_stream("/chat/completions", body, deadline):
                        if isinstance(event.get("usage"), dict):
                            usage = event["usage"]
                        text = _delta_text(event)
                        if text:
                            self._text_events.append(time.perf_counter())
                        piece = stops.feed(text)
                        if piece:
                            ttft = ttft or time.perf_counter() - start
                            parts.append(piece)
                            yield piece
                        if stops.stopped:
                            break  # leaving the loop closes the stream: the server stops too
                    break
                except StreamCutOffError as e:
                    if parts or attempt == CUT_RETRIES or isinstance(e, StreamTimeoutError):
                        raise
                    # Cut before the first word: nothing shown yet, so asking again is safe.
                    stops = StopStrings(params.stop)  # nor anything held from the cut stream
                    time.sleep(self.client.backoff_s * 2**attempt)
        except GeneratorExit:  # the caller stopped reading (a looping answer): the stream closes
            # The server sends usage in the last chunk, not reached: the prompt is counted
            # here (the server is still there to ask), the answer one token per piece.
            self._record(messages, parts, {"completion_tokens": len(parts), **usage}, start, ttft)
            raise
        except StreamCutOffError as e:
            rest = stops.flush()  # text held as a possible stop's start is answer after all
            if rest:
                parts.append(rest)
                yield rest
            # No token counting by the server here: it may have just gone away.
            self._record(messages, parts, _partial_usage(usage, parts, self.tokens.local_chat(messages)), start, ttft)
            if parts:
                # Kept and marked: the reader sees where the answer stops and why.
                yield CUT_OFF_MARK.format(reason=str(e))
            kept = f" (partial answer kept: {len(''.join(parts))} characters)" if parts else ""
            raise StreamCutOffError(f"{e}{kept}", partial="".join(parts), reason=str(e)) from None
        rest = stops.flush()
        if rest:
            parts.append(rest)
            yield rest
        self._record(messages, parts, usage, start, ttft)

    def _record(self, messages: list[Message], parts: list[str], usage: dict, start: float, ttft: float) -> None:
        total = time.perf_counter() - start
        ttft = ttft or total
        self._stats = GenStats(
            prompt_tokens=int(usage["prompt_tokens"] if "prompt_tokens" in usage else self.prompt_tokens(messages)),
            new_tokens=int(usage["completion_tokens"] if "completion_tokens" in usage else self.count_tokens("".join(parts))),
            # Decode time is from the server's first event carrying text to its last: an answer
            # sent in one event has none to measure ("decode 88171.1 tok/s", shown and learned),
            # 0, not shown; nor do the pieces shown say it (a trailing newline held as a stop's
            # start came out as a second piece).
            prefill_s=ttft, decode_s=self._text_events[-1] - self._text_events[0] if len(self._text_events) > 1 else 0.0,
            ttft_s=ttft,
            extra={"backend": "openai", "server": self.client.endpoint.display, "server_model": self.model,
                   "tokenizer": self.tokens.source, "retries": self.client.retries},
        )

    def _complete(self, messages: list[Message], params: SamplingParams) -> tuple[str, dict]:
        data = self.client.post_json("/chat/completions", self._body(messages, params, False))
        choices = data.get("choices") or [{}]
        message = choices[0].get("message") or {}
        stops = StopStrings(params.stop)
        return stops.feed(str(message.get("content") or "")) + stops.flush(), data.get("usage") or {}

    def generate_chat_batch(self, batch: list[list[Message]], params: SamplingParams) -> list[str]:
        """Sent concurrently: a batching server (vLLM, ktcli serve) runs them together."""
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL_REQUESTS, len(batch)))) as pool:
            results = list(pool.map(lambda m: self._complete(m, params), batch))
        total = time.perf_counter() - start
        self._stats = GenStats(
            prompt_tokens=sum(int(u.get("prompt_tokens") or 0) for _, u in results),
            new_tokens=sum(int(u.get("completion_tokens") or 0) for _, u in results),
            prefill_s=0.0, decode_s=total,
            extra={"backend": "openai", "server": self.client.endpoint.display, "server_model": self.model},
        )
        return [text for text, _ in results]


def _delta_text(event: dict) -> str:
    choices = event.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        return ""
    delta = choices[0].get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    if content is None:
        content = choices[0].get("text")  # a /v1/completions-style chunk
    return content if isinstance(content, str) else ""


def _partial_usage(usage: dict, parts: list[str], prompt_estimate: int) -> dict:
    """Usage of a stream that ended early: what the server said so far, else the prompt
    as estimated here (it was sent: the figures said tokens_in 0 for it) and one
    completion token per streamed piece (no counting call to a server that may be gone)."""
    return {"prompt_tokens": prompt_estimate, "completion_tokens": len(parts), **usage}
