"""HTTP for the OpenAI-compatible backend: JSON calls with retries, and SSE streams.

Standard library only (http.client): the client must stay light, and it needs control
that high-level clients hide, i.e. which failures are safe to retry (nothing has been
received yet) and which are not (the answer was already half streamed).
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

from ktcli.config import NEEDS_BASE_URL
from ktcli.errors import BackendError, UsageError

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
# A failure of these kinds before any byte of the answer arrived is safe to retry.
RESET_ERRORS = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, http.client.RemoteDisconnected)
# A refused connection is retried only briefly: a server that is not there rarely appears.
REFUSED_ATTEMPTS = 3
# A connection takes milliseconds on a LAN and a second across the world: a host that
# drops the packets (a firewall, a wrong address) is said after this, not after the
# request timeout, which is there for a long prompt's prefill (600 s by default).
CONNECT_TIMEOUT_S = 10.0


class ServerUnreachableError(BackendError):
    """No connection could be made to the server."""


class AuthError(BackendError):
    """The server refused the API key (401/403)."""


class ServerStatusError(BackendError):
    """The server answered with an HTTP error status (after any retries)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class StreamCutOffError(BackendError):
    """The server stopped mid-answer. `partial` is the text received before the cut;
    `reason`, why it stopped, without what was kept (the message may add that)."""

    def __init__(self, message: str, partial: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.partial = partial
        self.reason = reason or message


class StreamTimeoutError(StreamCutOffError):
    """The answer ran out of time (the request timeout, or a read that waited too long):
    asking again would spend the same time again, and the server would do the work twice."""


@dataclass(frozen=True)
class Endpoint:
    """Where the server is. `prefix` is the path of the OpenAI API ("/v1", or deeper
    behind a proxy); `root` is the path beside it, where vLLM and llama.cpp keep /tokenize."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, base_url: str) -> "Endpoint":
        if not base_url:
            raise UsageError(NEEDS_BASE_URL)
        try:
            parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        except ValueError as e:  # "http://[::1": "Invalid IPv6 URL" was an internal error
            raise UsageError(f"--base-url {base_url!r}: not a URL ({e})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--base-url {base_url!r}: give an http:// or https:// URL")
        path = parts.path.rstrip("/")
        # Users copy both forms from server docs: ".../v1" and the bare host.
        prefix = path if path.endswith("/v1") else f"{path}/v1"
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise UsageError(f"--base-url {base_url!r}: bad port") from None
        return cls(parts.scheme, parts.hostname, port, prefix)

    @property
    def root(self) -> str:
        return self.prefix[: -len("/v1")]

    @property
    def display(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address, as a URL writes it
        return f"{self.scheme}://{host}:{self.port}{self.prefix}"


def error_message(body: bytes) -> str:
    """The human part of an error body, whichever server shape it has."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or err.get("msg")
            if msg:
                return str(msg)[:300]
        elif isinstance(err, str):
            return err[:300]
        if "detail" in data:
            return str(data["detail"])[:300]
    return text[:300]


class HttpClient:
    def __init__(self, base_url: str, api_key: str = "", *, timeout_s: float = 600.0,
                 read_timeout_s: float | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 max_attempts: int = 6, backoff_s: float = 0.5, max_backoff_s: float = 8.0) -> None:
        self.endpoint = Endpoint.parse(base_url)
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        # A long prompt's prefill can keep a server silent for minutes before its first
        # token: by default only the total budget bounds a wait, not a shorter idle limit.
        self.read_timeout_s = read_timeout_s or timeout_s
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.retries = 0  # total over this client's life, for figures and tests

    # -- public ---------------------------------------------------------------------

    def get_json(self, path: str, *, root: bool = False, timeout_s: float | None = None) -> dict:
        """`timeout_s`: a shorter wait than the request timeout, for a call any working
        server answers at once (a probe)."""
        return self._json("GET", self._path(path, root), None, timeout_s)

    def post_json(self, path: str, body: dict, *, root: bool = False) -> dict:
        """`root`: the path is beside the API prefix (vLLM's /tokenize), not under it."""
        return self._json("POST", self._path(path, root), body)

    def post_stream(self, path: str, body: dict, deadline: float | None = None) -> Iterator[dict]:
        """Server-sent events of a streaming call, parsed. Ends at `data: [DONE]`; a
        stream that ends or breaks before it raises StreamCutOffError (partial="").
        `deadline` (time.monotonic()): the caller's, shared by its retries; else the
        request timeout from now."""
        deadline = time.monotonic() + self.timeout_s if deadline is None else deadline
        conn, resp = self._open("POST", self._path(path), body, deadline)
        try:
            kind = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
            if kind in ("text/html", "text/plain", "application/xml", "text/xml"):
                # a proxy's or web server's page, not an event stream: say so, not "closed early"
                raise ServerStatusError(f"the server at {self.endpoint.display} answered {kind}, not an "
                                        "OpenAI-compatible event stream: is --base-url right?", resp.status)
            yield from _sse_events(conn, resp, deadline, self.timeout_s, self.read_timeout_s)
        finally:
            conn.close()

    def url(self, path: str) -> str:
        return f"{self.endpoint.scheme}://{self.endpoint.host}:{self.endpoint.port}{self._path(path)}"

    # -- plumbing -------------------------------------------------------------------

    def _path(self, path: str, root: bool = False) -> str:
        return (self.endpoint.root if root else self.endpoint.prefix) + path

    def _json(self, method: str, path: str, body: dict | None, timeout_s: float | None = None) -> dict:
        deadline = time.monotonic() + min(self.timeout_s, timeout_s or self.timeout_s)
        conn, resp = self._open(method, path, body, deadline)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise BackendError(f"server at {self.endpoint.display} broke off its response: {_reason(e)}") from None
        finally:
            conn.close()
        try:
            data = json.loads(raw)
        except ValueError:
            raise BackendError(f"server at {self.endpoint.display} sent a response that is not JSON: {raw[:120]!r}") from None
        if not isinstance(data, dict):
            raise BackendError(f"server at {self.endpoint.display} sent unexpected JSON ({type(data).__name__})")
        return data

    def _headers(self, body: bytes | None) -> dict[str, str]:
        headers = {"Accept": "application/json, text/event-stream", "User-Agent": "ktcli"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.endpoint.scheme == "https" else http.client.HTTPConnection
        return cls(self.endpoint.host, self.endpoint.port, timeout=timeout)

    def _open(self, method: str, path: str, body: dict | None, deadline: float):
        """Send one request, retrying what is safe to retry, until a 200 or the deadline."""
        payload = json.dumps(body).encode() if body is not None else None
        refused = 0
        for attempt in range(self.max_attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            conn = self._connection(min(self.connect_timeout_s, remaining))
            try:
                self._connect(conn, deadline)
                conn.request(method, path, body=payload, headers=self._headers(payload))
                resp = conn.getresponse()
            except ConnectionRefusedError:
                conn.close()
                refused += 1
                if refused >= REFUSED_ATTEMPTS or attempt + 1 >= self.max_attempts:
                    raise ServerUnreachableError(
                        f"cannot reach the server at {self.endpoint.display}: connection refused (is it running?)"
                    ) from None
                self._sleep(attempt, None, deadline)
                continue
            except socket.gaierror as e:
                conn.close()
                raise ServerUnreachableError(f"cannot reach the server at {self.endpoint.display}: {e.strerror or e}") from None
            except _ConnectTimedOut:
                conn.close()
                raise ServerUnreachableError(
                    f"cannot reach the server at {self.endpoint.display}: no connection within "
                    f"{_seconds(min(self.connect_timeout_s, remaining))} (is the address right, and the port open?)"
                ) from None
            except TimeoutError:
                conn.close()
                raise ServerUnreachableError(
                    f"the server at {self.endpoint.display} accepted the connection but did not answer within "
                    f"{_seconds(min(self.read_timeout_s, remaining))} ({method} {path})"
                ) from None
            except RESET_ERRORS:
                conn.close()
                self._sleep(attempt, None, deadline)
                continue
            except OSError as e:
                conn.close()
                raise ServerUnreachableError(f"cannot reach the server at {self.endpoint.display}: {_reason(e)}") from None
            if resp.status == 200:
                return conn, resp
            status, retry_after, raw = resp.status, resp.getheader("Retry-After"), _read_quietly(resp)
            conn.close()
            if status in RETRY_STATUS and attempt + 1 < self.max_attempts and self._sleep(attempt, retry_after, deadline):
                continue
            raise self._status_error(status, raw, path)
        raise BackendError(
            f"the server at {self.endpoint.display} did not give an answer after {self.max_attempts} attempts "
            f"within {self.timeout_s:.0f}s (connection resets or overload)"
        )

    def _connect(self, conn: http.client.HTTPConnection, deadline: float) -> None:
        """Connect within the connect timeout, then leave the response the longer wait (up
        to the deadline, as it stands once connected): a prefill may keep a working server
        silent for minutes, a connection never takes that long."""
        try:
            conn.connect()
        except TimeoutError:
            raise _ConnectTimedOut from None
        conn.sock.settimeout(max(0.001, min(self.read_timeout_s, deadline - time.monotonic())))

    def _sleep(self, attempt: int, retry_after: str | None, deadline: float) -> bool:
        """Back off before the next attempt; False when the deadline leaves no room."""
        wait = min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.75 + 0.5 * random.random())
        if retry_after:
            try:
                wait = max(wait, min(float(retry_after), self.max_backoff_s))
            except ValueError:
                pass
        if time.monotonic() + wait >= deadline:
            return False
        self.retries += 1
        time.sleep(wait)
        return True

    def _status_error(self, status: int, raw: bytes, path: str) -> BackendError:
        where = self.endpoint.display
        msg = error_message(raw) or http.client.responses.get(status, "")
        if status in (401, 403):
            return AuthError(
                f"the server at {where} refused the API key (HTTP {status}): set --api-key, KTCLI_API_KEY or OPENAI_API_KEY"
            )
        if status == 404 and "model" in msg.lower():
            return ServerStatusError(f"the server at {where} does not know that model: {msg}", status)
        if status == 404:
            return ServerStatusError(f"the server at {where} has no {path} (HTTP 404): is --base-url right?", status)
        return ServerStatusError(f"the server at {where} answered HTTP {status}: {msg}", status)


class _ConnectTimedOut(Exception):
    """No connection within the connect timeout (told apart from a response's wait)."""


def _seconds(s: float) -> str:
    return f"{round(s, 1):g}s"


def _read_quietly(resp: http.client.HTTPResponse) -> bytes:
    try:
        return resp.read()
    except (OSError, http.client.HTTPException):
        return b""


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _sse_events(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, deadline: float,
                timeout_s: float, read_timeout_s: float) -> Iterator[dict]:
    data: list[str] = []
    answered = False  # any event yet
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StreamTimeoutError(f"the answer took longer than the {timeout_s:.0f}s request timeout")
        if conn.sock is not None:
            conn.sock.settimeout(min(left, read_timeout_s))  # the total budget bounds every wait
        try:
            raw = resp.readline()
        except TimeoutError:
            if deadline - time.monotonic() <= 0.05:
                raise StreamTimeoutError(f"the answer took longer than the {timeout_s:.0f}s request timeout") from None
            what = "stopped sending mid-answer" if answered else "sent no answer"
            raise StreamTimeoutError(f"the server {what} for {round(min(left, read_timeout_s), 1):g}s (read timed out)") from None
        except (OSError, http.client.HTTPException) as e:
            raise StreamCutOffError(f"the connection broke mid-reply ({_reason(e)})") from None
        if not raw:
            raise StreamCutOffError("the server closed the stream before its reply was complete")
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            continue
        if line or not data:
            continue  # comments (": ping"), event:/id: fields, or keep-alive blank lines
        payload, data = "\n".join(data), []
        if payload.strip() == "[DONE]":
            return
        try:
            event = json.loads(payload)
        except ValueError:
            raise StreamCutOffError(f"the server sent a malformed event: {payload[:80]!r}") from None
        if isinstance(event, dict) and event.get("error"):
            raise StreamCutOffError(f"the server reported an error mid-reply: {error_message(payload.encode())}")
        if isinstance(event, dict):
            answered = True
            yield event
