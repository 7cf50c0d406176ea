"""Bad input: one line on stderr, the documented exit code, never a traceback.
None of these need the model, so they are fast."""

import json
import re
import subprocess
import sys

import pytest

from tests.ingest.fixtures import encrypt_pdf, make_image_only_pdf, make_text_pdf

from .conftest import LONG_TEXT, PDF as PDF_DOC, REPO, ROOT, empty_config, run_ktcli


def assert_one_line_error(proc, code, fragment):
    err = proc.stderr.decode()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert fragment.lower() in lines[0].lower(), err
    options = proc.args[: proc.args.index("--")] if "--" in proc.args else proc.args
    if "--json" in options:  # one object on stdout too, for a `| jq` reader
        assert json.loads(proc.stdout) == {"error": lines[0].removeprefix("error: "), "exit_code": code}
    else:
        assert proc.stdout == b""


def test_missing_path(cache):
    assert_one_line_error(run_ktcli(["ask", "no/such/file.txt", "why?"], cache), 3, "no such file")


def test_empty_question(cache):
    assert_one_line_error(run_ktcli(["ask", str(LONG_TEXT), "   "], cache), 2, "question is empty")


def test_empty_file(cache, tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("")
    assert_one_line_error(run_ktcli(["ask", str(f), "why?"], cache), 3, "empty")


def test_binary_file_given_explicitly(cache, tmp_path):
    f = tmp_path / "blob.bin"
    f.write_bytes(bytes(range(256)) * 64)
    assert_one_line_error(run_ktcli(["ask", str(f), "why?"], cache), 3, "binary")


def test_undecodable_text(cache, tmp_path):
    f = tmp_path / "odd.txt"
    f.write_bytes(bytes(range(160, 256)) * 50)  # high bytes no encoding reads as text
    proc = run_ktcli(["ask", str(f), "why?"], cache)
    assert_one_line_error(proc, 3, str(f.name))


def test_encrypted_pdf(cache, tmp_path):
    f = tmp_path / "secret.pdf"
    f.write_bytes(encrypt_pdf(make_text_pdf([["Top secret figures"]]), "hunter2"))
    assert_one_line_error(run_ktcli(["ask", str(f), "why?"], cache), 3, "password")


def test_image_only_pdf(cache, tmp_path):
    f = tmp_path / "scan.pdf"
    f.write_bytes(make_image_only_pdf(2))
    assert_one_line_error(run_ktcli(["ask", str(f), "why?"], cache), 3, "text")


def test_folder_with_nothing_left(cache, tmp_path):
    d = tmp_path / "bins"
    d.mkdir()
    (d / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    assert_one_line_error(run_ktcli(["summarize", str(d)], cache), 3, "bins")


@pytest.mark.parametrize("args, says", [
    (["ask", str(LONG_TEXT), "q", "--no-such-flag"], "no such option: --no-such-flag (see `ktcli ask --help`)"),
    (["plan", str(LONG_TEXT), "q", "--top-k", "abc"], "invalid value for '--top-k'"),
    (["serve", "--port", "70000"], "invalid value for '--port'"),
    (["ask"], "missing argument"),
    (["bogus"], "no such command 'bogus'"),
    (["ask", str(LONG_TEXT), "--json", "--top-k", "abc", "q"], "invalid value for '--top-k'"),  # one JSON object too
    (["ask", str(LONG_TEXT), "--top-k", "abc", "--", "--json"], "invalid value for '--top-k'"),  # a question: no JSON
])
def test_the_parsers_own_errors_are_one_line_too(cache, args, says):
    # typer's boxed block (5-6 lines of box drawing, even in a log file) is not shown.
    proc = run_ktcli(args, cache)
    assert_one_line_error(proc, 2, says)
    assert len(proc.stderr.decode().strip().splitlines()) == 1


def test_a_closed_standard_output_is_one_line(cache):
    import os
    import subprocess
    import sys

    from .conftest import ROOT, empty_config

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KTCLI_")},
           "KTCLI_CACHE_DIR": str(cache), "KTCLI_CONFIG": str(empty_config(cache))}
    proc = subprocess.run([sys.executable, "-m", "ktcli.cli.app", "plan", str(LONG_TEXT), "q"], env=env, cwd=ROOT,
                          stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1), timeout=120)  # `>&-`
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.startswith("error: standard output is closed") and "Traceback" not in err


@pytest.mark.parametrize("model, says", [
    ("missing.gguf", "--model missing.gguf: no such file, folder or bundled model"),
    (str(LONG_TEXT), "a model file must be .gguf"),
    (str(LONG_TEXT.parent), "folder has no config.json"),
    # a mistyped folder under one that exists (the tests run in the repo: sample_docs/)
    ("sample_docs/no-such-model", "--model sample_docs/no-such-model: no such file, folder or bundled model"),
])
def test_bad_model_is_usage_error(cache, model, says):
    assert_one_line_error(run_ktcli(["ask", str(LONG_TEXT), "q", "--model", model], cache), 2, says)


def test_a_model_that_is_not_one_is_usage_error(cache, tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model\n")
    proc = run_ktcli(["plan", str(LONG_TEXT), "q", "--model", str(fake)], cache)
    assert_one_line_error(proc, 2, "fake.gguf: not a readable GGUF file")
    folder = tmp_path / "notmodel"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    # a model folder without its weights: said by the plan too (the run said it with exit
    # 3 from our engine, an internal error from transformers', and the plan planned it)
    for command in (["plan"], ["ask"], ["ask", "--engine", "hf"]):
        proc = run_ktcli([*command, str(LONG_TEXT), "q", "--model", str(folder)], cache)
        assert_one_line_error(proc, 2, "folder has no weights")
    (folder / "model.safetensors").write_bytes(b"")
    proc = run_ktcli(["ask", str(LONG_TEXT), "q", "--model", str(folder)], cache)
    assert_one_line_error(proc, 2, "config.json lacks 'num_attention_heads'")


def test_a_gguf_of_an_architecture_ktcli_cannot_convert_is_refused_first(cache, tmp_path):
    """It was refused after a 30 s conversion, as an internal ValueError or RuntimeError."""
    from tests.engine.conftest import build_tiny
    from tests.engine.tiny_gguf import write_gguf

    gguf = write_gguf(build_tiny("llama", tmp_path / "tiny"), tmp_path / "gem.gguf", arch="gemma")
    for command in (["plan"], ["ask"], ["ask", "--engine", "hf"]):
        proc = run_ktcli([*command, str(LONG_TEXT), "q", "--model", str(gguf)], cache)
        assert_one_line_error(proc, 2, "gem.gguf: GGUF architecture 'gemma' is not supported "
                                       "(ktcli converts llama, qwen2, qwen3 GGUFs")


def _tiny(tmp_path, name="tiny", tokenizer=True, **config):
    """A tiny random llama folder; `tokenizer`: with a byte-level tokenizer.json (no chat template)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.engine.conftest import build_tiny

    folder = build_tiny("llama", tmp_path / name, **{"max_position_embeddings": 4096, **config})  # a window a plan fits
    if tokenizer:
        tok = Tokenizer(models.BPE(vocab={chr(65 + i % 26) * (1 + i // 26): i for i in range(256)}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel()
        tok.save(str(folder / "tokenizer.json"))
    return folder


def test_models_the_engines_cannot_load_are_one_line(cache, tmp_path):
    """Each was an internal error (exit 1) from one engine or both."""
    doc = tmp_path / "doc.txt"
    doc.write_text("The harbor light was built in 1902.\n")
    partial = _tiny(tmp_path, "partial", partial_rotary_factor=0.5)
    assert_one_line_error(run_ktcli(["ask", str(doc), "q", "--model", str(partial)], cache), 2,
                          "partial_rotary_factor 0.5) are not supported by the ktcli engine; --engine hf runs")
    bare = _tiny(tmp_path, "bare", tokenizer=False)
    for engine in ("ktcli", "hf"):
        assert_one_line_error(run_ktcli(["ask", str(doc), "q", "--model", str(bare), "--engine", engine], cache), 2,
                              f"no tokenizer in {bare} (tokenizer.json)")
    plain = _tiny(tmp_path, "plain")
    for engine in ("ktcli", "hf"):
        assert_one_line_error(run_ktcli(["ask", str(doc), "q", "--model", str(plain), "--engine", engine], cache), 2,
                              "this model has no chat template")
    # a slow tokenizer's files: transformers reads them, our engine does not
    (bare / "vocab.json").write_text("{}")
    (bare / "merges.txt").write_text("")
    assert_one_line_error(run_ktcli(["ask", str(doc), "q", "--model", str(bare)], cache), 2,
                          f"no tokenizer in {bare} (tokenizer.json); it has vocab.json and merges.txt, which --engine hf reads")


def test_serve_refuses_a_model_without_a_tokenizer_and_says_one_without_a_chat_template(cache, tmp_path):
    """It served both: a folder without tokenizer.json answered every request with a 500,
    one without a chat template answered chat requests with a 500."""
    from tests.serve.helpers import request, start_serve

    bare = _tiny(tmp_path, "bare", tokenizer=False)
    assert_one_line_error(run_ktcli(["serve", "--port", "0", "--model", str(bare)], cache), 2,
                          f"no tokenizer in {bare} (tokenizer.json)")
    plain = _tiny(tmp_path, "plain")
    served = start_serve(tmp_path / "served", "--model", str(plain), "--weights", "fp32")
    try:
        status, body = request(served.port, "POST", "/v1/chat/completions",
                               {"model": served.model, "messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 2})
        assert status == 400 and "no chat template" in body["error"]["message"], body
        status, body = request(served.port, "POST", "/v1/completions",
                               {"model": served.model, "prompt": "ABC", "max_tokens": 2})
        assert status == 200, body
        assert "no chat template" in served.log.read_text() and "/v1/completions works" in served.log.read_text()
    finally:
        served.stop()


def test_a_shard_the_index_names_that_is_missing_is_named(cache, tmp_path):
    folder = _tiny(tmp_path, tokenizer=False)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    for command in (["plan"], ["ask"], ["ask", "--engine", "hf"]):
        proc = run_ktcli([*command, str(LONG_TEXT), "q", "--model", str(folder)], cache)
        assert_one_line_error(proc, 2, "model-00002-of-00002.safetensors, named in model.safetensors.index.json, "
                                       "is missing")


def test_a_quantized_checkpoint_is_refused_by_our_engine(cache, tmp_path):
    """An FP8 release's codes read as floats loaded without a word and generated noise."""
    folder = tmp_path / "fp8model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "vocab_size": 256,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}))
    (folder / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # a header, no tensors
    for command in (["plan"], ["ask"]):
        proc = run_ktcli([*command, str(LONG_TEXT), "q", "--model", str(folder)], cache)
        assert_one_line_error(proc, 2, "a fp8-quantized checkpoint: the ktcli engine reads float weights")
    from ktcli.engine.config import from_hf_dict
    from ktcli.errors import UsageError

    with pytest.raises(UsageError, match="fp8-quantized"):  # the engine's own guard (API, serve)
        from_hf_dict(json.loads((folder / "config.json").read_text()))


def test_bad_model_fails_before_reading_input(cache, tmp_path):
    # a typo in --model is reported first, not after walking (here: failing on) the input
    proc = run_ktcli(["ask", str(tmp_path / "absent.txt"), "q", "--model", "smollm"], cache)
    assert_one_line_error(proc, 2, "--model smollm")


def test_repo_id_not_in_local_cache(cache):
    """A usage error (2), as a --model path that does not exist: it was 1."""
    proc = run_ktcli(["ask", str(LONG_TEXT), "q", "--model", "nobody/not-a-model"], cache)
    assert_one_line_error(proc, 2, "not in the local Hugging Face cache")


def test_a_model_folder_with_weights_cut_short_is_a_usage_error(cache, tmp_path):
    """Every other problem of the --model folder was exit 2; its truncated
    model.safetensors was 3, an input error."""
    folder = _tiny(tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    for command in (["plan"], ["ask"]):
        proc = run_ktcli([*command, str(LONG_TEXT), "q", "--model", str(folder)], cache)
        assert_one_line_error(proc, 2, f"{weights}: cut short")


def test_full_mode_that_cannot_fit(cache):
    assert_one_line_error(run_ktcli(["ask", str(LONG_TEXT), "q", "--mode", "full"], cache), 2, "window")


def test_bad_outline_choice(cache):
    proc = run_ktcli(["summarize", str(REPO), "--outline", "sometimes"], cache)
    assert_one_line_error(proc, 2, "--outline 'sometimes': choose auto, always or never")


@pytest.mark.parametrize("value", ["lots", "-3"])
def test_bad_memory_budget(cache, value):
    proc = run_ktcli(["ask", str(LONG_TEXT), "q", "--max-memory", value], cache)
    assert_one_line_error(proc, 2, "--max-memory")


def test_help_shows_the_built_in_defaults(cache):
    proc = run_ktcli(["ask", "--help"], cache, extra_env={"COLUMNS": "200"})
    out = proc.stdout.decode()
    assert proc.returncode == 0
    for fragment in ("(default 8)", "(default 384)", "(default 256)", "(default 2,000,000)"):
        assert fragment in out, out


def test_help_names_values_not_python_types(cache):
    """typer 0.29 printed `--help <bool>`, `PATHS... QUESTION <list[str]>`, `--top-k <int>`."""
    for command in ("ask", "summarize", "plan", "serve"):
        proc = run_ktcli([command, "--help"], cache, extra_env={"COLUMNS": "200"})
        out = proc.stdout.decode()
        assert proc.returncode == 0 and "--help" in out, out
        assert not re.search(r"<(bool|str|int|float|list\[str\])>", out), out
    out = run_ktcli(["ask", "--help"], cache, extra_env={"COLUMNS": "200"}).stdout.decode()
    assert re.search(r"--top-k +N ", out) and re.search(r"--attention +POLICY ", out), out
    # and the usage line as the metavar says it, not braced: `{PATHS... [QUESTION]}...`
    assert "Usage: ktcli ask [OPTIONS] PATHS... QUESTION\n" in re.sub(r" +\n", "\n", out), out
    plan_usage = run_ktcli(["plan", "--help"], cache, extra_env={"COLUMNS": "200"}).stdout.decode()
    assert "Usage: ktcli plan [OPTIONS] PATHS... [QUESTION]\n" in re.sub(r" +\n", "\n", plan_usage), plan_usage


def test_a_python_warning_is_one_line_in_the_console_style(monkeypatch, capsys):
    """A library's warning (kernels falling back from a GPU kernel, say) reaches stderr as
    the reporter's one `! ...` line, not the file, line number and source line Python
    prints by default, and waits, like the reporter's own, while the answer streams."""
    import warnings

    from ktcli.cli.common import Options

    monkeypatch.delenv("KTCLI_DEBUG", raising=False)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # restored after the test
    reporter = Options({}).reporter()
    reporter.answer_text("An answer that stops mid-line")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("paged_attention_decode: using the torch version", RuntimeWarning)
    assert capsys.readouterr().err == ""
    reporter.figures("mode full")
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "! paged_attention_decode: using the torch version"
    assert "RuntimeWarning" not in err and ".py:" not in err


def test_a_question_forgotten_is_said_so(cache):
    assert_one_line_error(run_ktcli(["ask", str(LONG_TEXT)], cache), 2, "give the paths, then the question")
    # the last argument names a file: the question was left out, not "README.md" asked
    proc = run_ktcli(["ask", str(LONG_TEXT), str(REPO / "README.md")], cache)
    assert_one_line_error(proc, 2, "is a file or folder: put the question after the paths (a question that is a path's")
    # '-' last is standard input, not the question "-"
    proc = run_ktcli(["ask", str(LONG_TEXT), "-"], cache, stdin=b"What is this?")
    assert_one_line_error(proc, 2, "'-' means standard input: put the question after the paths")


def test_a_question_too_long_to_be_a_file_name_is_a_question(cache):
    # Over 255 bytes: checking whether it names a file raised "File name too long".
    question = "Which port does the pipeline listen on by default, " * 6 + "and why?"
    proc = run_ktcli(["plan", str(REPO / "README.md"), question], cache)
    assert proc.returncode == 0 and b"question" in proc.stderr + proc.stdout, proc.stderr
    proc = run_ktcli(["summarize", str(REPO / "README.md"), question], cache)
    assert_one_line_error(proc, 2, "summarize takes no question")  # said as the question it is
    proc = run_ktcli(["summarize", str(REPO / "README.md"), "x" * 300], cache)
    assert_one_line_error(proc, 3, "no such file or folder (File name too long)")


def test_a_blank_question_to_plan_is_said_so(cache):
    for blank in ("   ", ""):  # "" was taken for a path (Path("") is "."): "an input path is empty"
        assert_one_line_error(run_ktcli(["plan", str(REPO / "README.md"), blank], cache), 2, "the question is empty")


def test_plan_given_the_command_it_plans_says_how_to_write_it(cache):
    """`ktcli plan summarize repo/` said "summarize: no such file or directory"."""
    assert_one_line_error(run_ktcli(["plan", "summarize", str(REPO / "sample_docs")], cache), 2,
                          f"plan takes the paths and question without the command: `ktcli plan {REPO / 'sample_docs'}` "
                          "(with no question, plans a summary)")
    assert_one_line_error(run_ktcli(["plan", "ask", "r.pdf", "What is it?"], cache), 2,
                          "`ktcli plan r.pdf 'What is it?'` (plans that question)")


def test_an_empty_path_is_not_the_current_folder(cache):
    # `ktcli ask "$DIR" q` with DIR unset: Path("") is ".", which must not be walked
    assert_one_line_error(run_ktcli(["ask", "", "why?"], cache), 3, "an input path is empty")


def test_a_question_that_looks_like_a_missing_path_is_pointed_out(cache):
    proc = run_ktcli(["plan", str(REPO / "README.md"), "docs/missing.txt"], cache)
    assert proc.returncode == 0
    assert "! the question 'docs/missing.txt' looks like a path, and none is there" in proc.stderr.decode()
    proc = run_ktcli(["plan", str(REPO / "README.md"), "What is v1.2 of it?"], cache)
    assert "looks like a path" not in proc.stderr.decode()


def test_what_the_ktcli_engine_cannot_run_is_refused_by_the_plan(cache, tmp_path):
    # The plan used to show a normal plan (sparse, for a sliding-window model under
    # --max-seconds) and the run then failed with exit 3; a GPT-2 folder was "config.json
    # lacks 'num_attention_heads'", even with --engine hf.
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.engine.conftest import build_tiny

    mistral = build_tiny("mistral", tmp_path / "mistral", sliding_window=24, max_position_embeddings=4096)
    doc = tmp_path / "doc.txt"
    doc.write_text("The keeper of the Harbor Light is Ada Quill.\n")
    for flag in (["--kv-dtype", "int8"], ["--attention", "topk"], ["--rope-scaling", "yarn:2"], ["--mode", "sparse"]):
        assert_one_line_error(run_ktcli(["plan", str(doc), "Who?", "--model", str(mistral), *flag], cache), 2,
                              "this model has sliding-window layers")
    proc = run_ktcli(["plan", str(LONG_TEXT), "Who?", "--model", str(mistral), "--max-seconds", "600", "--json"], cache)
    assert proc.returncode == 0 and json.loads(proc.stdout)["plan"]["mode"] == "retrieval"
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=256, n_positions=1024)).save_pretrained(
        tmp_path / "gpt2")
    assert_one_line_error(run_ktcli(["plan", str(doc), "Who?", "--model", str(tmp_path / "gpt2")], cache), 2,
                          "model type 'gpt2' is not supported by the ktcli engine (use --engine hf)")
    proc = run_ktcli(["plan", str(doc), "Who?", "--model", str(tmp_path / "gpt2"), "--engine", "hf", "--json"], cache)
    assert proc.returncode == 0 and json.loads(proc.stdout)["plan"]["context_window"] == 1024


def test_version_and_quiet_plan(cache):
    proc = run_ktcli(["--version"], cache)
    assert proc.returncode == 0 and proc.stdout.decode().startswith("ktcli ")
    proc = run_ktcli(["plan", str(REPO / "README.md"), "What is this?", "--quiet"], cache)
    assert proc.returncode == 0 and proc.stderr == b"" and b"mode" in proc.stdout
    # ... but a file left out is still said: quiet is no licence to lose input unseen
    folder = cache.parent / "with-binary"
    folder.mkdir()
    (folder / "notes.txt").write_text("The gate code is 4471.\n")
    (folder / "blob.bin").write_bytes(bytes(range(256)) * 8)
    proc = run_ktcli(["plan", str(folder), "What is the gate code?", "--quiet"], cache)
    assert proc.returncode == 0 and proc.stderr.decode().splitlines() == ["! skipped " + str(folder / "blob.bin") + ": binary"]


def test_no_color_means_no_styling(cache, tmp_path):
    # Rich alone drops colours under NO_COLOR but keeps bold and dim
    proc = run_ktcli(["ask", str(tmp_path / "missing.txt"), "q"], cache,
                     extra_env={"NO_COLOR": "1", "TERM": "xterm-256color", "FORCE_COLOR": "1"})
    assert proc.returncode == 3 and b"\x1b[" not in proc.stderr and b"\nerror: " in proc.stderr


def test_a_ctrl_c_delivered_twice_is_answered_once(monkeypatch):
    """Probe 105: `timeout -s INT` signals the process and its group; the second SIGINT
    landed in the exit's thread join, a traceback under "error: interrupted". A second
    Ctrl-C asked for later ends the process at once."""
    import os
    import time

    from ktcli.cli import app

    monkeypatch.setattr(app, "_INTERRUPTED_AT", [])
    with pytest.raises(KeyboardInterrupt):
        app._on_sigint(2, None)
    assert app._on_sigint(2, None) is None  # the same one again: ignored
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    later = time.monotonic() + app.SAME_INTERRUPT_S + 1
    monkeypatch.setattr(time, "monotonic", lambda: later)
    app._on_sigint(2, None)
    assert exits == [130]


def test_an_interrupted_answer_closes_its_line(capsys, monkeypatch):
    # Ctrl-C mid-answer: the error line must not land inside the answer's last line
    import warnings

    from ktcli.cli.common import Options, run_guarded

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # the reporter replaces it
    opts = Options({})
    reporter = opts.reporter()

    def body():
        reporter.answer_text("The keeper is Ada")
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exit_:
        run_guarded(opts, body)
    assert exit_.value.code == 130
    out, err = capsys.readouterr()
    assert out == "The keeper is Ada\n" and "error: interrupted" in err


@pytest.mark.parametrize("as_json", [False, True])
def test_a_summary_interrupted_while_reading_prints_its_notes(capsys, monkeypatch, as_json):
    import json
    import warnings

    from ktcli.cli.common import Options, run_guarded
    from ktcli.errors import InterruptedWithNotes
    from ktcli.types import Answer, Mode, Plan, Skipped

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # the reporter replaces it
    opts = Options({"json": as_json})
    opts.reporter().warn("skipped logo.png: binary")
    notes = "Notes from parts 1-2 of 9:\n\n- a fact [1]"
    plan = Plan(Mode.RETRIEVAL, "summarize", 9000, 0, 8192, 512, 1000, 3, 40, 9, 0, 60.0, 10**9)
    # as `summarize` raises it: the notes' Answer too (--json had only the notes and the
    # error, where an interrupted answer's object had its plan, figures and skipped files)
    kept = Answer(notes, (), plan, {"windows": 2, "labels_moved": 0}, (Skipped("logo.png", "binary"),))

    def body():
        raise InterruptedWithNotes("interrupted while reading part 3 of 9", notes, kept)

    with pytest.raises(SystemExit) as exit_:
        run_guarded(opts, body)
    assert exit_.value.code == 130
    out, err = capsys.readouterr()
    if as_json:
        payload = json.loads(out)
        assert list(payload) == ["answer", "citations", "plan", "figures", "skipped", "warnings", "incomplete",
                                 "error", "exit_code"]
        assert {k: payload[k] for k in ("answer", "citations", "incomplete", "error", "exit_code")} == {
            "answer": notes, "citations": [], "incomplete": True, "error": "interrupted while reading part 3 of 9",
            "exit_code": 130}
        assert payload["plan"]["task"] == "summarize" and payload["plan"]["n_windows"] == 9
        assert payload["figures"] == {"windows": 2, "labels_moved": 0}
        assert payload["skipped"] == [{"path": "logo.png", "reason": "binary", "replaced": False, "part": False}]
        assert payload["warnings"] == ["skipped logo.png: binary"]
    else:
        assert out == "Notes from parts 1-2 of 9:\n\n- a fact [1]\n"
    assert "error: interrupted while reading part 3 of 9" in err


def test_no_arguments_show_the_help_once(cache):
    proc = run_ktcli([], cache)
    assert proc.returncode == 2 and proc.stdout.decode().count("Usage") == 1


def test_a_full_disk_is_said_in_one_line(cache):
    """`> /dev/full` was "internal error: OSError: [Errno 28] ..."."""
    with open("/dev/full", "wb") as full:
        proc = run_ktcli(["plan", str(LONG_TEXT), "q"], cache, stdout=full)
    err = proc.stderr.decode()
    assert proc.returncode == 1 and "error: No space left on device" in err and "internal error" not in err
    with open("/dev/full", "wb") as full:  # the help too: it was a traceback
        proc = run_ktcli(["--help"], cache, stdout=full)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr.decode()


def test_settings_are_checked_before_the_input_is_read(cache, tmp_path):
    """A bad embedder was said after the model had loaded; --backend openai without a
    server after the input was read (here the input does not even exist)."""
    absent = str(tmp_path / "absent.txt")
    proc = run_ktcli(["plan", str(LONG_TEXT), "q"], cache, extra_env={"KTCLI_EMBEDDER": str(tmp_path / "nope")})
    assert_one_line_error(proc, 2, "not a sentence-transformers folder")
    assert_one_line_error(run_ktcli(["ask", absent, "q", "--backend", "openai"], cache), 2, "needs --base-url")


@pytest.mark.parametrize("args", [["--help"], ["ask", "--help"], ["--version"]])
def test_a_reader_that_left_early_is_no_error(cache, args):
    """`ktcli --help | head -1`: a pipe whose reader has gone is exit 0 and no trace (rich,
    which writes the help, ended it with exit 1)."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before a byte is written: every write fails
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KTCLI_")} | {"KTCLI_CACHE_DIR": str(cache)}
        done = subprocess.run([sys.executable, "-m", "ktcli.cli.app", *args], stdout=write, stderr=subprocess.PIPE,
                              env=env, timeout=60)
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == b""


def test_a_non_utf8_locale_reads_the_question_and_writes_what_it_cannot_encode(cache, tmp_path):
    """LC_ALL=C with PYTHONUTF8=0: the question's "ü" reached the tokenizer as lone
    surrogates (an internal error), and an answer holding "ë" failed to print."""
    doc = tmp_path / "owner.txt"
    doc.write_text("The copyright is held by Zoë Ltd.\n", encoding="utf-8")
    done = run_ktcli(["plan", str(doc), "Who holds the copyright? ü"], cache,
                     extra_env={"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"})
    assert done.returncode == 0, done.stderr
    assert "Who holds the copyright? ü" in done.stdout.decode("utf-8")


def test_a_question_that_starts_with_a_dash_is_told_to_come_after_the_double_dash(cache):
    done = run_ktcli(["ask", "x.txt", "-5 degrees?"], cache)
    assert done.returncode == 2
    assert ("a question that starts with '-' goes after `--`, options before it: ktcli ask [OPTIONS] PATHS -- QUESTION"
            in done.stderr.decode())
    assert "see `ktcli ask --help`" in run_ktcli(["ask", "x.txt", "--bogus", "q"], cache).stderr.decode()
    # options after `--` are arguments: -q was taken for the question, --json for a path
    assert_one_line_error(run_ktcli(["ask", str(LONG_TEXT), "--", "-5 degrees?", "--json", "-q"], cache), 2,
                          "'-q' is an option: options go before `--`")


def test_plan_says_which_option_the_planned_command_would_not_use(cache):
    summary = run_ktcli(["plan", str(LONG_TEXT), "--top-k", "3"], cache)
    assert summary.returncode == 0 and "--top-k is for a question" in summary.stderr.decode()
    question = run_ktcli(["plan", str(LONG_TEXT), "What is a list?", "--outline", "always"], cache)
    assert question.returncode == 0 and "--outline is for a summary" in question.stderr.decode()


def test_an_error_under_json_is_one_object_on_stdout_too(cache):
    assert_one_line_error(run_ktcli(["ask", "no/such/file.txt", "why?", "--json"], cache), 3, "no such file")
    assert_one_line_error(run_ktcli(["plan", "no/such/file.txt", "--json"], cache), 3, "no such file")


@pytest.mark.parametrize("as_json", [False, True])
def test_an_answer_interrupted_while_streaming_keeps_its_sources(capsys, monkeypatch, as_json):
    import json
    import warnings

    from ktcli.cli.common import Options, run_guarded
    from ktcli.errors import InterruptedAnswer
    from ktcli.types import Answer, Citation, Mode, Plan, Span

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # the reporter replaces it
    opts = Options({"json": as_json})
    reporter = opts.reporter()
    plan = Plan(mode=Mode("full"), task="ask", input_tokens=9, question_tokens=3, context_window=8192,
                answer_budget=256, evidence_budget=7000, n_documents=1, n_chunks=1, n_windows=1, top_k=0,
                est_seconds=1.0, est_memory_bytes=1)
    answer = Answer("The keeper is Ada", (Citation("a.txt:3", Span("a.txt", 3, 3), label=1),), plan)

    def body():
        reporter.answer_text("The keeper is Ada")
        raise InterruptedAnswer("interrupted while the answer streamed", answer)

    with pytest.raises(SystemExit) as exit_:
        run_guarded(opts, body)
    assert exit_.value.code == 130
    out, err = capsys.readouterr()
    if as_json:
        payload = json.loads(out)
        assert payload["incomplete"] and payload["answer"] == "The keeper is Ada" and payload["citations"][0]["ref"] == "a.txt:3"
    else:
        assert out == "The keeper is Ada\n\nSources:\n  [1] a.txt:3\n" and "error: interrupted" in err


def test_python_dash_m_ktcli_runs_the_cli(cache):
    proc = subprocess.run([sys.executable, "-m", "ktcli", "--version"], capture_output=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.decode().startswith("ktcli"), proc.stderr


def _summarize_keeper(backend, as_json: bool, monkeypatch, tmp_path, capsys) -> tuple[int, str, str]:
    """`ktcli summarize keeper.txt` in this process on `backend` (a fake that interrupts its
    own stream): the exit code, stdout and stderr."""
    import warnings

    from ktcli.cli.common import Options, run_guarded
    from ktcli.pipeline import api

    doc = tmp_path / "keeper.txt"
    doc.write_text("The keeper of the lighthouse is Ada Lovelace.\nShe lights the lamp at dusk.\n")
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # the reporter replaces it
    monkeypatch.setenv("KTCLI_CONFIG", str(empty_config(tmp_path)))
    monkeypatch.setenv("KTCLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(api, "_load", lambda *a: backend)
    opts = Options({"json": as_json, "mode": "full"})
    with pytest.raises(SystemExit) as exit_:
        run_guarded(opts, lambda: opts.run_summarize([str(doc)]))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.mark.parametrize("as_json", [False, True])
def test_a_summary_interrupted_while_streaming_keeps_the_part_shown(capsys, monkeypatch, tmp_path, as_json):
    """`summarize --json` cut by Ctrl-C mid-summary printed only {"error": "interrupted"},
    and text mode left the part shown without Sources; `ask` keeps both."""
    from tests.pipeline.fake_backend import FakeBackend

    class CutSummary(FakeBackend):
        def _reply(self, messages):
            return "The keeper of the lighthouse is Ada Lovelace."

        def stream_chat(self, messages, params):
            for i, piece in enumerate(super().stream_chat(messages, params)):
                if i == 4:
                    raise KeyboardInterrupt
                yield piece

    code, out, err = _summarize_keeper(CutSummary(), as_json, monkeypatch, tmp_path, capsys)
    assert code == 130
    if as_json:
        payload = json.loads(out)
        assert payload["incomplete"] and payload["answer"] == "The keeper of the"
        assert payload["citations"][0]["path"].endswith("keeper.txt")
    else:
        assert out.startswith("The keeper of the") and "Sources:" in out and "keeper.txt" in out
    assert "error: interrupted while the answer streamed" in err


@pytest.mark.parametrize("name, damage, says", [
    ("tokenizer.json", "{broken", "tokenizer.json cannot be read (key must be a string"),
    ("tokenizer_config.json", "{broken", "tokenizer_config.json cannot be read (expecting property name"),
    ("config.json", None, "config.json is not a model config (num_hidden_layers is 0, not a whole number"),
])
def test_a_damaged_model_file_is_named_in_one_line(cache, tmp_path, name, damage, says):
    """A corrupt tokenizer.json was "internal error: Exception: key must be a string...",
    num_hidden_layers 0 "internal error: ZeroDivisionError"; a corrupt config.json is a
    usage error naming the file (exit 2), and so are these."""
    doc = tmp_path / "doc.txt"
    doc.write_text("The harbor light was built in 1902.\n")
    folder = _tiny(tmp_path, num_hidden_layers=0) if damage is None else _tiny(tmp_path)
    if damage is not None:
        (folder / name).write_text(damage)
    proc = run_ktcli(["ask", str(doc), "q", "--model", str(folder), "--max-new-tokens", "5"], cache)
    assert_one_line_error(proc, 2, says)
    assert str(folder) in proc.stderr.decode()


def test_chunks_too_small_to_answer_from_are_warned(cache):
    """`--chunk-tokens 1 --mode retrieval` was taken without a word: 78,766 one-token
    chunks, the top 8 retrieved. Warned (not refused): the run works, and a small chunk
    may be meant; a summary, which joins neighbouring chunks, is not warned."""
    said = "--chunk-tokens 8: the "
    ask = run_ktcli(["plan", str(LONG_TEXT), "What is a list?", "--chunk-tokens", "8", "--mode", "retrieval"], cache)
    assert ask.returncode == 0 and said in ask.stderr.decode()
    assert "too little to answer from (under 32" in ask.stderr.decode()
    fine = run_ktcli(["plan", str(LONG_TEXT), "What is a list?", "--chunk-tokens", "64", "--mode", "retrieval"], cache)
    assert fine.returncode == 0 and "--chunk-tokens" not in fine.stderr.decode()
    summary = run_ktcli(["plan", str(LONG_TEXT), "--chunk-tokens", "8", "--mode", "retrieval"], cache)
    assert summary.returncode == 0 and "--chunk-tokens" not in summary.stderr.decode()


def test_serve_leaves_a_config_files_remote_backend_settings_to_the_client(cache, tmp_path, monkeypatch):
    """The config docs/remote-backends.md recommends (backend "openai", its model, its key)
    made `ktcli serve` look for the remote model locally, and, given --model, ask clients
    for the remote server's secret."""
    from ktcli.cli.common import Options

    config = tmp_path / "remote.toml"
    config.write_text('backend = "openai"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "Qwen/Qwen2.5-72B-Instruct"\n'
                      'api_key = "sk-remote"\n')
    proc = run_ktcli(["serve", "--port", "0"], cache, extra_env={"KTCLI_CONFIG": str(config)})
    assert_one_line_error(proc, 2, f"ktcli serve serves a local model, and model in {config} names the remote backend's")
    served = []
    monkeypatch.setattr("ktcli.serve.run.serve", lambda settings, options, *a, **k: served.append(options))
    monkeypatch.setenv("KTCLI_CONFIG", str(config))
    monkeypatch.delenv("KTCLI_API_KEY", raising=False)
    Options({"model": "smollm2"}).run_serve("127.0.0.1", 0, 4, 30, False, [])
    assert served[0].api_key == ""  # not the remote server's secret
    monkeypatch.setenv("KTCLI_API_KEY", "local-key")
    Options({"model": "smollm2"}).run_serve("127.0.0.1", 0, 4, 30, False, [])
    assert served[1].api_key == "local-key"
    # a local backend's config: its key can only be the server's; a model from the
    # environment is the user's choice for this command
    monkeypatch.delenv("KTCLI_API_KEY")
    config.write_text('api_key = "server-key"\n')
    Options({}).run_serve("127.0.0.1", 0, 4, 30, False, [])
    assert served[2].api_key == "server-key"
    config.write_text('backend = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n')
    monkeypatch.setenv("KTCLI_MODEL", "smollm2")
    Options({}).run_serve("127.0.0.1", 0, 4, 30, False, [])
    assert len(served) == 4


def test_sigterm_ends_an_answer_as_ctrl_c_does_with_its_own_code(cache):
    """`timeout`, a CI job's cancel and `docker stop` send SIGTERM: the answer stopped mid-line
    with no Sources and no word said, and --json left stdout empty."""
    import os
    import signal

    env = {k: v for k, v in os.environ.items() if not k.startswith("KTCLI_")}
    env.update({"KTCLI_CACHE_DIR": str(cache), "KTCLI_CONFIG": str(empty_config(cache)), "KTCLI_THREADS": "2",
                "HF_HUB_OFFLINE": "1"})
    proc = subprocess.Popen([sys.executable, "-m", "ktcli.cli.app", "ask", str(PDF_DOC),
                             "Describe every section of the report in detail.", "--mode", "full", "--max-new-tokens", "300"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = proc.stdout.read(40)  # the answer is streaming
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    out, err = (first + out).decode(), err.decode()
    assert proc.returncode == 143, err
    # the part shown keeps what it was read from: its Sources, or the pages read where no
    # sentence of it matched a line yet
    listing = re.search(r"\n\n(Sources:|Read \(no sentence of the answer matched a line of it\):)\n(.*)", out, re.S)
    assert listing and "harbor-light-annual-report-2023.pdf" in listing[2], out
    assert "error: terminated (SIGTERM) while the answer streamed" in err and "Traceback" not in err


def test_sigterm_during_a_json_summary_still_gives_its_object(capsys, monkeypatch, tmp_path):
    from ktcli import errors
    from ktcli.cli.app import _on_sigterm
    from tests.pipeline.fake_backend import FakeBackend

    class Terminated(FakeBackend):
        def stream_chat(self, messages, params):
            for i, piece in enumerate(super().stream_chat(messages, params)):
                if i == 3:
                    _on_sigterm(15, None)  # as the signal would, inside the stream
                yield piece

    monkeypatch.setattr(errors, "_terminated", [])
    code, out, err = _summarize_keeper(Terminated(), True, monkeypatch, tmp_path, capsys)
    assert code == 143
    payload = json.loads(out)
    assert payload["incomplete"] and payload["error"] == "terminated (SIGTERM) while the answer streamed"
    _on_sigterm(15, None)  # a second SIGTERM while that is done is not another interrupt


@pytest.mark.parametrize("as_json", [False, True])
def test_sigterm_while_the_prompt_cache_is_written_keeps_the_whole_answer(capsys, monkeypatch, tmp_path, as_json):
    """SIGTERM after the answer, while the engine wrote its prompt's K/V (a second or more
    for a long input): text output had shown the answer and its Sources, but `--json`
    printed only {"error": "terminated (SIGTERM)", "exit_code": 143} (probe 104)."""
    from ktcli import errors
    from ktcli.cli.app import _on_sigterm
    from tests.pipeline.fake_backend import FakeBackend

    class TerminatedWhileKeeping(FakeBackend):
        def finish(self):
            _on_sigterm(15, None)  # as the signal would, inside the write
            return super().finish()

    monkeypatch.setattr(errors, "_terminated", [])
    code, out, err = _summarize_keeper(TerminatedWhileKeeping(), as_json, monkeypatch, tmp_path, capsys)
    assert code == 143 and "terminated (SIGTERM)" in err and "Traceback" not in err
    if as_json:
        payload = json.loads(out)
        assert payload["answer"] == "I could not find it." and "plan" in payload and payload["exit_code"] == 143
        assert payload["incomplete"] is False and payload["error"].startswith("terminated (SIGTERM) after the answer")
    else:
        assert out.startswith("I could not find it.\n") and "keeper.txt" in out
    _on_sigterm(15, None)  # a second SIGTERM while that is done is not another interrupt


def test_a_question_given_to_summarize_is_said_as_one(cache, tmp_path):
    """It was refused as a missing file named like the question."""
    proc = run_ktcli(["summarize", str(PDF_DOC), "What is the notice period?"], cache)
    assert_one_line_error(proc, 2, "summarize takes no question")
    assert "ktcli ask" in proc.stderr.decode()
    # a missing file is still one
    assert_one_line_error(run_ktcli(["summarize", str(tmp_path / "gone.txt")], cache), 3, "no such file")
