"""A scripted OpenAI-compatible server on loopback, for the failure cases a real server
will not produce on demand: 429s, 5xx, connection resets, streams cut mid-answer."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = ["The ", "answer ", "is ", "42."]


class FakeOpenAI:
    """`script` is consumed one entry per chat/completions call; when it runs out, "ok".
    Entries: "ok", "429", "500", "503", "reset", "cut" (two chunks then close), "cut0"
    (the stream closes before its first chunk), "stall" (headers, then 2 s of silence),
    "error_event" (an in-band error), "slow" (sleeps 2 s before answering), "html" (a web
    page with status 200, as a proxy's login page), "whole" (the answer and a line break in
    one event, as some servers stream)."""

    def __init__(self, *, script: list[str] | None = None, models: list[dict] | None = None,
                 tokenize: bool = True, key: str | None = None, models_status: int = 200) -> None:
        self.script = list(script or [])
        self.models = models if models is not None else [{"id": "fake-model", "object": "model", "max_model_len": 4096}]
        self.tokenize = tokenize
        self.key = key
        self.models_status = models_status
        self.calls: list[tuple[str, dict]] = []
        self.headers: list[dict] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()
        handler = type("H", (_Handler,), {"fake": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeOpenAI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def next_action(self) -> str:
        with self._lock:
            return self.script.pop(0) if self.script else "ok"

    @property
    def chat_calls(self) -> int:
        return sum(1 for path, _ in self.calls if path.endswith("/chat/completions"))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeOpenAI

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.fake.key and self.headers.get("Authorization") != f"Bearer {self.fake.key}":
            self._send(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802
        self.fake.headers.append(dict(self.headers))
        if not self._authorized():
            return
        if self.path == "/v1/models" and self.fake.models_status == 200:
            self._send(200, {"object": "list", "data": self.fake.models})
        else:
            self._send(404, {"error": {"message": "Not Found"}})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.fake.calls.append((self.path, body))
        self.fake.headers.append(dict(self.headers))
        if not self._authorized():
            return
        if self.path == "/tokenize":
            if not self.fake.tokenize:
                return self._send(404, {"detail": "Not Found"})
            if "messages" in body:
                words = sum(len(m["content"].split()) for m in body["messages"]) + 10
            else:
                if len(body["prompt"]) > 4096:  # as ktcli serve sizes a prompt to its window
                    return self._send(400, {"error": {"message": "the prompt is too long for this model's context window",
                                                      "code": "context_length_exceeded"}})
                words = len(body["prompt"].split())
            return self._send(200, {"count": words, "tokens": list(range(words)), "max_model_len": 4096})
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": {"message": "Not Found"}})
        model = body.get("model")
        if model not in {m["id"] for m in self.fake.models} and self.fake.models:
            return self._send(404, {"error": {"message": f"The model `{model}` does not exist.", "code": "model_not_found"}})
        with self.fake._lock:
            self.fake.active += 1
            self.fake.max_active = max(self.fake.max_active, self.fake.active)
        try:
            self._answer(body, self.fake.next_action())
        finally:
            with self.fake._lock:
                self.fake.active -= 1

    def _answer(self, body: dict, action: str) -> None:
        if action in ("429", "500", "503"):
            return self._send(int(action), {"error": {"message": f"scripted {action}"}}, {"Retry-After": "0"})
        if action == "reset":
            # SO_LINGER 0: close with a TCP reset, as a crashing proxy would.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if action == "html":
            page = b"<html><body>Please sign in</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if action == "slow":
            time.sleep(2.0)
        if not body.get("stream"):
            time.sleep(0.2)  # overlap concurrent calls, so batching clients show it
            return self._send(200, {"id": "x", "object": "chat.completion", "model": body["model"],
                                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(ANSWER)},
                                                 "finish_reason": "stop"}],
                                    "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if action == "cut0":
            return  # headers, then nothing: cut before the first word
        if action == "stall":
            time.sleep(2.0)  # headers, then silence: a server busy reading a long prompt
            return
        pieces = ANSWER[:2] if action == "cut" else ["".join(ANSWER) + "\n"] if action == "whole" else ANSWER
        for piece in pieces:
            self._event({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
        if action == "cut":
            return  # the connection closes with no [DONE]
        if action == "error_event":
            self._event({"error": {"message": "engine exploded", "type": "server_error"}})
            return
        self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        self._event({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, payload: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()
