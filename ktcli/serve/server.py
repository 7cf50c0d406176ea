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
import socket
import sys
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ktcli.engine.batching import Job, Runner
from ktcli.errors import UsageError
from ktcli.serve.protocol import MAX_BODY_BYTES, ApiError, Reply, parse_generation, parse_json, parse_messages, usage
from ktcli.serve.scheduler import Scheduler

DISCONNECTS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)
EVENT_TIMEOUT_S = 900.0  # longest wait for the engine's next event before giving up on a request


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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str) -> None:
    """Anything reachable from other machines must demand a key."""
    if not is_loopback(host) and not api_key:
        raise UsageError(f"--host {host} is reachable from other machines: give --api-key (or KTCLI_API_KEY) too")


class ServeApp:
    """What the handlers share: the engine's runner, the scheduler and the options."""

    def __init__(self, runner: Runner, options: ServeOptions) -> None:
        self.runner, self.options = runner, options
        self.scheduler = Scheduler(runner, gather_s=options.gather_ms / 1000, max_batch=options.max_batch)
        self.started = time.time()

    def models(self) -> dict:
        window = self.runner.context_window
        return {"object": "list", "data": [{
            "id": self.options.model_id, "object": "model", "created": int(self.started), "owned_by": "ktcli",
            "max_model_len": window, "context_window": window, "engine": self.runner.name,
        }]}

    def health(self) -> dict:
        return {"status": "ok", "model": self.options.model_id, "engine": self.runner.name,
                "queued": self.scheduler.queued, **self.scheduler.stats.as_dict()}

    def tokenize(self, body: dict) -> dict:
        """vLLM's /tokenize: a prompt's tokens, or a chat's with the template applied."""
        if "messages" in body:
            ids = self.runner.encode_chat(parse_messages(body))
        else:
            text = body.get("prompt", body.get("content"))
            if not isinstance(text, str):
                raise ApiError(400, "'prompt' must be a string (or give 'messages')", param="prompt")
            ids = self.runner.encode_text(text, special=bool(body.get("add_special_tokens", False)))
        return {"count": len(ids), "tokens": ids, "max_model_len": self.runner.context_window}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ktcli-serve"
    app: ServeApp  # set on the subclass made by make_server

    # -- routing --------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._guarded(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._guarded(self._post)

    def do_PUT(self) -> None:  # noqa: N802
        self._guarded(self._not_allowed)

    do_DELETE = do_PATCH = do_PUT

    def _get(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            self._json(200, self.app.models())
        elif path == f"/v1/models/{self.app.options.model_id}":
            self._json(200, self.app.models()["data"][0])
        elif path in ("/health", "/v1/health"):
            self._json(200, self.app.health())
        elif path in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
            self._not_allowed()
        else:
            raise ApiError(404, f"no route {path}", type="not_found_error")

    def _post(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        routes = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
        if path in routes:
            self._generate(routes[path], self._body())
        elif path in ("/tokenize", "/v1/tokenize"):
            self._json(200, self.app.tokenize(self._body()))
        elif path in ("/v1/models", "/health"):
            self._not_allowed()
        else:
            raise ApiError(404, f"no route {path}", type="not_found_error")

    def _not_allowed(self) -> None:
        raise ApiError(405, f"{self.command} is not allowed on {self.path}")

    # -- guard, auth, body ----------------------------------------------------------

    def _guarded(self, route) -> None:
        self._sent_headers = False
        try:
            self._authorize()
            route()
        except ApiError as e:
            self._error(e)
        except DISCONNECTS:
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - one bad request must not take the server down
            self._error(ApiError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"))

    def _authorize(self) -> None:
        key = self.app.options.api_key
        if not key:
            return
        scheme, _, given = self.headers.get("Authorization", "").strip().partition(" ")
        # The scheme is case-insensitive (RFC 7235): "bearer KEY" is as good as "Bearer KEY".
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise ApiError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                           type="authentication_error", code="invalid_api_key")

    def _body(self) -> dict:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or length is None:
            raise ApiError(411, "send the body with a Content-Length header")
        try:
            n = int(length)
        except ValueError:
            raise ApiError(400, "bad Content-Length") from None
        if n < 0 or n > MAX_BODY_BYTES:
            self.close_connection = True  # the unread body must not be taken for a next request
            raise ApiError(413, f"request body over {MAX_BODY_BYTES // 2**20} MiB")
        return parse_json(self.rfile.read(n))

    # -- generation -----------------------------------------------------------------

    def _generate(self, kind: str, body: dict) -> None:
        app = self.app
        req = parse_generation(
            kind, body, served=app.options.model_id, window=app.runner.context_window,
            vocab_size=app.runner.vocab_size, max_chars=app.runner.max_prompt_chars, default_max=app.options.default_max_tokens,
            encode_chat=app.runner.encode_chat, encode_text=app.runner.encode_text,
        )
        job = Job(req.prompt_ids, req.params)
        reply = Reply(kind, app.options.model_id)
        app.scheduler.submit(job)
        try:
            if req.stream:
                self._stream(job, reply, req.include_usage)
            else:
                self._complete(job, reply)
        finally:
            job.cancel()  # no-op when finished; frees the engine's work when the client left

    def _next_event(self, job: Job) -> tuple[str, str]:
        try:
            return job.events.get(timeout=EVENT_TIMEOUT_S)
        except queue.Empty:
            return ("error", f"no output from the engine within {EVENT_TIMEOUT_S:.0f}s")

    def _complete(self, job: Job, reply: Reply) -> None:
        parts: list[str] = []
        while True:
            kind, value = self._next_event(job)
            if kind == "text":
                parts.append(value)
                continue
            if kind == "error":
                raise ApiError(503 if "memory" in value.lower() else 500, value, type="server_error")
            self._json(200, reply.full("".join(parts), value, usage(len(job.prompt), job.completion_tokens)))
            return

    def _stream(self, job: Job, reply: Reply, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the stream ends when the connection does
        self.end_headers()
        self._sent_headers = True
        self.close_connection = True
        self._event(reply.chunk("", first=True))
        while True:
            kind, value = self._next_event(job)
            if kind == "text":
                self._event(reply.chunk(value))
            elif kind == "error":
                # Headers are out: report in-band, the way vLLM does, and end the stream.
                self._event({"error": ApiError(500, value, type="server_error").body()["error"]})
                return
            else:
                self._event(reply.chunk("", finish=value))
                if include_usage:
                    self._event(reply.usage_chunk(usage(len(job.prompt), job.completion_tokens)))
                self._write(b"data: [DONE]\n\n")
                return

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
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self._sent_headers = True
        self._write(data)

    def _error(self, e: ApiError) -> None:
        if self._sent_headers:
            return  # mid-stream: the in-band error (or the cut) is all the client can get
        try:
            self._json(e.status, e.body())
        except DISCONNECTS:
            self.close_connection = True

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        if self.app.options.verbose:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a client stuck mid-stream must not keep the process alive
    allow_reuse_address = True
    request_queue_size = 64


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(app: ServeApp) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"app": app})
    host = app.options.host.strip("[]")
    return (_Server6 if ":" in host else _Server)((host, app.options.port), handler)
