"""The `openai` backend against a scripted loopback server: retries, errors, cut-off
streams, window discovery and token counting. No model runs here."""

from __future__ import annotations

import json
import socket
import time

import pytest

from ktcli.config import Settings
from ktcli.engine.backend import SamplingParams
from ktcli.engine.openai_backend import OpenAIBackend, discover_model, remote_model_facts
from ktcli.engine.openai_http import (
    AuthError, Endpoint, HttpClient, ServerStatusError, ServerUnreachableError, StreamCutOffError,
)
from ktcli.errors import BackendError, UsageError
from ktcli.ingest.tokens import count_tokens
from tests.serve.fake_openai import ANSWER, FakeOpenAI

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the answer?"}]
PARAMS = SamplingParams(max_new_tokens=8)


def backend(fake: FakeOpenAI, key: str = "", **client_kw) -> OpenAIBackend:
    client = HttpClient(fake.url, key, backoff_s=0.01, timeout_s=client_kw.pop("timeout_s", 20), **client_kw)
    served = discover_model(client, "fake-model", 0, "smollm2")
    return OpenAIBackend(client, served.id, served.context_window)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("url, prefix, root", [
    ("http://h:8000/v1", "/v1", ""), ("http://h:8000", "/v1", ""), ("http://h:8000/v1/", "/v1", ""),
    ("h:8000", "/v1", ""), ("https://proxy/llm/v1", "/llm/v1", "/llm"),
])
def test_base_url_forms(url, prefix, root):
    e = Endpoint.parse(url)
    assert (e.prefix, e.root) == (prefix, root)


def test_base_url_required():
    with pytest.raises(UsageError, match="--base-url"):
        Endpoint.parse("")


def test_streams_chat_and_reads_usage():
    with FakeOpenAI() as fake:
        b = backend(fake)
        assert list(b.stream_chat(MSGS, PARAMS)) == ANSWER
        path, body = fake.calls[-1]
        assert path == "/v1/chat/completions" and body["stream"] is True
        assert body["messages"] == MSGS and body["max_tokens"] == 8 and body["model"] == "fake-model"
        assert (b.last_stats.prompt_tokens, b.last_stats.new_tokens) == (11, 4)
        assert b.last_stats.extra["backend"] == "openai"


def test_an_answer_sent_in_one_event_has_no_decode_rate():
    """"decode 88171.1 tok/s" was shown and learned; a trailing line break held as a stop's
    start came out as a second piece, which counted as a second event."""
    with FakeOpenAI(script=["whole", "ok"]) as fake:
        b = backend(fake)
        params = SamplingParams(max_new_tokens=8, stop=("\n\n",))
        assert "".join(b.stream_chat(MSGS, params)) == "".join(ANSWER) + "\n"
        assert b.last_stats.decode_s == 0.0 and b.last_stats.new_tokens == 4
        list(b.stream_chat(MSGS, params))
        assert b.last_stats.decode_s > 0.0


def test_a_stream_the_caller_stops_early_still_counts_its_prompt():
    # A looping answer is stopped before the last chunk, which carries the usage: the
    # figures said "tokens in 0".
    with FakeOpenAI() as fake:
        b = backend(fake)
        stream = b.stream_chat(MSGS, PARAMS)
        first = next(stream)
        stream.close()
        assert first == ANSWER[0]
        assert (b.last_stats.prompt_tokens, b.last_stats.new_tokens) == (6 + 10, 1)


def test_stop_strings_past_the_servers_four_are_applied_here():
    # OpenAI's API refuses more than 4 stop strings; the rest cut the text on our side.
    stops = ("\n\n[", "<x>", "<y>", "<z>", "is ")
    with FakeOpenAI() as fake:
        b = backend(fake)
        assert "".join(b.stream_chat(MSGS, SamplingParams(max_new_tokens=8, stop=stops))) == "The answer "
        chat = [body for path, body in fake.calls if path.endswith("/chat/completions")]
        assert chat[-1]["stop"] == list(stops[:4])
        assert b.generate_chat_batch([MSGS], SamplingParams(max_new_tokens=8, stop=stops)) == ["The answer "]


@pytest.mark.parametrize("failure", ["429", "500", "503", "reset"])
def test_retries_transient_failures(failure):
    with FakeOpenAI(script=[failure, failure]) as fake:
        b = backend(fake)
        assert "".join(b.stream_chat(MSGS, PARAMS)) == "".join(ANSWER)
        assert fake.chat_calls == 3 and b.client.retries == 2


def test_gives_up_with_one_line_after_attempts():
    with FakeOpenAI(script=["500"] * 10) as fake:
        b = backend(fake, max_attempts=3)
        with pytest.raises(ServerStatusError, match="HTTP 500: scripted 500"):
            list(b.stream_chat(MSGS, PARAMS))
        assert fake.chat_calls == 3


def test_total_timeout_bounds_a_slow_server():
    with FakeOpenAI(script=["slow"]) as fake:
        b = backend(fake, timeout_s=0.5)
        b.client.read_timeout_s = 0.5
        started = time.monotonic()
        with pytest.raises(BackendError, match="did not answer within"):
            list(b.stream_chat(MSGS, PARAMS))
        assert time.monotonic() - started < 2


def test_unreachable_server_fails_fast():
    client = HttpClient(f"http://127.0.0.1:{free_port()}/v1", backoff_s=0.01)
    started = time.monotonic()
    with pytest.raises(ServerUnreachableError, match="cannot reach the server .* connection refused"):
        client.get_json("/models")
    assert time.monotonic() - started < 3


def test_a_base_url_that_is_no_url_is_a_usage_error():
    """`--base-url 'http://[::1'` was "internal error: ValueError: Invalid IPv6 URL"."""
    with pytest.raises(UsageError, match=r"--base-url 'http://\[::1': not a URL \(Invalid IPv6 URL\)"):
        Endpoint.parse("http://[::1")
    assert Endpoint.parse("http://[::1]:8000/v1").display == "http://[::1]:8000/v1"


def test_a_server_that_takes_the_connection_and_never_answers_is_said_at_the_probe(monkeypatch):
    """Accepted, then silent (a wrong port, a stuck proxy): the first call waited out the
    600 s request timeout, with nothing said after "reading input"."""
    from ktcli.engine import openai_backend

    monkeypatch.setattr(openai_backend, "PROBE_TIMEOUT_S", 0.5)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the connection; nothing reads or answers
        client = HttpClient(f"http://127.0.0.1:{silent.getsockname()[1]}/v1", timeout_s=600)
        started = time.monotonic()
        with pytest.raises(ServerUnreachableError, match=r"accepted the connection but did not answer within 0.5s "
                                                         r"\(GET /v1/models\)"):
            discover_model(client, "fake-model", 0, "smollm2")
    assert time.monotonic() - started < 3


def test_a_connection_that_is_never_made_is_said_after_the_connect_timeout():
    """A host that drops the packets: the connect waited as long as an answer may (600 s)."""
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        address = full.getsockname()
        queued = []
        try:
            for _ in range(8):  # fill the accept queue: Linux then drops the next SYNs
                probe = socket.socket()
                queued.append(probe)
                probe.settimeout(0.3)
                try:
                    probe.connect(address)
                except TimeoutError:
                    break
            else:
                pytest.skip("this system does not drop connections past a full accept queue")
            client = HttpClient(f"http://{address[0]}:{address[1]}/v1", timeout_s=600, connect_timeout_s=0.5)
            started = time.monotonic()
            with pytest.raises(ServerUnreachableError, match="no connection within 0.5s"):
                client.get_json("/models")
            assert time.monotonic() - started < 3
        finally:
            for probe in queued:
                probe.close()


def test_refused_key():
    with FakeOpenAI(key="right") as fake:
        with pytest.raises(AuthError, match="refused the API key"):
            backend(fake, key="wrong")
        b = backend(fake, key="right")
        assert "".join(b.stream_chat(MSGS, PARAMS))
        assert fake.headers[-1]["Authorization"] == "Bearer right"


def test_unknown_model_names_the_served_ones():
    with FakeOpenAI() as fake:
        client = HttpClient(fake.url)
        with pytest.raises(BackendError, match="does not serve model 'gpt-9'; it serves: fake-model"):
            discover_model(client, "gpt-9", 0, "smollm2")
        # The default local model name means "whatever the server serves".
        assert discover_model(client, "smollm2", 0, "smollm2").id == "fake-model"


def test_cut_off_stream_keeps_and_marks_the_partial_answer():
    with FakeOpenAI(script=["cut"]) as fake:
        b = backend(fake)
        pieces = []
        with pytest.raises(StreamCutOffError) as info:
            for piece in b.stream_chat(MSGS, PARAMS):
                pieces.append(piece)
        assert pieces[:2] == ANSWER[:2] and "[answer cut off:" in pieces[-1]
        assert info.value.partial == "".join(ANSWER[:2])
        assert "closed the stream" in str(info.value)
        assert fake.chat_calls == 1  # never retried: the answer had started


def test_stream_cut_before_its_first_word_is_asked_again():
    with FakeOpenAI(script=["cut0", "cut0"]) as fake:
        assert "".join(backend(fake).stream_chat(MSGS, PARAMS)) == "".join(ANSWER)
        assert fake.chat_calls == 3


def test_a_read_timeout_is_not_asked_again_and_is_said_as_such():
    """Each retry of a timed-out stream started its own budget (3 x the timeout) and the
    server did the work three times; the error spoke of a partial answer of 0 characters."""
    with FakeOpenAI(script=["stall", "stall", "stall"]) as fake:
        b = backend(fake, timeout_s=30)
        b.client.read_timeout_s = 0.5
        started = time.monotonic()
        with pytest.raises(StreamCutOffError) as info:
            list(b.stream_chat(MSGS, PARAMS))
        assert time.monotonic() - started < 1.5 and fake.chat_calls == 1
        assert "the server sent no answer for 0.5s (read timed out)" in str(info.value)
        assert "partial answer" not in str(info.value)


def test_a_web_page_instead_of_an_event_stream_is_named():
    with FakeOpenAI(script=["html"]) as fake:
        with pytest.raises(BackendError, match="answered text/html, not an OpenAI-compatible event stream"):
            list(backend(fake).stream_chat(MSGS, PARAMS))


def test_in_band_error_event_is_a_cut():
    with FakeOpenAI(script=["error_event"]) as fake:
        with pytest.raises(StreamCutOffError, match="engine exploded"):
            list(backend(fake).stream_chat(MSGS, PARAMS))


@pytest.mark.parametrize("models, flag, window", [
    ([{"id": "fake-model", "max_model_len": 4096}], 0, 4096),
    ([{"id": "fake-model", "max_model_len": 4096}], 1000, 1000),  # the flag caps
    ([{"id": "fake-model", "max_model_len": 4096}], 9000, 4096),  # never past the server's
    ([{"id": "fake-model", "meta": {"n_ctx_train": 2048}}], 0, 2048),  # llama.cpp
    ([{"id": "fake-model"}], 3000, 3000),  # the server does not say: the flag decides
])
def test_context_window_discovery(models, flag, window):
    with FakeOpenAI(models=models) as fake:
        assert discover_model(HttpClient(fake.url), "fake-model", flag, "smollm2").context_window == window


def test_window_unknown_asks_for_the_flag():
    with FakeOpenAI(models=[{"id": "fake-model"}]) as fake:
        with pytest.raises(UsageError, match="--context-window"):
            discover_model(HttpClient(fake.url), "fake-model", 0, "smollm2")


def test_no_models_endpoint_trusts_the_flags():
    with FakeOpenAI(models_status=404) as fake:
        served = discover_model(HttpClient(fake.url), "mine", 2048, "smollm2")
        assert (served.id, served.context_window) == ("mine", 2048)
        # without --context-window: more often a wrong --base-url ("/v2") than no route
        with pytest.raises(UsageError, match=r"has no http://127.0.0.1:\d+/v1/models \(404\): is --base-url right"):
            discover_model(HttpClient(fake.url), "mine", 0, "smollm2")


def test_planner_facts_come_from_the_server():
    with FakeOpenAI() as fake:
        facts = remote_model_facts(Settings(backend="openai", base_url=fake.url, model="fake-model"))
        assert facts.context_window == 4096 and facts.weight_bytes == 0


def test_counts_with_the_server_tokenizer_when_offered():
    with FakeOpenAI() as fake:
        b = backend(fake)
        assert b.count_tokens("one two three") == 3
        assert b.count_tokens("one two three") == 3  # cached: asked once
        assert sum(1 for p, _ in fake.calls if p == "/tokenize") == 1
        assert b.prompt_tokens(MSGS) == 6 + 10  # the server applied its chat template
        assert b.tokens.source == "server"


def test_a_text_too_long_to_tokenize_at_once_is_counted_in_parts():
    """A 400 for its length counted as "no tokenizer": the server's count was dropped for
    tiktoken's for the rest of the run."""
    with FakeOpenAI() as fake:
        b = backend(fake)
        text = "word " * 3000  # 15,000 characters: past what the server counts at once
        assert b.count_tokens(text) == 3000 and b.tokens.source == "server"
        assert b.count_tokens("one two") == 2 and b.tokens.source == "server"


def test_counts_with_tiktoken_without_a_tokenize_endpoint():
    with FakeOpenAI(tokenize=False) as fake:
        b = backend(fake)
        text = "def f(x):\n    return x ** 2  # squares"
        assert b.count_tokens(text) == count_tokens(text)
        assert b.prompt_tokens(MSGS) > count_tokens("Be brief.") + count_tokens("What is the answer?")
        assert b.tokens.source == "tiktoken"


def test_batch_goes_out_concurrently():
    with FakeOpenAI() as fake:
        b = backend(fake)
        out = b.generate_chat_batch([MSGS] * 4, PARAMS)
        assert out == ["".join(ANSWER)] * 4
        assert fake.max_active >= 2
        assert b.last_stats.new_tokens == 16


def test_openai_api_key_env_is_the_fallback(monkeypatch):
    from ktcli.engine.openai_backend import client_for

    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert client_for(Settings(base_url="http://127.0.0.1:1/v1")).api_key == "from-env"
    assert client_for(Settings(base_url="http://127.0.0.1:1/v1", api_key="flag")).api_key == "flag"


def test_settings_from_env(monkeypatch, tmp_path):
    from ktcli.config import load_settings

    (tmp_path / "none.toml").touch()  # an empty config: the user's own must not reach the test
    monkeypatch.setenv("KTCLI_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("KTCLI_BACKEND", "openai")
    monkeypatch.setenv("KTCLI_BASE_URL", "http://10.0.0.5:8000/v1")
    monkeypatch.setenv("KTCLI_CONTEXT_WINDOW", "32768")
    s = load_settings({"api_key": "k"})
    assert (s.backend, s.base_url, s.context_window, s.api_key) == ("openai", "http://10.0.0.5:8000/v1", 32768, "k")


# -- through the real CLI (a subprocess; the fake server answers) ---------------------


def test_cli_keeps_a_cut_off_answer(tmp_path):
    from tests.serve.helpers import run_cli

    doc = tmp_path / "doc.txt"
    doc.write_text("The answer to everything is 42.\n")
    with FakeOpenAI(script=["cut", "cut"]) as fake:
        args = ["ask", str(doc), "What is the answer?", "--backend", "openai", "--base-url", fake.url, "--model", "fake-model"]
        text = run_cli(args, tmp_path)
        as_json = run_cli([*args, "--json"], tmp_path)
    assert text.returncode == 1
    assert text.stdout.startswith("The answer ") and "[answer cut off:" in text.stdout
    assert "error:" in text.stderr and "partial answer kept" in text.stderr and "Traceback" not in text.stderr
    assert as_json.returncode == 1
    payload = json.loads(as_json.stdout)
    assert {k: payload[k] for k in ("answer", "incomplete", "exit_code")} == {"answer": "The answer ", "incomplete": True,
                                                                             "exit_code": 1}
    # the answer's whole object, as an interrupted one's: its plan, figures and skipped files too
    assert {"citations", "plan", "figures", "skipped", "warnings", "error"} <= set(payload)
    assert payload["plan"]["task"] == "ask" and payload["citations"] == [] and "labels_moved" in payload["figures"]
    # the cut call counted: made, its prompt sent
    assert payload["figures"]["model_calls"] == 1 and payload["figures"]["tokens_in"] > 0


def test_cli_says_which_server_it_contacts_before_the_first_call(tmp_path):
    from tests.serve.helpers import run_cli

    doc = tmp_path / "doc.txt"
    doc.write_text("Some text.\n")
    with FakeOpenAI() as fake:
        done = run_cli(["plan", str(doc), "What?", "--backend", "openai", "--base-url", fake.url], tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"contacting {fake.url.rstrip('/')}" in done.stderr


def test_cli_refused_key_is_one_line(tmp_path):
    from tests.serve.helpers import run_cli

    doc = tmp_path / "doc.txt"
    doc.write_text("Some text.\n")
    with FakeOpenAI(key="right") as fake:
        done = run_cli(["ask", str(doc), "What?", "--backend", "openai", "--base-url", fake.url, "--api-key", "wrong"], tmp_path)
    assert done.returncode == 1
    assert "refused the API key" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 3


# -- a server that cuts off a step writing notes, before the answer -------------------

# ~6.5K tokens: read in parts (a summary) or in several evidence windows (a question) in a
# 2,048-token window, so that the k-th call to the server is a notes step.
LONG = "\n".join(f"Paragraph {i}: the warehouse in district {i} stores {i * 7} crates of apples." for i in range(300)) + "\n"
SMALL_WINDOW = [{"id": "fake-model", "object": "model", "max_model_len": 2048}]


def _ask_cut_at(call: int, tmp_path, monkeypatch):
    """`ktcli ask` in retrieval mode against a server that drops the stream on its
    `call`-th chat call (after two pieces); the index built with a hashing embedder."""
    from dataclasses import replace

    from ktcli.errors import KtcliError
    from ktcli.pipeline import api
    from ktcli.pipeline.events import NullReporter
    from tests.retrieval.fakes import HashEmbedder

    monkeypatch.setattr("ktcli.pipeline.indexing.embedder_for", lambda settings: HashEmbedder())
    doc = tmp_path / "doc.txt"
    doc.write_text(LONG)
    with FakeOpenAI(script=["ok"] * (call - 1) + ["cut"], models=SMALL_WINDOW) as fake:
        settings = replace(Settings(), backend="openai", base_url=fake.url, cache_dir=str(tmp_path / "cache"),
                           mode="retrieval", top_k=30)
        with pytest.raises(KtcliError) as caught:
            api.ask([str(doc)], "How many crates does district 5 store?", settings, NullReporter())
        assert fake.chat_calls == call
    return caught.value


def test_a_question_cut_off_in_its_notes_step_has_no_answer(tmp_path, monkeypatch):
    """The notes a step was writing when the server cut off were kept as "partial answer"
    and --json's `answer`: the answer had not begun."""
    from ktcli.errors import NotesCutOff

    e = _ask_cut_at(3, tmp_path, monkeypatch)
    assert isinstance(e, NotesCutOff) and e.exit_code == 1
    said = str(e)
    assert said.startswith("the server cut off during the notes step (evidence window 3 of ")
    assert "closed the stream" in said and said.endswith("no answer was written") and "\n" not in said
    assert "partial answer" not in said
    # nothing kept as an answer; --json's object has the plan and the figures of the windows read
    assert e.partial == "" and e.answer.text == "" and e.answer.citations == ()
    assert e.answer.plan.task == "ask" and e.answer.stats["windows"] == 2


def test_a_call_the_server_cut_off_counts_in_the_figures(tmp_path, monkeypatch):
    """It was made and its prompt sent: model_calls and tokens_in left it out (2 and 22
    for three calls, the cut one's prompt counted 0)."""
    figures = _ask_cut_at(3, tmp_path, monkeypatch).answer.stats
    assert figures["model_calls"] == 3
    assert figures["tokens_in"] > 2 * 11  # the two whole calls' (the server's usage), and the cut one's estimate
    assert figures["tokens_out"] > 2 * 4  # and the pieces it sent


def test_a_cut_off_streams_prompt_is_counted_without_asking_the_server():
    with FakeOpenAI(script=["cut"]) as fake:
        b = backend(fake)
        with pytest.raises(StreamCutOffError):
            list(b.stream_chat(MSGS, PARAMS))
        assert fake.calls[-1][0] == "/v1/chat/completions"  # no /tokenize after the cut
    assert b.last_stats.prompt_tokens == b.tokens.local_chat(MSGS) > 0 and b.last_stats.new_tokens == 2


def test_a_summary_cut_off_in_its_notes_keeps_them_as_notes_not_a_summary(tmp_path):
    from tests.serve.helpers import run_cli

    doc = tmp_path / "doc.txt"
    doc.write_text(LONG)
    with FakeOpenAI(script=["ok", "ok", "cut"], models=SMALL_WINDOW) as fake:
        text = run_cli(["summarize", str(doc), "--backend", "openai", "--base-url", fake.url], tmp_path)
    assert text.returncode == 1 and "Traceback" not in text.stderr
    # the parts' notes, headed as notes; not the cut step's text, not marked as an answer cut off
    assert text.stdout.startswith("Notes from parts 1-2 of ") and "(the server cut off before the summary was written)" \
        in text.stdout
    assert text.stdout.rstrip().endswith("The answer is 42.") and "[answer cut off" not in text.stdout
    error = [line for line in text.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "the server cut off during the notes step (part 3 of " in error[0]
    assert "no summary was written: the notes of parts 1-2 are printed instead, headed as notes" in error[0]
    assert "partial answer" not in text.stderr

    with FakeOpenAI(script=["cut", "cut"], models=SMALL_WINDOW) as fake:  # cut in the first part: no notes yet
        text = run_cli(["summarize", str(doc), "--backend", "openai", "--base-url", fake.url], tmp_path)
        as_json = run_cli(["summarize", str(doc), "--backend", "openai", "--base-url", fake.url, "--json"], tmp_path)
    assert text.returncode == 1 and text.stdout.strip() == "" and "notes step (part 1 of " in text.stderr
    payload = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and payload["exit_code"] == 1 and payload["incomplete"] is True
    assert payload["answer"] == "" and payload["citations"] == [] and "notes step (part 1 of " in payload["error"]
    assert payload["plan"]["task"] == "summarize" and payload["figures"]["windows"] == 0
    assert payload["figures"]["model_calls"] == 1 and payload["figures"]["tokens_in"] > 0  # the cut call


def test_a_summarys_plan_says_the_windows_it_read(tmp_path):
    """The plan's reason said "map over 6 window(s)" beside `n_windows` 4 and
    `figures.windows` 4: the plan's count is an estimate, said as one before the run (the
    passages are packed by their exact sizes), and the plan the run carried out says its own."""
    from tests.serve.helpers import run_cli

    doc = tmp_path / "doc.txt"
    doc.write_text(LONG)
    with FakeOpenAI(models=SMALL_WINDOW) as fake:
        planned = run_cli(["plan", str(doc), "--backend", "openai", "--base-url", fake.url, "--json"], tmp_path)
        done = run_cli(["summarize", str(doc), "--backend", "openai", "--base-url", fake.url, "--json"], tmp_path)
    assert planned.returncode == 0 and done.returncode == 0, done.stderr
    before, after = json.loads(planned.stdout)["plan"], json.loads(done.stdout)
    assert [r for r in before["reasons"] if "window(s)" in r] == [
        f"map over about {before['n_windows']} window(s) of up to {before['evidence_budget']:,} tokens with running "
        "notes, then reduce"]
    n = after["figures"]["windows"]
    assert after["plan"]["n_windows"] == n == fake.chat_calls - 1  # each part's notes, then the summary
    assert [r for r in after["plan"]["reasons"] if "window(s)" in r] == [
        f"map over {n} window(s) of up to {before['evidence_budget']:,} tokens with running notes, then reduce"]
