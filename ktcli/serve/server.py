"""`ktcli serve`: our engine behind the OpenAI API, over stdlib HTTP.

One thread per connection parses and validates (tokenizing included), then hands a Job
to the scheduler's single engine thread and relays its events: a JSON body, or
server-sent events when `stream` is true. A client that goes away only cancels its
own job; every failure becomes a JSON error, never a dead server.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import queue
import re
import select
import socket
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ktcli.engine.backend import SamplingParams
from ktcli.engine.batching import Job, Runner
from ktcli.engine.tokenizer import ChatTemplateError
from ktcli.errors import UsageError
from ktcli.serve.protocol import (
    MAX_BODY_BYTES,
    ApiError,
    Reply,
    check_messages_length,
    check_prompt_length,
    check_token_count,
    parse_generation,
    parse_json,
    parse_messages,
    template_kwargs,
    usage,
)
from ktcli.serve.scheduler import SHUTTING_DOWN, Scheduler

DISCONNECTS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)
EVENT_TIMEOUT_S = 900.0  # longest wait for the engine's next event before giving up on a request
POLL_S = 0.25  # how often a waiting request looks whether its client is still there
# A connection that sends nothing for this long (an idle keep-alive, a half-sent request)
# is closed: on 0.0.0.0 such connections were held open forever, before any key check.
IDLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str = ""
    model_id: str = ""  # empty: the --model's short name
    default_max_tokens: int = 384  # when a request does not say max_tokens
    gather_ms: float = 30.0
    max_batch: int = 16
    verbose: bool = False
    # Web pages (their origins, or "*") whose scripts may call the server from a browser.
    # None by default: without CORS headers a browser refuses a page's JSON POST, so a site
    # the user visits cannot use a model served on their loopback.
    cors_origins: tuple[str, ...] = ()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_origins(origins: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """--cors-origin values as a browser sends them in its Origin header: "*", or a scheme,
    host and optional port with no path (a trailing slash is forgiven)."""
    checked: list[str] = []
    for origin in origins:
        value = origin.strip().rstrip("/")
        if value != "*" and not _ORIGIN.fullmatch(value):
            raise UsageError(f"--cors-origin {origin!r}: give an origin such as http://localhost:3000 (scheme, host, "
                             "optional port; no path), or '*' for any")
        checked.append(value if value == "*" else value.lower())
    return tuple(dict.fromkeys(checked))


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[^/:?#\s\[\]]+)(:\d{1,5})?", re.IGNORECASE)


def check_exposure(host: str, api_key: str) -> None:
    """Anything reachable from other machines must demand a key, one a client can send
    (a key with spaces or a line break in it never matches a header's, nor does one
    with a character outside printable ASCII: header values are bytes read as latin-1;
    curl sends `Bearer clé` as UTF-8 (401), httpx (the openai package's) sends ASCII only,
    Python's http.client and requests send latin-1 (which matched), and none `ключ`)."""
    if api_key and (api_key != api_key.strip() or any(c.isspace() for c in api_key)):
        raise UsageError("--api-key: the key must not hold spaces or line breaks (no client could send it)")
    if api_key and not (api_key.isascii() and api_key.isprintable()):
        raise UsageError("--api-key: the key must be printable ASCII (HTTP clients send other characters "
                         "differently or not at all, so no request could match it)")
    if not is_loopback(host) and not api_key:
        raise UsageError(f"--host {host} is reachable from other machines: give --api-key (or KTCLI_API_KEY) too")


class ServeApp:
    """What the handlers share: the engine's runner, the scheduler and the options."""

    def __init__(self, runner: Runner, options: ServeOptions) -> None:
        self.runner, self.options = runner, options
        self.scheduler = Scheduler(runner, gather_s=options.gather_ms / 1000, max_batch=options.max_batch)
        self.started = time.time()
        self._in_flight = 0  # requests being answered (`drain`)
        self._cv = threading.Condition()

    def begin(self) -> None:
        with self._cv:
            self._in_flight += 1

    def end(self) -> None:
        with self._cv:
            self._in_flight -= 1
            self._cv.notify_all()

    def drain(self, wait_s: float) -> None:
        """Wait up to `wait_s` for the requests in flight to get their last bytes out (on
        shutdown: their errors), before the process ends their threads."""
        with self._cv:
            self._cv.wait_for(lambda: self._in_flight == 0, timeout=wait_s)

    def models(self) -> dict:
        window = self.runner.context_window
        return {"object": "list", "data": [{
            "id": self.options.model_id, "object": "model", "created": int(self.started), "owned_by": "ktcli",
            "max_model_len": window, "context_window": window, "engine": self.runner.name,
        }]}

    def health(self) -> dict:
        return {"status": "ok", "model": self.options.model_id, "engine": self.runner.name,
                "queued": self.scheduler.queued, "running": self.scheduler.running, **self.scheduler.stats_dict()}

    def tokenize(self, body: dict) -> dict:
        """vLLM's /tokenize: a prompt's tokens, or a chat's with the template applied."""
        # Sized as a generation's prompt: the tokenizer holds the GIL for the whole call,
        # and a 30 MB prompt froze every other client's stream for 32 s.
        window, max_chars = self.runner.context_window, self.runner.max_prompt_chars
        if "messages" in body:
            messages = parse_messages(body)
            check_messages_length(messages, max_chars, window, self.runner.message_tokens)
            check_token_count([m["content"] for m in messages], self.runner.encode_text, window, "messages")
            ids = self.runner.encode_chat(messages, template_kwargs(body))
        else:
            text = body.get("prompt", body.get("content"))
            if not isinstance(text, str):
                raise ApiError(400, "'prompt' must be a string (or give 'messages')", param="prompt")
            check_prompt_length(text, max_chars, window)
            check_token_count([text], self.runner.encode_text, window, "prompt")
            ids = self.runner.encode_text(text, special=bool(body.get("add_special_tokens", False)))
        return {"count": len(ids), "tokens": ids, "max_model_len": self.runner.context_window}


class Choices:
    """One request's jobs, one a choice (a completion's prompts: one each), submitted and
    cancelled together. Their events come to one queue, tagged with the choice's index, so
    the handler waits on all at once."""

    def __init__(self, prompts: list[list[int]], params: list[SamplingParams]) -> None:
        self.events: queue.Queue[tuple[int, str, str]] = queue.Queue()
        self.jobs = [Job(ids, p, events=_Tagged(self.events, i)) for i, (ids, p) in enumerate(zip(prompts, params))]

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()

    @property
    def prompt_tokens(self) -> int:
        return sum(len(job.prompt) for job in self.jobs)

    @property
    def completion_tokens(self) -> int:
        return sum(job.completion_tokens for job in self.jobs)

    @property
    def cached_tokens(self) -> int:
        return sum(job.cached_tokens for job in self.jobs)

    def usage(self) -> dict:
        """All choices' tokens together, as OpenAI counts a request's."""
        return usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)


class _Tagged:
    """A job's event queue as its runner sees it (a runner only puts): each event goes on
    to the request's one queue with the job's choice index."""

    def __init__(self, into: queue.Queue, index: int) -> None:
        self.into, self.index = into, index

    def put(self, event: tuple[str, str]) -> None:
        self.into.put((self.index, *event))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ktcli-serve"
    timeout = IDLE_TIMEOUT_S
    app: ServeApp  # set on the subclass made by make_server

    # -- routing --------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        # Load balancers and orchestrators probe /health without a key: there it says only
        # that the server is up, unless the key comes along (`_health`).
        self._guarded(self._get, authorize=self._route() != "/health")

    do_HEAD = do_GET  # a load balancer's HEAD /health: GET's headers, no body (`_json`)

    def do_POST(self) -> None:  # noqa: N802
        self._guarded(self._post)

    def do_PUT(self) -> None:  # noqa: N802
        self._guarded(self._not_allowed)

    do_DELETE = do_PATCH = do_PUT  # a JSON 405, not http.server's HTML 501

    def do_OPTIONS(self) -> None:  # noqa: N802
        """A browser's CORS preflight (before a page's JSON POST, or any request with an
        Authorization header) carries no key: it is answered before the key check."""
        if "Access-Control-Request-Method" in self.headers and "Origin" in self.headers:
            self._guarded(self._preflight, authorize=False)
        else:
            self._guarded(self._not_allowed)

    def _route(self) -> str:
        """The path without its query and the optional /v1 (clients given a base URL without
        it call /chat/completions)."""
        path = self.path.split("?", 1)[0]
        # The absolute form a proxy sends ("GET http://host:8000/v1/models"), which RFC 9112
        # has servers take: its path.
        scheme = path.split("://", 1)
        if len(scheme) == 2 and scheme[0].lower() in ("http", "https"):
            path = "/" + scheme[1].partition("/")[2]
        path = path.rstrip("/")
        return path.removeprefix("/v1") if path.startswith("/v1/") else path

    def _get(self) -> None:
        path = self._route()
        if path == "/models":
            self._json(200, self.app.models())
        elif path.startswith("/models/"):
            # As clients send it, percent-encoded: a model served from a folder named
            # "my model" was asked for as my%20model, and a repo id's slash may come as
            # %2F; the raw path compared never matched
            asked = urllib.parse.unquote(path.removeprefix("/models/"))
            if asked != self.app.options.model_id:
                raise ApiError(404, f"the model {asked!r} does not exist; this server serves "
                               f"{self.app.options.model_id!r}", code="model_not_found")
            self._json(200, self.app.models()["data"][0])
        elif path == "/health":
            self._json(200, self._health())
        elif path in POST_ROUTES:
            self._not_allowed()
        else:
            raise _no_route(self.path)

    def _post(self) -> None:
        path = self._route()
        routes = {"/chat/completions": "chat", "/completions": "completion"}
        if path in routes:
            self._generate(routes[path], self._body())
        elif path == "/tokenize":
            self._json(200, self.app.tokenize(self._body()))
        elif path in ("/models", "/health"):
            self._not_allowed()
        else:
            raise _no_route(self.path)

    def _not_allowed(self) -> None:
        raise ApiError(405, f"{self.command} is not allowed on {self.path}")

    def _health(self) -> dict:
        """Up or not for anyone; the model and the queue's figures for a caller with the key."""
        try:
            self._authorize()
        except ApiError:
            return {"status": "ok"}
        return self.app.health()

    # -- CORS -----------------------------------------------------------------------

    def _allowed_origin(self) -> str | None:
        """What Access-Control-Allow-Origin says to this request's Origin, or None."""
        origin = self.headers.get("Origin")
        allowed = self.app.options.cors_origins
        if not origin or not allowed:
            return None
        if "*" in allowed:
            return "*"
        return origin if origin.strip().rstrip("/").lower() in allowed else None

    def _cors_headers(self) -> None:
        origin = self._allowed_origin()
        if origin is not None:
            self.send_header("Access-Control-Allow-Origin", origin)
        if self.app.options.cors_origins and "*" not in self.app.options.cors_origins:
            self.send_header("Vary", "Origin")  # a cache must not serve one origin's answer to another

    def _refuse_other_origins(self) -> None:
        """A request a browser sends for a page of an origin not allowed is refused before
        any work: a page's form-like POST (text/plain, no preflight) ran a generation the
        page could not read, on the user's machine."""
        origin = self.headers.get("Origin")
        if origin is not None and self.command != "OPTIONS" and self._allowed_origin() is None:
            raise _origin_refused(origin)

    def _preflight(self) -> None:
        if self._allowed_origin() is None:
            raise _origin_refused(self.headers.get("Origin", ""))
        route = self._route()
        methods = "POST" if route in POST_ROUTES else "GET, HEAD"
        self.send_response(204)
        self._cors_headers()
        self.send_header("Access-Control-Allow-Methods", methods)
        # The OpenAI JS client sends its own x-stainless-* headers: allow what is asked.
        asked = self.headers.get("Access-Control-Request-Headers", "").strip()
        self.send_header("Access-Control-Allow-Headers", asked or "Authorization, Content-Type")
        self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self._close_if_body_unread()
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self._sent_headers = True

    # -- guard, auth, body ----------------------------------------------------------

    def _guarded(self, route, authorize: bool = True) -> None:
        self._sent_headers = False
        self._body_read = False
        self.app.begin()
        try:
            self._refuse_other_origins()
            if authorize:
                self._authorize()
            route()
        except ApiError as e:
            self._close_if_body_unread()
            self._error(e)
        except ChatTemplateError as e:  # the request's conversation, refused by the model's template
            self._error(ApiError(400, str(e), param="messages"))
        except DISCONNECTS:
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - one bad request must not take the server down
            self._close_if_body_unread()
            self._error(ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"))
        finally:
            self.app.end()

    def _close_if_body_unread(self) -> None:
        """A request refused before its body was read (404, 401, 405...) leaves the body on
        the connection, where the next request would be parsed from it: the openai client's
        next call after a 404 got a 400, and a body holding a request ran it."""
        if not self._body_read and (self.headers.get("Content-Length", "0").strip() != "0"
                                    or "Transfer-Encoding" in self.headers):
            self.close_connection = True

    def _authorize(self) -> None:
        key = self.app.options.api_key
        if not key:
            return
        scheme, _, given = self.headers.get("Authorization", "").strip().partition(" ")
        # The scheme is case-insensitive (RFC 7235): "bearer KEY" is as good as "Bearer KEY".
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            # OpenAI's own 401: type invalid_request_error, code invalid_api_key (the openai
            # package raises AuthenticationError by the status; clients that read the body
            # for its type found "authentication_error", which OpenAI never sends)
            raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')", code="invalid_api_key")

    def handle_expect_100(self) -> bool:
        """http.server answers `Expect: 100-continue` as it parses the headers, before the
        key and size checks: a client refused with a 401 or 413 had sent its body anyway.
        The 100 goes out when the body is about to be read (`_body`)."""
        return True

    def _continue(self) -> None:
        if self.headers.get("Expect", "").strip().lower() == "100-continue" and self.request_version >= "HTTP/1.1":
            self.wfile.write(f"{self.protocol_version} 100 Continue\r\n\r\n".encode())
            self.wfile.flush()

    def _body(self) -> dict:
        encoding = self.headers.get("Transfer-Encoding")
        if encoding is not None:
            if encoding.strip().lower() != "chunked" or "Content-Length" in self.headers:
                raise ApiError(400, f"Transfer-Encoding {encoding!r}: only chunked, without a Content-Length, is read")
            self._continue()
            self._body_read = True  # whatever happens next, the connection's framing is ours no more
            return parse_json(self._read_chunked())
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise ApiError(411, "send the body with a Content-Length header or chunked")
        if len(set(v.strip() for v in lengths)) > 1:
            raise ApiError(400, "conflicting Content-Length headers")
        # Digits only (RFC 9110 8.6), as a chunk's size: int() also took "+33" and "3_3",
        # which a proxy in front may read otherwise (a request smuggled past it).
        if not _CONTENT_LENGTH.fullmatch(lengths[0].strip()):
            self.close_connection = True  # where this body ends is not known
            raise ApiError(400, "bad Content-Length")
        digits = lengths[0].strip().lstrip("0") or "0"
        n = int(digits) if len(digits) <= 18 else MAX_BODY_BYTES + 1  # (int() refuses 4,301 digits)
        if n > MAX_BODY_BYTES:
            raise ApiError(413, f"request body over {MAX_BODY_BYTES // 2**20} MiB")
        self._continue()
        data = self.rfile.read(n)
        self._body_read = True
        if len(data) < n:  # the client closed its side early: a cut request is not run
            self.close_connection = True
            raise ApiError(400, f"the body ended after {len(data):,} of its {n:,} bytes (Content-Length)")
        return parse_json(data)

    def _read_chunked(self) -> bytes:
        """A body sent with `Transfer-Encoding: chunked` (clients streaming it from a
        generator): hex-sized chunks up to a zero one, then trailers to a blank line."""
        data = bytearray()
        while True:
            line = self.rfile.readline(1024)
            size_text = line.split(b";", 1)[0].strip()
            # Hex digits only (RFC 9112): int() would also take "0x5", "+5" and "1_0", which a
            # proxy in front may read otherwise (a request smuggled past it).
            if not _CHUNK_SIZE.fullmatch(size_text):
                self.close_connection = True
                raise ApiError(400, "bad chunk size in a chunked body")
            size = int(size_text, 16)
            if len(data) + size > MAX_BODY_BYTES:
                self.close_connection = True  # the rest of the body is left unread
                raise ApiError(413, f"request body over {MAX_BODY_BYTES // 2**20} MiB")
            if size == 0:
                break
            chunk = self.rfile.read(size)
            if len(chunk) < size or self.rfile.read(2) != b"\r\n":
                self.close_connection = True
                raise ApiError(400, "a chunked body ended inside a chunk")
            data += chunk
        for _ in range(100):  # trailers, then the blank line that ends the body
            line = self.rfile.readline(8192)
            if line in (b"\r\n", b"\n", b""):
                break
        else:
            self.close_connection = True
        return bytes(data)

    # -- generation -----------------------------------------------------------------

    def _generate(self, kind: str, body: dict) -> None:
        app = self.app
        req = parse_generation(
            kind, body, served=app.options.model_id, window=app.runner.context_window,
            vocab_size=app.runner.vocab_size, max_chars=app.runner.max_prompt_chars, default_max=app.options.default_max_tokens,
            encode_chat=app.runner.encode_chat, encode_text=app.runner.encode_text,
            message_tokens=app.runner.message_tokens, bos_id=app.runner.bos_id,
        )
        choices = Choices(req.prompts, req.params)
        self._looked = started = time.monotonic()
        self._input_ended = False  # the client's end of input seen (`_client_gone`)
        self._first_text_at = None
        reply = Reply(kind, app.options.model_id, include_usage=req.include_usage)
        app.scheduler.submit(*choices.jobs)  # together: they batch
        try:
            if req.stream:
                self._stream(choices, reply, req.include_usage)
            else:
                self._complete(choices, reply)
        finally:
            choices.cancel()  # no-op when finished; frees the engine's work when the client left
            if app.options.verbose:
                self._log_generation(kind, choices, started)

    def _log_generation(self, kind: str, choices: Choices, started: float) -> None:
        """--verbose: one line per generation when it ends (http.server's own line comes
        when the headers go, before a stream's first token): its tokens and times."""
        first = f"{self._first_text_at - started:.2f}s" if self._first_text_at is not None else "-"
        several = f"{len(choices.jobs)} prompts, " if len(choices.jobs) > 1 else ""
        cached = f" ({choices.cached_tokens} read from the prompt cache)" if choices.cached_tokens else ""
        outcomes = dict.fromkeys(job.outcome or ("client gone" if job.cancelled.is_set() else "unfinished")
                                 for job in choices.jobs)
        sys.stderr.write(f"{time.strftime('%H:%M:%S')} {self.address_string()} {kind}: {several}"
                         f"{choices.prompt_tokens} prompt tokens{cached}, {choices.completion_tokens} out, first token {first}, "
                         f"total {time.monotonic() - started:.2f}s, {'/'.join(outcomes)}\n")

    def _next_event(self, choices: Choices) -> tuple[int, str, str]:
        """The next event of any of the choices, with its index; the client's leaving
        cancels them meanwhile (a request that streams nothing, or waits through a long
        prefill, is otherwise only found gone when its answer is written: its tokens, and
        the retries of a client that timed out, held the engine). Looked at every POLL_S,
        also while tokens keep coming."""
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while True:
            now = time.monotonic()
            if now - self._looked >= POLL_S:
                self._looked = now
                if self._client_gone():
                    choices.cancel()
                    raise ConnectionAbortedError("the client closed the connection")
            try:
                event = choices.events.get(timeout=min(POLL_S, max(0.0, deadline - now)))
                if event[1] == "text" and self._first_text_at is None:
                    self._first_text_at = time.monotonic()
                return event
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return (0, "error", f"no output from the engine within {EVENT_TIMEOUT_S:.0f}s")

    def _client_gone(self) -> bool:
        """The peer closed the connection: it reset it, or it closed both ways. An end of
        its input alone (a peek reads no byte) is also what a client that half-closed
        after its request sends (curl's and netcat's way to say the request is complete),
        and that client still reads: it was taken for gone and answered nothing. The two
        are told apart by writing to it (`_probe`): a closed socket answers with a reset,
        seen at the next look. (poll, not select: select fails past fd 1024; and a recv
        on this socket, which has a timeout, would first wait for a byte.)"""
        try:
            poller = select.poll()
            poller.register(self.connection, select.POLLIN)
            events = poller.poll(0)
            if not events:
                return False
            if events[0][1] & (select.POLLHUP | select.POLLERR):  # reset, or our probe refused
                return True
            if self._input_ended or self.connection.recv(1, socket.MSG_PEEK) != b"":
                return False  # probed already, or a pipelined request's bytes
            self._input_ended = True
            self.close_connection = True  # no next request can come on it
            self._probe()
            return False
        except OSError:  # reset by the peer
            return True

    def _probe(self) -> None:
        """Write what a client reading the answer skips, so that a peer closed both ways
        answers it with a reset (`_client_gone`): in a stream an SSE comment; before a
        whole answer an interim response, which RFC 9110 (15.2) has HTTP/1.1 clients
        parse and skip. An HTTP/1.0 client may be sent none: its answer is run to the end."""
        if self._sent_headers:
            self._write(b":\n\n")
        elif self.request_version >= "HTTP/1.1":
            self._write(f"{self.protocol_version} 100 Continue\r\n\r\n".encode())

    def _complete(self, choices: Choices, reply: Reply) -> None:
        """Every choice's whole text; one that fails fails the answer (a 200 holds no error)."""
        parts: list[list[str]] = [[] for _ in choices.jobs]
        finishes: list[str | None] = [None] * len(choices.jobs)
        while None in finishes:
            index, kind, value = self._next_event(choices)
            if kind == "text":
                parts[index].append(value)
            elif kind == "error":
                busy = "memory" in value.lower() or value == SHUTTING_DOWN
                raise ApiError(503 if busy else 500, value, type="server_error")
            else:
                finishes[index] = value
        answers = [("".join(p), finish) for p, finish in zip(parts, finishes)]
        self._json(200, reply.full(answers, choices.usage()))

    def _stream(self, choices: Choices, reply: Reply, include_usage: bool) -> None:
        """Each choice's chunks as they come, marked with its index; one [DONE] once every
        choice has finished."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the stream ends when the connection does
        self._cors_headers()
        self.end_headers()
        self._sent_headers = True
        self.close_connection = True
        for index in range(len(choices.jobs)):
            self._event(reply.chunk("", first=True, index=index))
        left = len(choices.jobs)
        while left:
            index, kind, value = self._next_event(choices)
            if kind == "text":
                self._event(reply.chunk(value, index=index))
            elif kind == "error":
                # Headers are out: report in-band, the way vLLM does, and end the stream.
                # No [DONE] after it (docs/remote-backends.md): a client that reads until
                # [DONE] and skips error events must not take a cut answer for a whole one.
                self._event({"error": ApiError(500, value, type="server_error").body()["error"]})
                return
            else:
                self._event(reply.chunk("", finish=value, index=index))
                left -= 1
        if include_usage:
            self._event(reply.usage_chunk(choices.usage()))
        self._write(b"data: [DONE]\n\n")

    def _event(self, payload: dict) -> None:
        self._write(b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n")

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    # -- plain responses -------------------------------------------------------------

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        if status == 405:  # what the route takes (RFC 9110 asks for it)
            self.send_header("Allow", "POST" if self._route() in POST_ROUTES else "GET, HEAD")
        if self.close_connection:
            self.send_header("Connection", "close")
        self._cors_headers()  # errors too: a page's script reads a 401's message only with them
        self.end_headers()
        self._sent_headers = True
        if self.command != "HEAD":  # a HEAD response has headers only
            self._write(data)

    def _error(self, e: ApiError) -> None:
        if self.app.options.verbose:  # why, beside http.server's line with the status alone
            self.log_message("%s %s: %s", self.command, self.path.split("?", 1)[0], e.message)
        if self._sent_headers:
            return  # mid-stream: the in-band error (or the cut) is all the client can get
        try:
            self._json(e.status, e.body())
        except DISCONNECTS:
            self.close_connection = True

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        if self.app.options.verbose:
            # Escaped: a request line is the client's, and a terminal runs what it holds.
            sys.stderr.write(f"{self.address_string()} {(format % args).translate(_CONTROL_ESCAPES)}\n")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, headers too large, an
        unsupported version) in the API's JSON error shape, not an HTML page."""
        # A request line too broken to carry a version is answered as HTTP/1.x all the
        # same: http.server's HTTP/0.9 reply is a bare body no client parses.
        if self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.0"
        try:
            self.log_error("code %d, message %s", code, message)
            error = ApiError(code, message or self.responses.get(code, ("error",))[0])
            data = json.dumps(error.body(), ensure_ascii=False).encode()
            self.send_response(code, message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            if self.command != "HEAD" and code >= 200 and code not in (204, 304):
                self.wfile.write(data)
        except DISCONNECTS:
            self.close_connection = True


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_CONTENT_LENGTH = re.compile(r"[0-9]+")
# Control characters as \xNN in the log (what newer Pythons' http.server does itself).
_CONTROL_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)}


def _no_route(path: str) -> ApiError:
    """An unknown path, as OpenAI says it: a 404 of type invalid_request_error, no code."""
    return ApiError(404, f"no route {path.split('?', 1)[0]}")


def _origin_refused(origin: str) -> ApiError:
    hint = (f"start ktcli serve with --cors-origin {origin}" if origin.lower() != "null"
            else "a page opened from a file sends Origin null; serve it over http, or use --cors-origin '*'")
    return ApiError(403, f"the origin {origin} may not call this server from a browser: {hint}", type="permission_error")


POST_ROUTES = ("/chat/completions", "/completions", "/tokenize")


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a client stuck mid-stream must not keep the process alive
    allow_reuse_address = True
    request_queue_size = 64

    def handle_error(self, request, client_address) -> None:
        """What escapes a connection's handler outside our guard (reading the request line):
        a client that reset its connection is not news (socketserver printed a 15-line
        traceback for each, as port scanners and health checks do); anything else is one
        line."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # DISCONNECTS and the socket's other failures
            return
        sys.stderr.write(f"! connection from {client_address[0]}: {type(error).__name__}: {error}\n")


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(app: ServeApp) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"app": app})
    host = app.options.host.strip("[]")
    return (_Server6 if ":" in host else _Server)((host, app.options.port), handler)
