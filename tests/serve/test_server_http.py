"""The server's HTTP layer and scheduler in-process, over a fake runner (no model):
validation, auth, SSE shape, disconnects, batching of concurrent requests."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from ktcli.engine.backend import SamplingParams
from ktcli.engine.batching import Job, _Stream, sampling_key
from ktcli.errors import UsageError
from ktcli.serve.scheduler import Scheduler
from ktcli.serve.server import ServeApp, ServeOptions, check_exposure, make_server
from tests.serve.helpers import request

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()


class FakeTokenizer:
    """One token per word; the chat template adds 3 tokens per message and 2 at the end."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [len(w) for w in text.split()]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [0] * sum(3 + len(m["content"].split()) for m in messages) + [0, 0]

    def decode(self, ids, skip_special_tokens=True) -> str:
        return "".join(WORDS[i % len(WORDS)] + " " for i in ids)


class FakeRunner:
    name = "fake"
    context_window = 64
    vocab_size = 100
    max_prompt_chars = 64 * 12
    message_tokens = 3  # as FakeTokenizer's template counts a message
    max_batch = 8

    def __init__(self, step_s: float = 0.01, bos_id: int | None = None) -> None:
        self.tokenizer = FakeTokenizer()
        self.step_s = step_s
        self.bos_id = bos_id
        self.batches: list[int] = []
        self.prompts: list[list[int]] = []
        self.steps: list[int] = []  # the steps each run took: a cancelled run stops early

    def encode_chat(self, messages, template_kwargs=None) -> list[int]:
        self.template_kwargs = template_kwargs
        return self.tokenizer.apply_chat_template(messages)

    def encode_text(self, text: str, special: bool = False) -> list[int]:
        return self.tokenizer.encode(text)

    def run(self, jobs: list[Job], join=None) -> None:  # joins nothing, as HFRunner
        self.batches.append(len(jobs))
        self.prompts.extend(j.prompt for j in jobs)
        streams = [_Stream(j, self.tokenizer.decode, self.context_window) for j in jobs]
        done = [False] * len(jobs)
        self.steps.append(0)
        for step in range(max(j.params.max_new_tokens for j in jobs)):
            time.sleep(self.step_s)
            self.steps[-1] += 1
            for i, s in enumerate(streams):
                if not done[i]:
                    done[i] = s.push(step)
            if all(done):
                return
        for i, s in enumerate(streams):
            if not done[i]:
                s.close("stop")


@pytest.fixture
def served(request):
    options = dict(getattr(request, "param", {}))  # a copy: a parametrized case's dict is shared by its runs
    runner = FakeRunner(**options.pop("runner", {}))
    app = ServeApp(runner, ServeOptions(host="127.0.0.1", port=0, model_id="fake", default_max_tokens=5, **options))
    httpd = make_server(app)
    app.scheduler.start()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd.server_address[1], app, runner
    httpd.shutdown()
    httpd.server_close()
    app.scheduler.stop()


def chat(content: str = "say something", **extra) -> dict:
    return {"model": "fake", "messages": [{"role": "user", "content": content}], **extra}


def sse(port: int, path: str, body: dict) -> list[dict | str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    events = []
    for line in resp.read().decode().split("\n\n"):
        if line.startswith("data: "):
            payload = line[6:]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_models_lists_the_window(served):
    port, _, _ = served
    status, body = request(port, "GET", "/v1/models")
    assert status == 200
    assert body["data"][0]["id"] == "fake" and body["data"][0]["max_model_len"] == 64


def test_chat_completion(served):
    port, _, _ = served
    status, body = request(port, "POST", "/v1/chat/completions", chat(max_tokens=3))
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "alpha beta gamma "}
    assert body["choices"][0]["finish_reason"] == "length"
    assert "logprobs" in body["choices"][0] and body["choices"][0]["logprobs"] is None  # OpenAI's shape: the key is there
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                             "prompt_tokens_details": {"cached_tokens": 0}}


def test_default_max_tokens_and_stop_strings(served):
    port, _, _ = served
    _, body = request(port, "POST", "/v1/completions", {"prompt": "one two", "stop": ["gamma"]})
    assert body["choices"][0] == {"index": 0, "text": "alpha beta ", "logprobs": None, "finish_reason": "stop"}
    _, body = request(port, "POST", "/v1/completions", {"prompt": "one two"})
    assert body["usage"]["completion_tokens"] == 5  # the server's default


def test_chat_stream_shape(served):
    port, _, _ = served
    events = sse(port, "/v1/chat/completions", chat(max_tokens=2, stream=True, stream_options={"include_usage": True}))
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2] if e["choices"])
    assert text == "alpha beta "
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 2 and events[-2]["choices"] == []
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])


def test_completion_stream(served):
    port, _, _ = served
    events = sse(port, "/v1/completions", {"prompt": "hi", "max_tokens": 3, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "alpha beta gamma "


def test_tokenize(served):
    port, _, _ = served
    assert request(port, "POST", "/tokenize", {"prompt": "a b c"})[1]["count"] == 3
    assert request(port, "POST", "/tokenize", {"messages": [{"role": "user", "content": "a b"}]})[1]["count"] == 7
    # Sized as a generation's prompt is: a 30 MB prompt held the tokenizer (and the GIL)
    # for 32 s, and 200,000 empty messages took seconds of rendering.
    status, reply = request(port, "POST", "/tokenize", {"prompt": "a " * 1000})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    many = [{"role": "user", "content": "x"}] * 65
    for path, body in (("/tokenize", {"messages": many}), ("/v1/chat/completions", chat(messages=many))):
        status, reply = request(port, "POST", path, body)
        assert status == 400 and "65 messages" in reply["error"]["message"]


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (chat(model="gpt-4"), 404, "does not exist"),
    ({"model": "fake"}, 400, "'messages'"),
    ({"messages": []}, 400, "'messages'"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text parts"),
    (chat(max_tokens=0), 400, "max_tokens"),
    (chat(max_tokens="ten"), 400, "max_tokens"),
    (chat(max_tokens=True), 400, "max_tokens"),
    (chat(temperature=5), 400, "temperature"),
    (chat(top_p=-0.1), 400, "top_p"),
    (chat(n=True), 400, "n=1"),
    (chat(stream=True, stream_options={"include_usage": "no"}), 400, "true or false"),
    (chat(stop=[1]), 400, "stop"),
    (chat(n=2), 400, "n=1"),
    (chat(logprobs=True), 400, "log probabilities"),
    (chat(top_logprobs=3), 400, "log probabilities"),
    (chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tool calls"),
    (chat(stream="yes"), 400, "stream"),
    (chat(response_format={"type": "json_object"}), 400, "only text responses"),
    (chat(frequency_penalty=0.5), 400, "penalties"),
    (chat(logit_bias={"5": 10}), 400, "logit biases"),
    (chat(min_p=0.1), 400, "min-p"),
    (chat(ignore_eos=True), 400, "end of sequence"),
    (chat(stop_token_ids=[2]), 400, "stop token ids"),
    (chat(min_tokens=5), 400, "minimum length"),
    (chat(guided_json={"type": "object"}), 400, "guided decoding"),
    (chat(continue_final_message=True), 400, "continuing the last assistant message"),
    (chat(include_stop_str_in_output=True), 400, "stop string is never included"),
    (chat(use_beam_search=True), 400, "beam search"),
    (chat(prompt_logprobs=1), 400, "log probabilities"),
    (chat(truncate_prompt_tokens=10), 400, "never truncated"),
    (chat(tool_choice="required"), 400, "tool calls"),
    (chat(modalities=["text", "audio"]), 400, "only text"),
    (chat(prediction={"type": "content", "content": "x"}), 400, "predicted outputs"),
    # 30 empty messages cost 90 tokens of template: refused by their count, before rendering
    ({"messages": [{"role": "user", "content": ""}] * 30}, 400, "30 messages are more than"),
    (chat(seed=2**64), 400, "'seed' must be an integer from -9223372036854775808 to"),
    (chat(max_tokens=3.5), 400, "max_tokens"),
    (chat(stream_options={"include_usage": True}), 400, "only allowed with 'stream': true"),
    (chat("bad \ud800 text"), 400, "lone UTF-16 surrogate"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
    (chat(max_tokens=60), 400, "context window"),
    (chat(" ".join(["w"] * 80)), 400, "context window"),
    (chat("w" * 800), 400, "800 characters, more than this model's context window of 64 tokens can hold"),
])
def test_malformed_requests_get_4xx_json(served, body, status, fragment):
    port, _, _ = served
    got, payload = request(port, "POST", "/v1/chat/completions", body)
    assert got == status
    assert fragment in payload["error"]["message"]
    assert request(port, "GET", "/v1/models")[0] == 200  # still serving


def test_fields_that_ask_for_nothing_are_accepted_and_completions_refuse_echo(served):
    port, _, _ = served
    quiet = chat(max_tokens=4, top_p=0, logprobs=False, top_logprobs=0, tools=[], n=1, response_format={"type": "text"},
                 frequency_penalty=0, presence_penalty=0.0, logit_bias={}, temperature=1e-40, tool_choice="none",
                 modalities=["text"], continue_final_message=False, include_stop_str_in_output=False)
    quiet["messages"].append({"role": "assistant", "content": None, "tool_calls": []})  # a turn with no text
    quiet["messages"].append({"role": "user", "content": "go on"})
    assert request(port, "POST", "/v1/chat/completions", quiet)[0] == 200
    # what vLLM takes too: an integral float, a negative seed, the completions API's
    # logprobs 0 ("none"), and an assistant turn's refusal part (the openai SDK sends it back)
    lax = chat(max_tokens=3.0, seed=-1, temperature=0.5, n=1.0)
    lax["messages"][:0] = [{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]}]
    assert request(port, "POST", "/v1/chat/completions", lax)[0] == 200
    assert request(port, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "logprobs": 0})[0] == 200
    got, payload = request(port, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4, "echo": True})
    assert got == 400 and "echoed" in payload["error"]["message"]
    got, payload = request(port, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 4, "logprobs": 1})
    assert got == 400 and "log probabilities" in payload["error"]["message"]
    # local servers' sampler names change the answer too: refused, not ignored
    for name, value in (("repeat_penalty", 1.5), ("typical_p", 0.2), ("mirostat", 2), ("add_generation_prompt", False)):
        got, payload = request(port, "POST", "/v1/chat/completions", chat(max_tokens=2, **{name: value}))
        assert got == 400 and payload["error"]["param"] == name, name
    # as llama.cpp's web UI sends them, every sampler off: nothing asked that is not done
    neutral = dict(repeat_penalty=1.0, repeat_last_n=64, mirostat=0, mirostat_tau=5, mirostat_eta=0.1,
                   dynatemp_range=0, dynatemp_exponent=1, typical_p=1, xtc_probability=0, dry_multiplier=0)
    assert request(port, "POST", "/v1/chat/completions", chat(max_tokens=2, **neutral))[0] == 200


def test_the_window_error_names_the_field_that_asked(served):
    port, _, _ = served
    _, payload = request(port, "POST", "/v1/chat/completions", chat(max_completion_tokens=60))
    assert payload["error"]["code"] == "context_length_exceeded" and payload["error"]["param"] == "max_completion_tokens"


def test_over_window_has_the_openai_code(served):
    port, _, _ = served
    _, payload = request(port, "POST", "/v1/chat/completions", chat(max_tokens=60))
    assert payload["error"]["code"] == "context_length_exceeded"


def test_bad_prompts_and_routes(served):
    port, _, _ = served
    # the absolute form a proxy sends is its path (RFC 9112 3.2.2)
    assert request(port, "GET", f"http://127.0.0.1:{port}/v1/models")[0] == 200
    got, payload = request(port, "POST", "/v1/completions", {"prompt": ""})  # the fake has no BOS token
    assert got == 400 and "no beginning-of-sequence token" in payload["error"]["message"]
    assert request(port, "POST", "/v1/completions", {"prompt": [1, -2]})[0] == 400
    assert request(port, "GET", "/v1/nothing")[0] == 404
    assert request(port, "GET", "/v1/chat/completions")[0] == 405
    assert request(port, "POST", "/v1/completions", {"prompt": [3, 4]})[0] == 200  # token ids are fine
    for prompt in ("w" * 800, ["w" * 800]):  # a batch of one is the same prompt
        got, payload = request(port, "POST", "/v1/completions", {"prompt": prompt})
        assert got == 400 and "800 characters" in payload["error"]["message"], prompt
    got, payload = request(port, "POST", "/v1/completions", {"prompt": [3, 100]})  # the vocabulary is 0-99
    assert got == 400 and "outside this model's vocabulary (0-99)" in payload["error"]["message"]


def test_routes_without_v1_head_and_unknown_models(served):
    port, _, _ = served
    assert request(port, "POST", "/chat/completions", chat(max_tokens=1))[0] == 200  # a base URL without /v1
    status, payload = request(port, "GET", "/v1/models/other")
    assert status == 404 and payload["error"]["code"] == "model_not_found"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    # HEAD is GET without the body (a load balancer's HEAD /health); a method a route does
    # not take is a JSON 405 (not http.server's HTML 501) that names the ones it does.
    for method, path, status, allow in (("HEAD", "/health", 200, None), ("HEAD", "/v1/models", 200, None),
                                        ("OPTIONS", "/v1/models", 405, "GET, HEAD"),
                                        ("HEAD", "/v1/chat/completions", 405, "POST"),
                                        ("DELETE", "/v1/completions", 405, "POST")):
        conn.request(method, path)
        resp = conn.getresponse()
        body = resp.read()
        assert (resp.status, resp.getheader("Allow")) == (status, allow), (method, path)
        assert resp.getheader("Content-Type") == "application/json" and int(resp.getheader("Content-Length")) > 0
        assert body == b"" if method == "HEAD" else json.loads(body)["error"]
    conn.close()
    _, payload = request(port, "POST", "/v1/completions", {"prompt": " ".join(["w"] * 70)})
    assert payload["error"]["param"] == "prompt"


def test_a_refused_request_does_not_leave_its_body_for_the_next(served):
    # A 404 before the body was read left the body on the connection, parsed as the next
    # request: the openai client's next call got a 400; a body holding a request ran it.
    port, _, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for method, path, status in (("POST", "/v1/embeddings", 404), ("PUT", "/v1/models", 405),
                                 ("POST", "/v1/chat/completions", 200)):
        conn.request(method, path, body=json.dumps(chat(max_tokens=1)), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == status, path  # http.client reconnects where the server closed
    conn.close()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nhello")
        reply = s.recv(4096)
        assert b" 404 " in reply.split(b"\r\n")[0] and b"Connection: close" in reply


def test_conflicting_or_negative_lengths(served):
    port, _, _ = served
    # "+2", "0_2", "0x2": int() took the first two, which a proxy in front reads otherwise
    for headers in (b"Content-Length: 2\r\nContent-Length: 3\r\n", b"Content-Length: -1\r\n",
                    b"Content-Length: +2\r\n", b"Content-Length: 0_2\r\n", b"Content-Length: 0x2\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n{}")
            assert b" 400 " in s.recv(4096).split(b"\r\n")[0]


def test_missing_length_and_huge_body(served):
    port, _, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n")
        assert b" 413 " in s.recv(4096).split(b"\r\n")[0]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n")
        assert b" 413 " in s.recv(4096).split(b"\r\n")[0]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 411 " in s.recv(4096).split(b"\r\n")[0]


def _raw(port: int, data: bytes, half_close: bool = False) -> tuple[int, bytes]:
    """(status, body) of one request sent as raw bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        reply = b""
        while b"\r\n\r\n" not in reply and (part := s.recv(65536)):
            reply += part
        head, _, body = reply.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(body) < length and (part := s.recv(65536)):
            body += part
    return int(head.split()[1]), body


def test_a_chunked_body_is_read(served):
    """vLLM and llama.cpp read `Transfer-Encoding: chunked` (a client streaming its body
    from a generator); it was refused with a 411."""
    port, _, _ = served
    body = json.dumps(chat(max_tokens=2)).encode()
    chunked = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + 7]), body[i:i + 7]) for i in range(0, len(body), 7))
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    status, reply = _raw(port, head + chunked + b"0\r\nX-Trailer: 1\r\n\r\n")
    assert status == 200 and json.loads(reply)["choices"][0]["finish_reason"] == "length"
    for size in (b"zz", b"0x2", b"+2", b"-1", b"1_0"):  # hex digits only: int() takes the others
        status, reply = _raw(port, head + size + b"\r\n{}\r\n0\r\n\r\n")
        assert status == 400 and "chunk size" in json.loads(reply)["error"]["message"], size
    status, reply = _raw(port, head + b"10\r\n{}", half_close=True)
    assert status == 400 and "inside a chunk" in json.loads(reply)["error"]["message"]
    gzip = head.replace(b"chunked", b"gzip")
    assert _raw(port, gzip + b"{}")[0] == 400


def test_a_body_shorter_than_its_length_is_not_run(served):
    """A client that half-closed after part of its body had the part run as a request."""
    port, app, runner = served
    data = json.dumps(chat(max_tokens=1)).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (len(data) + 10)
    status, reply = _raw(port, head + data, half_close=True)
    assert status == 400 and "ended after" in json.loads(reply)["error"]["message"]
    assert runner.batches == []


def test_http_servers_own_refusals_are_json(served):
    """A malformed request line and an unsupported HTTP version came back as HTML pages."""
    port, _, _ = served
    for line in (b"GARBAGE\r\n\r\n", b"GET / HTTP/2.0\r\n\r\n"):
        status, reply = _raw(port, line)
        assert status in (400, 505) and json.loads(reply)["error"]["message"], reply


def test_continue_is_sent_only_once_the_request_may_send_its_body(served):
    """http.server answered `Expect: 100-continue` before the key and size checks: a
    refused client uploaded its body all the same."""
    port, _, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                  b"Content-Length: 999999999999\r\n\r\n")
        assert s.recv(4096).split(b"\r\n")[0].split()[1] == b"413"
    data = json.dumps(chat(max_tokens=1)).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data))
        assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(data)
        assert b" 200 " in s.recv(4096).split(b"\r\n")[0]


@pytest.mark.parametrize("served", [{"api_key": "sekrit"}], indirect=True)
def test_every_route_needs_the_key(served):
    port, _, _ = served
    for method, path, body in [("GET", "/v1/models", None),
                               ("POST", "/v1/chat/completions", chat()), ("POST", "/tokenize", {"prompt": "x"})]:
        status, payload = request(port, method, path, body)
        assert status == 401 and payload["error"]["code"] == "invalid_api_key"
        assert request(port, method, path, body, key="wrong")[0] == 401
    # /health is a load balancer's probe, which sends no key: up or not, no more, without one
    assert request(port, "GET", "/health", None) == (200, {"status": "ok"})
    assert request(port, "GET", "/health", None, key="wrong") == (200, {"status": "ok"})
    status, payload = request(port, "GET", "/health", None, key="sekrit")
    assert status == 200 and payload["model"] == "fake" and "queued" in payload
    assert request(port, "POST", "/v1/chat/completions", chat(max_tokens=1), key="sekrit")[0] == 200
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for header, status in (("bearer sekrit", 200), ("BEARER  sekrit", 200), ("Basic sekrit", 401), ("sekrit", 401)):
        conn.request("GET", "/v1/models", headers={"Authorization": header})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == status, header  # the scheme is case-insensitive (RFC 7235)
    conn.close()


@pytest.mark.parametrize("served", [{"api_key": "sekrit"}], indirect=True)
def test_errors_have_the_types_and_codes_openai_sends(served):
    """OpenAI answers an unknown model, an unknown URL and a wrong key with type
    invalid_request_error (codes model_not_found, none, invalid_api_key): ours said
    not_found_error and authentication_error, which no OpenAI client knows."""
    port, _, _ = served
    def error(method, path, body=None, key="sekrit"):
        status, payload = request(port, method, path, body, key=key)
        return status, payload["error"]["type"], payload["error"]["code"]
    assert error("GET", "/v1/models/other") == (404, "invalid_request_error", "model_not_found")
    assert error("POST", "/v1/chat/completions", chat(model="other")) == (404, "invalid_request_error", "model_not_found")
    assert error("GET", "/v1/nowhere") == (404, "invalid_request_error", None)
    assert error("POST", "/v1/nowhere", {}) == (404, "invalid_request_error", None)
    assert error("GET", "/v1/models", key=None) == (401, "invalid_request_error", "invalid_api_key")
    assert error("GET", "/v1/models", key="wrong") == (401, "invalid_request_error", "invalid_api_key")


@pytest.mark.parametrize("served", [{"api_key": "sk-A.b_c~1!$"}], indirect=True)
def test_a_key_outside_printable_ascii_is_refused_at_start(served):
    """`--api-key clé` served, and curl's requests with it got a 401: header values are
    bytes read as latin-1 (curl sends UTF-8, the openai package sends nothing but ASCII)."""
    from ktcli.config import Settings
    from ktcli.serve import run

    for key in ("clé", "ключ", "key\U0001f511", "nul\x00", "del\x7f"):
        with pytest.raises(UsageError, match="printable ASCII"):
            check_exposure("127.0.0.1", key)
    said: list[str] = []
    with pytest.raises(UsageError, match="printable ASCII"):
        run.serve(Settings(), ServeOptions(host="127.0.0.1", port=0, model_id="fake", api_key="clé"), said.append,
                  runner=FakeRunner())
    assert said == []  # refused before serving (and before any model would load)
    port, _, _ = served
    # printable ASCII, punctuation and all, matches over the wire
    assert request(port, "GET", "/v1/models", key="sk-A.b_c~1!$")[0] == 200
    # and what curl sends for `Bearer clé` (UTF-8 bytes) is the JSON 401, not a 500
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer cl\xc3\xa9\r\n"
                  b"Connection: close\r\n\r\n")
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split()[1] == b"401" and json.loads(body)["error"]["code"] == "invalid_api_key"


def test_a_model_id_is_looked_up_as_clients_encode_it():
    """GET /v1/models/<id> compared the raw path: a model served from a folder named
    "my model" was a 404 to every client, which send it as my%20model."""
    app = ServeApp(FakeRunner(), ServeOptions(host="127.0.0.1", port=0, model_id="org/my model+1"))
    httpd = make_server(app)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        port = httpd.server_address[1]
        for path in ("/v1/models/org/my%20model%2B1", "/v1/models/org%2Fmy%20model%2B1"):  # a repo id's slash either way
            status, body = request(port, "GET", path)
            assert status == 200 and body["id"] == "org/my model+1", path
        status, body = request(port, "GET", "/v1/models/my%20other")
        assert status == 404 and "'my other' does not exist" in body["error"]["message"]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_non_loopback_needs_a_key():
    with pytest.raises(UsageError, match="--api-key"):
        check_exposure("0.0.0.0", "")
    for key in ("   ", "key\r", "two words"):  # no client can send it
        with pytest.raises(UsageError, match="spaces or line breaks"):
            check_exposure("0.0.0.0", key)
    check_exposure("0.0.0.0", "k")
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_exposure(host, "")


@pytest.mark.parametrize("served", [{"runner": {"step_s": 0.05}}], indirect=True)
def test_client_disconnect_mid_stream_cancels_and_server_goes_on(served):
    port, app, runner = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        body = json.dumps(chat(max_tokens=50, stream=True)).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        seen = b""
        while b"data: " not in seen:
            seen += s.recv(4096)
    # The job is cancelled at the next token written to the dead socket, long before 50
    # (steps counted, not seconds: a loaded CI machine stretches any time bound).
    status, payload = request(port, "POST", "/v1/chat/completions", chat(max_tokens=2))
    assert status == 200 and payload["usage"]["completion_tokens"] == 2
    assert sum(runner.steps) < 25  # of 50, whether the two ran one after the other or together


@pytest.mark.parametrize("served", [{"runner": {"step_s": 0.05}}], indirect=True)
def test_a_client_gone_before_its_whole_answer_is_cancelled(served):
    # Without streaming nothing is written until the end: the job ran all its tokens for
    # a client that had left (and a client's timeout retries ran beside it). The socket is
    # looked at every 0.25 s, also while tokens keep coming (here one every 50 ms).
    port, app, runner = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        body = json.dumps(chat(max_tokens=50)).encode()  # the fake's window is 64
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.3)
    status, payload = request(port, "POST", "/v1/chat/completions", chat(max_tokens=2))
    assert status == 200 and sum(runner.steps) < 25  # not all 50


def test_usage_says_the_prompt_tokens_read_from_the_prompt_cache(served):
    """OpenAI's (and vLLM's) usage.prompt_tokens_details.cached_tokens: the prompt tokens
    the engine read back instead of prefilling, summed over a request's choices."""
    port, app, runner = served
    plain_run = runner.run

    def run(jobs, join=None):
        for job in jobs:
            job.cached_tokens = 4
        plain_run(jobs, join)

    runner.run = run
    status, body = request(port, "POST", "/v1/chat/completions", chat(max_tokens=2))
    assert status == 200 and body["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    status, body = request(port, "POST", "/v1/completions", {"prompt": ["ab", "cd"], "max_tokens": 2})
    assert status == 200 and body["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    events = sse(port, "/v1/chat/completions", chat(max_tokens=2, stream=True, stream_options={"include_usage": True}))
    assert events[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}


def test_stream_chunks_say_usage_null_until_the_last(served):
    port, _, _ = served
    events = sse(port, "/v1/chat/completions", chat(max_tokens=2, stream=True, stream_options={"include_usage": True}))
    chunks = [e for e in events if isinstance(e, dict)]
    assert all(c["usage"] is None for c in chunks[:-1]) and chunks[-1]["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("served", [{"runner": {"step_s": 0.05}, "gather_ms": 100}], indirect=True)
def test_concurrent_requests_share_a_batch(served):
    port, app, runner = served
    results: list[int] = []

    def go() -> None:
        results.append(request(port, "POST", "/v1/chat/completions", chat(max_tokens=3))[0])

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 6
    assert max(runner.batches) >= 4
    assert request(port, "GET", "/health")[1]["largest_batch"] >= 4


def _job(temp: float = 0.0, n: int = 2) -> Job:
    return Job([1, 2], SamplingParams(max_new_tokens=n, temperature=temp))


def test_scheduler_batches_only_like_sampling():
    runner = FakeRunner()
    sched = Scheduler(runner, gather_s=0.05)
    jobs = [_job(), _job(0.7), _job(), _job(0.7), _job()]
    for j in jobs:
        sched.submit(j)
    sched.start()
    for j in jobs:
        while j.events.get(timeout=5)[0] == "text":
            pass
    sched.stop()
    assert sorted(runner.batches) == [2, 3]


def test_scheduler_figures_count_the_run_in_progress():
    """Under steady load one run of the engine lasts for minutes (requests join it): /health
    said "runs": 0, "busy_s": 0.0 beside "requests": 7 all along, and nothing of the 7
    running ("queued": 0)."""
    release = threading.Event()

    class Held(FakeRunner):
        def run(self, jobs, join=None):
            release.wait(10)
            super().run(jobs)

    sched = Scheduler(Held(), gather_s=0.05)
    jobs = [_job(), _job(), _job()]
    sched.submit(*jobs)
    sched.start()
    deadline = time.monotonic() + 5
    while sched.running < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    stats = sched.stats_dict()
    assert sched.running == 3 and sched.queued == 0
    assert stats["runs"] == 1 and stats["requests"] == 3 and stats["requests_per_run"] == 3.0 and stats["busy_s"] > 0
    release.set()
    for j in jobs:
        while j.events.get(timeout=5)[0] == "text":
            pass
    deadline = time.monotonic() + 5
    while sched.stats_dict()["runs"] != 1 or sched.stats.run_started is not None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert sched.running == 0 and sched.stats_dict()["runs"] == 1
    sched.stop()


def test_scheduler_survives_a_failing_runner():
    class Broken(FakeRunner):
        def run(self, jobs, join=None):
            if len(self.batches) == 0:
                self.batches.append(len(jobs))
                raise RuntimeError("boom")
            super().run(jobs)

    sched = Scheduler(Broken(), gather_s=0.0)
    sched.start()
    first = _job()
    sched.submit(first)
    assert first.events.get(timeout=5) == ("error", "generation failed: RuntimeError: boom")
    second = _job()
    sched.submit(second)
    kinds = []
    while not kinds or kinds[-1] == "text":
        kinds.append(second.events.get(timeout=5)[0])
    assert kinds[-1] == "done"
    sched.stop()


def test_engine_options_pass_only_what_the_engine_takes():
    from ktcli.config import Settings
    from ktcli.serve.run import _engine_options

    def load(model_dir, *, weights="fp32", threads=0, kv_dtype="fp32"):
        pass

    assert _engine_options(load, Settings()) == {}
    assert _engine_options(load, Settings(kv_dtype="bf16")) == {"kv_dtype": "bf16"}
    with pytest.raises(UsageError, match="--attention sink"):
        _engine_options(load, Settings(attention="sink"))


def test_the_address_is_checked_before_the_model_loads():
    from ktcli.serve.run import check_listen

    with pytest.raises(UsageError, match="--host 999.1.1.1: not an address"):
        check_listen("999.1.1.1", 0)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(UsageError, match="cannot listen on 127.0.0.1:.*in use"):
            check_listen("127.0.0.1", busy.getsockname()[1])
    check_listen("127.0.0.1", 0)


def test_stopping_cancels_the_running_batch_and_waits_for_the_engine():
    runner = FakeRunner(step_s=0.05)
    scheduler = Scheduler(runner, gather_s=0.0)
    scheduler.start()
    job = Job([1, 2], SamplingParams(max_new_tokens=1000))
    scheduler.submit(job)
    time.sleep(0.2)
    assert scheduler.stop(wait_s=10) and job.cancelled.is_set()
    assert runner.steps == [runner.steps[0]] and runner.steps[0] < 100  # of 1000


def test_cli_refuses_an_exposed_server_without_a_key(tmp_path):
    from tests.serve.helpers import run_cli

    started = time.monotonic()
    done = run_cli(["serve", "--host", "0.0.0.0", "--port", "0"], tmp_path, timeout=60)
    assert done.returncode == 2 and "--api-key" in done.stderr
    assert time.monotonic() - started < 30  # refused before any model loads


def test_joining_takes_the_oldest_like_requests_and_stops_at_other_sampling():
    runner = FakeRunner()
    scheduler = Scheduler(runner, gather_s=0.0, max_batch=4)
    greedy, hot = SamplingParams(max_new_tokens=2), SamplingParams(max_new_tokens=2, temperature=0.7, seed=1)
    jobs = [Job([1], greedy), Job([2], greedy), Job([3], hot), Job([4], greedy)]
    for job in jobs:
        scheduler.submit(job)
    assert scheduler._join(sampling_key(greedy), room=1) == jobs[:1]  # room bounds it
    # the other sampling at the head stops it: it runs next, not after every later joiner
    assert scheduler._join(sampling_key(greedy), room=4) == jobs[1:2]
    assert scheduler._join(sampling_key(greedy), room=4) == []
    assert list(scheduler._waiting) == jobs[2:]


def test_a_conversation_the_template_refuses_is_a_400(served, monkeypatch):
    from ktcli.engine.tokenizer import ChatTemplateError

    port, _, runner = served

    def refuse(messages, template_kwargs=None):
        raise ChatTemplateError("the model's chat template refuses this conversation: roles must alternate")

    monkeypatch.setattr(runner, "encode_chat", refuse)
    status, payload = request(port, "POST", "/v1/chat/completions", chat())
    assert status == 400 and "roles must alternate" in payload["error"]["message"]
    assert payload["error"]["type"] == "invalid_request_error"


def test_stopping_answers_what_runs_with_an_error_not_an_end():
    # On Ctrl-C a cut-off answer went out as finish_reason "cancelled" and [DONE] (or a
    # 200): a client took it for a whole answer.
    from ktcli.serve.scheduler import SHUTTING_DOWN

    scheduler = Scheduler(FakeRunner(step_s=0.05), gather_s=0.0)
    scheduler.start()
    running, waiting = Job([1, 2], SamplingParams(max_new_tokens=1000)), Job([3], SamplingParams(max_new_tokens=5))
    scheduler.submit(running)
    time.sleep(0.2)
    scheduler.submit(waiting)
    assert scheduler.stop(wait_s=10)
    for job in (running, waiting):
        events = [job.events.get_nowait() for _ in range(job.events.qsize())]
        assert events[-1] == ("error", SHUTTING_DOWN) and ("done", "cancelled") not in events


def test_a_request_read_after_stopping_is_a_503_not_a_wait(served):
    """Shutting down, the server closes its socket and stops the engine, then waits up to a
    minute for its step: a request on a kept-alive connection in that time was queued for
    an engine that took no more work, and waited for the process to exit."""
    port, app, runner = served
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(chat(max_tokens=1)))
    first = conn.getresponse()
    assert first.status == 200 and first.read()
    app.scheduler.stop(wait_s=10)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(chat(max_tokens=1)))  # the same connection
    second = conn.getresponse()
    assert second.status == 503 and json.loads(second.read())["error"]["message"] == "the server is shutting down"
    conn.close()
    assert len(runner.prompts) == 1


def test_chat_template_kwargs_reach_the_template(served):
    # vLLM's field: a Qwen3 client turns thinking back on (ktcli renders with it off)
    port, _, runner = served
    assert request(port, "POST", "/v1/chat/completions", chat(max_tokens=1))[0] == 200
    assert runner.template_kwargs is None
    body = chat(max_tokens=1, chat_template_kwargs={"enable_thinking": True})
    assert request(port, "POST", "/v1/chat/completions", body)[0] == 200
    assert runner.template_kwargs == {"enable_thinking": True}
    for bad in ([1], {"messages": []}, {"bos_token": "x"}):
        status, payload = request(port, "POST", "/v1/chat/completions", chat(chat_template_kwargs=bad))
        assert status == 400 and payload["error"]["param"] == "chat_template_kwargs"


def test_a_client_that_resets_its_connection_leaves_no_traceback(served, capfd):
    """socketserver printed a 15-line traceback for each reset before a request line."""
    import struct

    port, _, _ = served
    for send in (b"", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"):
        s = socket.create_connection(("127.0.0.1", port))
        if send:
            s.sendall(send)
            s.recv(4096)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST
    time.sleep(0.5)
    assert request(port, "GET", "/health")[0] == 200
    assert "Traceback" not in capfd.readouterr().err


def test_a_messages_template_cost_is_measured_once():
    from ktcli.engine.batching import message_tokens

    assert message_tokens(lambda msgs: [0] * (5 * len(msgs) + 2)) == 5  # SmolLM2's ChatML: 5 a message
    # An assistant turn with an empty thinking block costs more: the cheaper turn counts.
    assert message_tokens(lambda msgs: [0] * sum(5 if m["role"] == "user" else 11 for m in msgs)) == 5

    def alternating_only(msgs):
        raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")

    assert message_tokens(alternating_only) == 1  # no estimate: messages are counted alone


def test_a_sigterm_while_the_model_loads_is_said_in_one_line(monkeypatch):
    """The handler was set once serving: a service manager's stop during a minutes-long
    load ended the process by the signal, unsaid."""
    import os
    import signal

    from ktcli.config import Settings
    from ktcli.serve import run

    def loading(settings, on_status=None):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        raise AssertionError("the signal was not handled")

    monkeypatch.setattr(run, "load_engine", loading)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(run.Terminated):
        run.serve(Settings(), ServeOptions(host="127.0.0.1", port=0, model_id="fake"), lambda s: None)
    assert signal.getsignal(signal.SIGTERM) is before  # put back


def test_the_start_line_says_the_memory_with_the_kv_pages_full(monkeypatch):
    """The start line said "peak RSS 447 MiB" of a server that held 1.66 GiB after six
    7.9K-token prompts: float pages take memory as requests write them, and what reads
    hold beside them comes with the first request. It now adds what is still to come."""
    from ktcli.config import Settings
    from ktcli.serve import run

    servers = []
    monkeypatch.setattr(run, "make_server", lambda app: servers.append(make_server(app)) or servers[-1])
    runner = FakeRunner()
    runner.kv_tokens, runner.kv_device = 32_832, "cpu"
    runner.kv_bytes = runner.kv_unwritten_bytes = 721 * 2**20  # float pages: none written yet
    runner.prefill_chunk, runner.widths = 2048, 576 + 1536  # SmolLM2's: reads hold ~495 MiB beside their pages
    monkeypatch.setattr(run.resource, "getrusage", lambda who: type("Usage", (), {"ru_maxrss": 447 * 1024}))
    said: list[str] = []
    thread = threading.Thread(target=run.serve, args=(Settings(), ServeOptions(port=0, model_id="fake"), said.append),
                              kwargs={"runner": runner}, daemon=True)
    thread.start()
    for _ in range(600):  # the line comes once it listens
        if said:
            break
        time.sleep(0.05)
    servers[0].shutdown()
    thread.join(timeout=60)
    assert "KV pages for 32,832 in all" in said[0]
    assert said[0].endswith("peak RSS 447 MiB, ~1.62 GiB with all 721 MiB of KV pages in use)"), said[0]
    # pages written at start (quantized, sparse) are in the RSS already; pages on a GPU are not in it
    runner.kv_unwritten_bytes = 0
    assert run._memory(runner, 1168 * 2**20) == "peak RSS 1.14 GiB, ~1.62 GiB with all 721 MiB of KV pages in use"
    runner.kv_device = "cuda"
    assert run._memory(runner, 900 * 2**20) == "peak RSS 900 MiB, and 721 MiB of KV pages in cuda memory"
    assert run._memory(FakeRunner(), 900 * 2**20) == "peak RSS 900 MiB"  # transformers: no pages to add


@pytest.mark.parametrize("served", [{"verbose": True}], indirect=True)
def test_verbose_logs_each_generation_with_its_tokens_and_times(served, capsys):
    port, _, _ = served
    assert request(port, "POST", "/v1/chat/completions", chat(max_tokens=3))[0] == 200
    sse(port, "/v1/completions", {"prompt": "one two", "max_tokens": 2, "stream": True})
    time.sleep(0.2)  # the handler thread writes its line after the last byte
    lines = [line for line in capsys.readouterr().err.splitlines() if "prompt tokens" in line]
    assert len(lines) == 2, lines
    assert "chat: 7 prompt tokens, 3 out, first token " in lines[0] and lines[0].endswith(", length")
    assert "completion: " in lines[1] and "2 out" in lines[1]


@pytest.mark.parametrize("served", [{"verbose": True}], indirect=True)
def test_verbose_log_escapes_what_a_client_sends(served, capsys):
    """A request line's escape sequences reached the terminal raw (any client, no key)."""
    port, _, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /\x1b[2J\x1b[31mHACKED HTTP/1.1\r\nHost: x\r\n\r\n")
        s.recv(4096)
    time.sleep(0.2)
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[2J" in err, err
    assert "no route /\\x1b[2J" in err  # and why it was refused, not only its status


def test_a_messages_text_parts_are_read_as_separate_words(served):
    port, _, _ = served
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    got, payload = request(port, "POST", "/tokenize", {"messages": [{"role": "user", "content": parts}]})
    assert got == 200 and payload["count"] == 3 + 2 + 2  # two words, not "Helloworld"


def test_a_null_include_usage_is_the_default(served):
    port, _, _ = served
    events = sse(port, "/v1/chat/completions", chat(max_tokens=2, stream=True, stream_options={"include_usage": None}))
    assert events[-1] == "[DONE]" and all(e == "[DONE]" or e.get("usage") is None for e in events)


def _exchange(port: int, method: str, path: str, headers: dict, body: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


PREFLIGHT = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}


def test_no_cors_by_default(served):
    # A page on another site must not reach a model on the user's loopback: no CORS
    # headers, and a preflight refused with what to start the server with.
    port, _, _ = served
    status, headers, body = _exchange(port, "OPTIONS", "/v1/chat/completions", {"Origin": "http://localhost:3000", **PREFLIGHT})
    assert status == 403 and "--cors-origin http://localhost:3000" in json.loads(body)["error"]["message"]
    assert "access-control-allow-origin" not in headers
    # and a page's request itself is refused before any work (a text/plain POST needs no
    # preflight: it ran a generation the page could not read)
    _, app_runner = served[1], served[2]
    before = len(app_runner.batches)
    status, headers, _ = _exchange(port, "POST", "/v1/chat/completions", {"Origin": "http://localhost:3000",
                                                                          "Content-Type": "text/plain"}, chat(max_tokens=1))
    assert status == 403 and "access-control-allow-origin" not in headers and len(app_runner.batches) == before
    assert _exchange(port, "POST", "/v1/chat/completions", {"Content-Type": "application/json"}, chat(max_tokens=1))[0] == 200


@pytest.mark.parametrize("served", [{"api_key": "sekrit", "cors_origins": ("http://localhost:3000",)}], indirect=True)
def test_cors_for_a_named_origin(served):
    port, _, _ = served
    page = {"Origin": "http://localhost:3000"}
    # The preflight carries no key (browsers never send one with it): answered anyway.
    status, headers, body = _exchange(port, "OPTIONS", "/v1/chat/completions", {**page, **PREFLIGHT})
    assert (status, body) == (204, b"")
    assert headers["access-control-allow-origin"] == "http://localhost:3000"
    assert headers["access-control-allow-methods"] == "POST"
    assert headers["access-control-allow-headers"] == PREFLIGHT["Access-Control-Request-Headers"]
    assert headers["vary"] == "Origin"
    # The real request: its answer, a stream and an error all carry the header a page's
    # script needs to read them.
    auth = {**page, "Content-Type": "application/json", "Authorization": "Bearer sekrit"}
    for body, kind in ((chat(max_tokens=1), "application/json"), (chat(max_tokens=1, stream=True), "text/event-stream")):
        status, headers, _ = _exchange(port, "POST", "/v1/chat/completions", auth, body)
        assert (status, headers["content-type"], headers["access-control-allow-origin"]) == (200, kind, "http://localhost:3000")
    status, headers, _ = _exchange(port, "POST", "/v1/chat/completions", {**page, "Content-Type": "application/json"},
                                   chat(max_tokens=1))
    assert status == 401 and headers["access-control-allow-origin"] == "http://localhost:3000"
    status, headers, _ = _exchange(port, "OPTIONS", "/v1/models", {**page, "Access-Control-Request-Method": "GET"})
    assert status == 204 and headers["access-control-allow-methods"] == "GET, HEAD"
    # Another site gets neither.
    other = {"Origin": "https://evil.example"}
    assert _exchange(port, "OPTIONS", "/v1/chat/completions", {**other, **PREFLIGHT})[0] == 403
    status, headers, _ = _exchange(port, "POST", "/v1/chat/completions", {**other, **auth, "Origin": "https://evil.example"},
                                   chat(max_tokens=1))
    assert status == 403 and "access-control-allow-origin" not in headers
    # An OPTIONS that is no preflight still needs the key, and stays a 405 with it.
    assert _exchange(port, "OPTIONS", "/v1/models", {})[0] == 401
    assert _exchange(port, "OPTIONS", "/v1/models", {"Authorization": "Bearer sekrit"})[0] == 405


@pytest.mark.parametrize("served", [{"cors_origins": ("*",)}], indirect=True)
def test_cors_for_any_origin(served):
    port, _, _ = served
    status, headers, _ = _exchange(port, "OPTIONS", "/v1/completions", {"Origin": "null", **PREFLIGHT})
    assert status == 204 and headers["access-control-allow-origin"] == "*" and "vary" not in headers
    status, headers, _ = _exchange(port, "GET", "/v1/models", {"Origin": "https://app.example"})
    assert status == 200 and headers["access-control-allow-origin"] == "*"


def test_cors_origin_values():
    from ktcli.serve.server import check_origins

    assert check_origins(["http://LocalHost:3000/", "*", "https://[::1]:8443", "http://localhost:3000"]) == (
        "http://localhost:3000", "*", "https://[::1]:8443")
    for bad in ("localhost:3000", "http://localhost:3000/app", "http://", "http://a b"):
        with pytest.raises(UsageError, match="--cors-origin"):
            check_origins([bad])


def test_text_past_the_window_in_tokens_is_refused_after_a_few_slices():
    """660K characters of CJK text passed the character bound and were tokenised whole (1.8M
    tokens) before the 400: three such requests froze every other client's stream 4-5 s."""
    from ktcli.serve.protocol import ApiError, check_token_count

    encoded: list[int] = []

    def three_a_character(text):  # as a byte-level tokenizer reads CJK: up to 3 tokens a character
        encoded.append(len(text))
        return [0] * (3 * len(text))

    with pytest.raises(ApiError, match="context window of 8192 tokens"):
        check_token_count(["漢" * 660_000], three_a_character, 8192, "prompt")
    assert sum(encoded) < 20_000
    check_token_count(["word " * 8000], lambda text: [0] * (len(text) // 5), 8192, "prompt")  # fits: no refusal


def test_a_refusal_by_tokens_names_what_is_too_long_in_words_that_read():
    """"the messages holds more than..." read wrong, and a list of prompts did not say which."""
    from ktcli.serve.protocol import ApiError, check_token_count, parse_prompts

    def encode(text):
        return [0] * len(text)

    with pytest.raises(ApiError, match="^the messages hold more than"):
        check_token_count(["x" * 90_000], encode, 8192, "messages")
    with pytest.raises(ApiError, match=r"^'prompt'\[1\] holds more than"):
        parse_prompts({"prompt": ["short", "x" * 90_000]}, encode, 49152, 10**6, 8192)
    with pytest.raises(ApiError, match="^the prompt holds more than"):
        parse_prompts({"prompt": "x" * 90_000}, encode, 49152, 10**6, 8192)


def _half_closed(port: int, version: str, body: dict) -> http.client.HTTPResponse:
    """A request sent as `version`, then the client's write side shut (curl's and netcat's
    way to say the request is complete); the response as http.client reads it."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/completions %s\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
              % (version.encode(), len(data), data))
    s.shutdown(socket.SHUT_WR)
    resp = http.client.HTTPResponse(s, method="POST")  # it skips interim (1xx) responses
    resp.begin()
    s.close()  # the response holds its own reader
    return resp


@pytest.mark.parametrize("served", [{"runner": {"step_s": 0.05}}], indirect=True)
@pytest.mark.parametrize("version", ["HTTP/1.0", "HTTP/1.1"])
def test_a_client_that_half_closes_after_its_request_is_answered(served, version):
    """A client that shuts its write side after the request still reads: its EOF was taken
    for a disconnect at the first look (0.25 s), and a 0.5 s answer went to no one."""
    port, _, _ = served
    resp = _half_closed(port, version, {"prompt": "hi", "max_tokens": 10})
    assert resp.status == 200 and json.loads(resp.read())["usage"]["completion_tokens"] == 10
    resp = _half_closed(port, version, {"prompt": "hi", "max_tokens": 10, "stream": True})
    events = [line[6:] for line in resp.read().decode().split("\n\n") if line.startswith("data: ")]
    assert resp.status == 200 and events[-1] == "[DONE]" and len(events) == 13  # first, 10 tokens, finish, [DONE]


@pytest.mark.parametrize("served", [{"runner": {"bos_id": 1}}], indirect=True)
def test_an_empty_prompt_is_written_from_the_start_of_text(served):
    """OpenAI answers "prompt": "" (a text from its start); it was refused with a 400. It
    runs on the model's beginning-of-sequence token alone."""
    port, _, runner = served
    for prompt in ("", [""]):
        status, body = request(port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert status == 200 and body["choices"][0]["text"] == "alpha beta ", prompt
        assert body["usage"]["prompt_tokens"] == 1
    assert runner.prompts == [[1], [1]]


def test_several_prompts_get_a_choice_each_from_one_batch(served):
    """OpenAI answers a list of prompts with a choice for each, in order, and the usage of
    all; it was refused with a 400. Each prompt has its own window: the 62-word one leaves
    room for 2 tokens, the other gets the server's default 5."""
    port, _, runner = served
    long = " ".join(["w"] * 62)
    status, body = request(port, "POST", "/v1/completions", {"prompt": [long, "hi"]})
    assert status == 200 and runner.batches == [2]  # submitted together, run as one batch
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "alpha beta ", "length"), (1, "alpha beta gamma delta epsilon ", "length")]
    assert body["usage"] == {"prompt_tokens": 63, "completion_tokens": 7, "total_tokens": 70,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    status, body = request(port, "POST", "/v1/completions", {"prompt": [[3, 4], [5]], "max_tokens": 1})
    assert status == 200 and len(body["choices"]) == 2 and body["usage"]["prompt_tokens"] == 3
    # streamed: every chunk names its choice, one [DONE] after the last choice's end
    events = sse(port, "/v1/completions", {"prompt": [long, "hi"], "stream": True, "stream_options": {"include_usage": True}})
    chunks = [e for e in events[:-2] if isinstance(e, dict)]
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    assert ["".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i) for i in (0, 1)] == [
        "alpha beta ", "alpha beta gamma delta epsilon "]
    assert [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]] == [0, 1]
    assert events[-2]["usage"]["completion_tokens"] == 7 and events[-2]["choices"] == []


def test_several_prompts_are_refused_whole_and_bounded(served):
    from ktcli.serve.protocol import MAX_CHOICES

    port, _, runner = served
    for body, fragment in (({"prompt": ["x"] * (MAX_CHOICES + 1)}, f"at most {MAX_CHOICES} are answered"),
                           ({"prompt": ["hi", " ".join(["w"] * 70)]}, "'prompt'[1] has 70 tokens"),
                           ({"prompt": ["hi", [3, 100]]}, "'prompt'[1] token id 100 is outside"),
                           ({"prompt": ["hi", [3, "x"]]}, "'prompt'[1] must be a string or a list of token ids"),
                           ({"prompt": ["hi", 3]}, "'prompt' must be a string or a list of token ids, or a list of"),
                           ({"prompt": []}, "'prompt' is an empty list"),
                           ({"prompt": ["hi", "there"], "n": 2}, "only n=1")):
        status, payload = request(port, "POST", "/v1/completions", body)
        assert status == 400 and fragment in payload["error"]["message"], body
        assert payload["error"]["param"] in ("prompt", "n")
    assert runner.batches == []  # one bad prompt runs none of the others
