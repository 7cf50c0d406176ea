"""`ktcli ask/summarize/plan --backend openai` against a real `ktcli serve` subprocess on
a loopback port, with the bundled SmolLM2: streaming and not, a bad key, malformed
requests, a client that disconnects, a server stopped mid-answer."""

from __future__ import annotations

import json
import re
import signal
import socket
from pathlib import Path

import pytest

from ktcli.engine.backend import SamplingParams
from ktcli.engine.openai_backend import OpenAIBackend, discover_model
from ktcli.engine.openai_http import HttpClient, StreamCutOffError
from tests.serve.helpers import ENGINE, request, run_cli, start_serve

KEY = "test-key-123"
DOC = ("Harbor Light Ltd. annual report 2023.\n"
       "Revenue in the third quarter was 4.2 million euros.\n"
       "The company opened a second lighthouse museum in Bergen.\n")
QUESTION = "What was the revenue in the third quarter?"
SHORT = ["--max-new-tokens", "6"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("serve")
    served = start_serve(base, "--api-key", KEY, "--threads", "2", "--max-new-tokens", "8", "--batch-wait-ms", "50")
    yield served
    served.stop()


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("doc") / "report.txt"
    path.write_text(DOC)
    return path


def remote_args(server, key: str = KEY) -> list[str]:
    return ["--backend", "openai", "--base-url", server.url, "--api-key", key]


def client_backend(server) -> OpenAIBackend:
    client = HttpClient(server.url, KEY, timeout_s=300)
    served = discover_model(client, "smollm2", 0, "smollm2")
    return OpenAIBackend(client, served.id, served.context_window)


def test_window_and_tokenizer_come_from_the_server(server):
    b = client_backend(server)
    assert b.model == "smollm2" and b.context_window == 8192
    assert b.count_tokens("hello world") == 2 and b.tokens.source == "server"
    # The server's chat template wraps the messages: more tokens than their text.
    assert b.prompt_tokens([{"role": "user", "content": "hello world"}]) > 2


def test_plan_against_the_server(server, doc, tmp_path):
    done = run_cli(["plan", str(doc), QUESTION, "--json", *remote_args(server)], tmp_path)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["plan"]["mode"] == "full" and payload["plan"]["context_window"] == 8192


def test_ask_streams_the_answer(server, doc, tmp_path):
    done = run_cli(["ask", str(doc), QUESTION, *SHORT, *remote_args(server)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "connecting to" in done.stderr and "tokens in" in done.stderr


def test_ask_json(server, doc, tmp_path):
    done = run_cli(["ask", str(doc), QUESTION, "--json", *SHORT, *remote_args(server)], tmp_path)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["answer"].strip()
    assert payload["figures"]["backend"] == "openai" and payload["figures"]["tokenizer"] == "server"
    assert 0 < payload["figures"]["tokens_out"] <= 6


def test_a_second_question_about_a_long_document_reads_the_prompt_cache(tmp_path):
    """The server keeps a long prompt's K/V; the same document asked again reads them back
    (one entry on disk, not two) and answers as it did."""
    base = tmp_path / "serve"
    base.mkdir()
    served = start_serve(base, "--threads", "2", "--max-new-tokens", "8")
    try:
        long_doc = tmp_path / "long.txt"
        long_doc.write_text("".join(f"Line {i}: the lighthouse keeper logged {i * 7} ships.\n" for i in range(150)) + DOC)
        args = ["ask", str(long_doc), QUESTION, "--json", *SHORT, "--backend", "openai", "--base-url", served.url]
        first, second = (run_cli(args, tmp_path) for _ in range(2))
        assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
        assert json.loads(first.stdout)["answer"] == json.loads(second.stdout)["answer"]
        if ENGINE == "ktcli":
            assert len(list((base / "cache" / "prompts").rglob("*.kv"))) == 1
    finally:
        served.stop()


def test_summarize(server, doc, tmp_path):
    done = run_cli(["summarize", str(doc), "--json", *SHORT, *remote_args(server)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"].strip()


def test_non_streaming_batch_runs_together(server):
    b = client_backend(server)
    convs = [[{"role": "user", "content": f"Name a colour number {i}."}] for i in range(3)]
    out = b.generate_chat_batch(convs, SamplingParams(max_new_tokens=4))
    assert len(out) == 3 and all(t.strip() for t in out)
    assert b.last_stats.new_tokens <= 12
    health = request(server.port, "GET", "/health", key=KEY)[1]
    assert health["largest_batch"] >= 2


def test_bad_key_is_one_clear_line(server, doc, tmp_path):
    done = run_cli(["ask", str(doc), QUESTION, *SHORT, *remote_args(server, key="wrong")], tmp_path)
    assert done.returncode == 1
    assert "refused the API key" in done.stderr and "Traceback" not in done.stderr
    assert request(server.port, "GET", "/v1/models")[0] == 401


def test_malformed_requests_get_json_errors(server):
    port = server.port
    assert request(port, "POST", "/v1/chat/completions", b"{oops", key=KEY)[0] == 400
    status, body = request(port, "POST", "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9000}, key=KEY)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    status, body = request(port, "POST", "/v1/chat/completions",
                           {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, key=KEY)
    assert status == 404 and "smollm2" in body["error"]["message"]
    assert request(port, "POST", "/v1/completions", {"prompt": 3}, key=KEY)[0] == 400
    assert server.alive()
    status, body = request(port, "POST", "/v1/completions", {"prompt": "The sky is", "max_tokens": 2}, key=KEY)
    assert status == 200 and body["usage"]["completion_tokens"] <= 2


def test_client_disconnect_mid_stream(server):
    body = json.dumps({"messages": [{"role": "user", "content": "Write a long poem about the sea."}],
                       "max_tokens": 200, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=120) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        seen = b""
        while seen.count(b"data: ") < 2:  # the opening chunk and one token
            chunk = s.recv(4096)
            assert chunk, "server closed before streaming"
            seen += chunk
    status, reply = request(server.port, "POST", "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, key=KEY, timeout=120)
    assert status == 200 and reply["usage"]["completion_tokens"] <= 2
    assert server.alive()


def test_server_stopped_mid_answer_keeps_the_partial(tmp_path):
    served = start_serve(tmp_path, "--threads", "2")
    try:
        client = HttpClient(served.url, timeout_s=300)
        b = OpenAIBackend(client, "smollm2", 8192)
        pieces: list[str] = []
        with pytest.raises(StreamCutOffError) as info:
            for piece in b.stream_chat([{"role": "user", "content": "Write a long story about a lighthouse."}],
                                       SamplingParams(max_new_tokens=300)):
                pieces.append(piece)
                if len(pieces) == 2:
                    served.stop(hard=True)
        assert info.value.partial.startswith("".join(pieces[:2]))
        assert "[answer cut off:" in pieces[-1]
    finally:
        served.stop(hard=True)


def test_a_short_request_joins_a_long_running_one(server):
    # Continuous batching: it used to wait for the long answer to end (2.9 s vs 0.15 s).
    long_conn = socket.create_connection(("127.0.0.1", server.port), timeout=120)
    body = json.dumps({"prompt": "1, 2, 3, 4,", "max_tokens": 250, "stream": True, "temperature": 0}).encode()
    long_conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                      + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    seen = b""
    while seen.count(b"data: ") < 3:
        seen += long_conn.recv(4096)
    status, payload = request(server.port, "POST", "/v1/completions",
                              {"prompt": "Hi", "max_tokens": 3, "temperature": 0}, key=KEY)
    assert status == 200 and payload["usage"]["completion_tokens"] <= 3
    long_conn.settimeout(0.2)
    try:
        seen += long_conn.recv(65536)
    except TimeoutError:
        pass
    assert b"[DONE]" not in seen  # the long answer was still going when the short one ended
    long_conn.close()


@pytest.mark.parametrize("signum, code, said, inherited", [
    (signal.SIGINT, 130, "· stopped serving (Ctrl-C)", signal.SIG_DFL),
    (signal.SIGTERM, 143, "· stopped serving (SIGTERM)", signal.SIG_DFL),
    # started in the background by a script: SIGINT inherited ignored, and `kill -INT` was
    (signal.SIGINT, 130, "· stopped serving (Ctrl-C)", signal.SIG_IGN)])
def test_stopping_the_server_mid_answer_is_one_line(tmp_path, signum, code, said, inherited):
    # Ctrl-C mid-answer exited 134 ("terminate called without an active exception": the
    # process ended under the engine thread's native step); SIGTERM ended it unsaid.
    served = start_serve(tmp_path, "--threads", "2", sigint=inherited)
    try:
        conn = socket.create_connection(("127.0.0.1", served.port), timeout=60)
        body = json.dumps({"prompt": "1, 2, 3, 4,", "max_tokens": 300, "stream": True}).encode()
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        seen = b""
        while seen.count(b"data: ") < 3:  # tokens are coming: the engine is mid-answer
            seen += conn.recv(4096)
        served.proc.send_signal(signum)
        assert served.proc.wait(timeout=60) == code
        conn.close()
        assert served.log.read_text().strip().splitlines()[-1] == said
    finally:
        served.stop(hard=True)


@pytest.mark.skipif(ENGINE != "ktcli", reason="--max-memory sizes our engine's pages")
def test_max_memory_bounds_what_the_server_holds(tmp_path):
    """Probe 100: `--attention topk:4` wrote pages for 131K tokens (3.4 GiB) when it
    started, with no option to bound them."""
    budget = 10**9
    served = start_serve(tmp_path, "--threads", "2", "--attention", "topk:4", "--max-memory", "1GB")
    try:
        pages = int(re.search(r"KV pages for ([\d,]+) in all", served.log.read_text()).group(1).replace(",", ""))
        assert 2048 <= pages < 32768
        assert request(served.port, "GET", "/v1/models")[1]["data"][0]["max_model_len"] == pages
        prompt = " ".join(f"Line {i} of the report says the lamp turned {i % 7} times." for i in range(80))
        status, body = request(served.port, "POST", "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": prompt}], "max_tokens": 4})
        assert status == 200 and body["usage"]["prompt_tokens"] > 1024  # two prefill chunks
        peak = int(re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{served.proc.pid}/status").read_text()).group(1))
        assert peak * 1024 < budget
    finally:
        served.stop()


@pytest.mark.skipif(ENGINE != "ktcli", reason="--max-memory sizes our engine's pages")
def test_a_memory_budget_the_model_alone_fills_is_refused(tmp_path):
    from ktcli.config import Settings
    from ktcli.engine.model_store import ensure_hf_dir, resolve_model
    from ktcli.errors import UsageError
    from ktcli.serve.run import kv_budget
    from tests.cli.conftest import fresh_cache

    cache = fresh_cache(tmp_path)
    folder = ensure_hf_dir(resolve_model("smollm2"), cache)
    settings = Settings(cache_dir=str(cache), device="cpu", max_memory="500MB")
    with pytest.raises(UsageError, match=r"^--max-memory 500MB: the model \(int8 weights\) and the runtime take "
                                         r"~[\d,]+ MiB, leaving nothing for KV pages"):
        kv_budget(settings, folder)
    assert kv_budget(Settings(cache_dir=str(cache), device="cpu"), folder) is None  # no budget: the engine's default
    room = kv_budget(Settings(cache_dir=str(cache), device="cpu", max_memory="2GB"), folder)
    assert 2 * 10**9 - 900 * 2**20 < room < 2 * 10**9 - 500 * 2**20


@pytest.mark.slow  # ~20-60 s here: transformers loads slowly on 2 busy cores
@pytest.mark.skipif(ENGINE == "hf", reason="the whole module ran on hf already")
def test_the_hf_engine_serves_too(tmp_path):
    served = start_serve(tmp_path, "--threads", "2", engine="hf")
    try:
        b = OpenAIBackend(HttpClient(served.url, timeout_s=300), "smollm2", 8192)
        text = "".join(b.stream_chat([{"role": "user", "content": "Say hello."}], SamplingParams(max_new_tokens=3)))
        assert text.strip() and b.last_stats.new_tokens <= 3
        out = b.generate_chat_batch([[{"role": "user", "content": f"Count to {n}."}] for n in (2, 3)],
                                    SamplingParams(max_new_tokens=3))
        assert all(t.strip() for t in out)
        assert request(served.port, "GET", "/health")[1]["engine"] == "hf"
    finally:
        served.stop()
