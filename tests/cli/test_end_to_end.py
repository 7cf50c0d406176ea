"""The real CLI, the real bundled model and embedder, real PDFs, real folders, stdin."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from .conftest import LONG_TEXT, PDF, REPO, ROOT, THREADS, empty_config, run_ktcli

ANSI = re.compile(rb"\x1b\[")
SHORT = ["--max-new-tokens", "40"]
NEEDLE = "The maintenance password for the tutorial server is TEAL-HERON-58."


def payload(proc):
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return json.loads(proc.stdout)


def lines_of(path, start, end):
    return path.read_text(encoding="utf-8").split("\n")[start - 1:end]


def test_ask_pdf_streams_a_clean_answer_with_page_citations(cache):
    proc = run_ktcli(["ask", str(PDF), "What was the revenue in the third quarter?", *SHORT], cache)
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, err
    assert not ANSI.search(proc.stdout) and not ANSI.search(proc.stderr)  # piped: no colour
    answer, _, sources = out.partition("\n\nSources:\n")
    assert answer.strip()
    assert re.search(r"harbor-light-annual-report-2023\.pdf p\.\d", sources), out
    # stderr carries the plan and the figures line, stdout none of it
    assert "mode full" in err and "peak RSS" in err
    assert "peak RSS" not in out and "plan:" not in out
    # The same question again reads the whole-input prompt's K/V back (engine.prefix_store)
    # and answers the same; the figures line says so. Named by another path (relative to
    # the working folder, not absolute): the prompt is the same, and only the Sources'
    # path is as given.
    relative = str(PDF.relative_to(ROOT))
    again = run_ktcli(["ask", relative, "What was the revenue in the third quarter?", *SHORT], cache)
    assert again.returncode == 0 and again.stdout.decode() == out.replace(str(PDF), relative)
    reused = re.search(r"tokens in ([\d,]+) \(([\d,]+) read from the prompt cache\)", again.stderr.decode())
    assert reused and int(reused[2].replace(",", "")) == int(reused[1].replace(",", "")) - 1, again.stderr.decode()


def test_a_sparse_read_keeps_its_pages_for_the_next_question(cache):
    """--mode sparse over int4 pages: the second question reads the document's whole
    prefill chunks back from the prompt cache, and the same question answers the same."""
    args = ["ask", str(PDF), "Who is the chair of the board?", "--mode", "sparse", "--kv-dtype", "int4", *SHORT]
    first = run_ktcli(args, cache)
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    assert "mode sparse" in first.stderr.decode()
    again = run_ktcli(args, cache)
    assert again.returncode == 0 and again.stdout == first.stdout
    reused = re.search(r"tokens in ([\d,]+) \(([\d,]+) read from the prompt cache\)", again.stderr.decode())
    assert reused, again.stderr.decode()
    total, read = (int(x.replace(",", "")) for x in reused.groups())
    assert read % 512 == 0 and total - 512 - 32 <= read < total  # whole chunks, the last one computed


@pytest.fixture(scope="module")
def needle_doc(tmp_path_factory):
    """The long sample text with one planted fact, as its own file."""
    folder = tmp_path_factory.mktemp("needle")
    # a third of the long sample (~20K tokens): well past the window, quicker to embed
    lines = LONG_TEXT.read_text(encoding="utf-8").split("\n")
    lines = lines[: len(lines) // 3]
    at = len(lines) * 2 // 3
    while lines[at - 1].strip():
        at += 1
    lines.insert(at, NEEDLE)
    path = folder / "tutorial-with-needle.rst"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path, at + 1


def test_long_text_uses_retrieval_and_cites_real_lines(module_cache, needle_doc):
    path, needle_line = needle_doc
    data = payload(run_ktcli(["ask", str(path), "What is the maintenance password for the tutorial server?",
                              "--json", *SHORT], module_cache))
    assert data["plan"]["mode"] == "retrieval"
    assert data["plan"]["input_tokens"] > 2 * data["plan"]["context_window"]
    evidence = data["figures"]["evidence"]
    assert any(e["line_start"] <= needle_line <= e["line_end"] for e in evidence), "needle not retrieved"
    assert data["figures"]["embedded_now"] > 0
    for cite in data["citations"]:
        assert cite["path"] == str(path)
        cited = " ".join(lines_of(path, cite["line_start"], cite["line_end"])).lower()
        answer_words = {w for w in re.findall(r"[a-z0-9-]{4,}", data["answer"].lower())}
        assert any(w in cited for w in answer_words), (cite, data["answer"])
    if "teal-heron-58" in data["answer"].lower():
        assert any(c["line_start"] <= needle_line <= c["line_end"] for c in data["citations"])


def test_second_question_on_same_corpus_embeds_nothing(module_cache, needle_doc):
    path, _ = needle_doc
    data = payload(run_ktcli(["ask", str(path), "How do I open a file?", "--json", *SHORT], module_cache))
    assert data["figures"]["embedded_now"] == 0
    assert data["figures"]["reused"] > 0


def test_editing_one_file_reindexes_only_that_file(cache, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(REPO, repo)
    args = ["ask", str(repo), "What does the shelf command do?", "--mode", "retrieval", "--json", *SHORT]
    first = payload(run_ktcli(args, cache))
    total = first["figures"]["embedded_now"]
    assert total > 1
    target = repo / "README.md"
    target.write_text(target.read_text() + "\nAn added line about lanterns.\n")
    second = payload(run_ktcli(args, cache))
    assert 0 < second["figures"]["embedded_now"] < total
    assert second["figures"]["reused"] > 0


def test_stdin_is_read_and_cited(cache):
    text = b"Build notes\nThe release train leaves every second Tuesday.\nOwners: the platform team.\n"
    proc = run_ktcli(["ask", "-", "When does the release train leave?", "--json", *SHORT], cache, stdin=text)
    data = payload(proc)
    assert data["plan"]["mode"] == "full"
    assert all(c["path"] == "<stdin>" for c in data["citations"])
    # the keys a retrieval answer's figures have, so scripts need not ask which mode ran
    assert data["figures"]["windows"] == 1 and data["figures"]["retrieved"] == 0
    from ktcli.pipeline.api import FIGURE_DEFAULTS  # every mode's keys, an index's among them

    assert set(FIGURE_DEFAULTS) <= set(data["figures"]) and data["figures"]["index_s"] == 0.0
    assert data["figures"]["evidence"] == [{"ref": "<stdin>", "path": "<stdin>", "line_start": 1, "line_end": 3,
                                            "page": None, "page_label": None, "unit": "line", "chars": None, "section": "",
                                            "score": None, "label": 1}]


def test_html_citations_name_lines_of_the_file(cache, tmp_path):
    page = tmp_path / "keeper.html"
    lines = ["<!doctype html>", "<html><head><title>Rock Light</title>", "<style>", "p { margin: 0 }", "</style>",
             "</head><body>", "<h1>Rock Light station</h1>", "<p>The station stands on a granite rock.</p>",
             "<p>The lighthouse keeper is", "<b>Ada Quill</b>, who has kept the light since 1998.</p>",
             "<p>Supplies arrive by boat every second Tuesday.</p>", "</body></html>"]
    page.write_text("\n".join(lines) + "\n")
    data = payload(run_ktcli(["ask", str(page), "Who is the lighthouse keeper?", "--json", *SHORT], cache))
    assert data["citations"]
    for c in data["citations"]:  # every cited range lies in the file, on lines with text
        assert c["path"].endswith("keeper.html")
        assert 7 <= c["line_start"] <= c["line_end"] <= 11, c
    assert any(c["line_start"] <= 10 and c["line_end"] >= 9 for c in data["citations"]), data["citations"]


def test_summarize_repo_reports_skipped_files(cache, tmp_path):
    import shutil

    # A copy outside ktcli's checkout, which tracks minirepo's ignored files (git's rules
    # do not apply to tracked files).
    shutil.copytree(REPO, tmp_path / "minirepo")
    data = payload(run_ktcli(["summarize", str(tmp_path / "minirepo"), "--json", *SHORT], cache))
    assert data["answer"].strip()
    reasons = {s["path"].split("/")[-1]: s["reason"] for s in data["skipped"]}
    assert "gitignored" in reasons.get("build.log", "")
    assert "binary" in reasons.get("logo.png", "")
    # each file in its own words, quoted from the line that says it (not the model's)
    said = {f["path"].split("minirepo/")[-1]: (f["line"], f["says"]) for f in data["files"]}
    assert said["src/shelf/storage.py"] == (1, "Loading and saving the catalogue: one JSON file, replaced atomically.")
    assert said["README.md"][1].startswith("shelf: ") and "build.log" not in said


def test_summarize_repo_as_outlines(cache):
    # --outline always: what a repo too big to read line by line in time gets
    data = payload(run_ktcli(["summarize", str(REPO), "--outline", "always", "--json", *SHORT], cache))
    assert data["answer"].strip()
    assert data["plan"]["outline_files"] >= 4  # the minirepo's Python files
    assert 0 < data["plan"]["read_tokens"] < data["plan"]["input_tokens"]
    assert data["figures"]["outlined_files"] == data["plan"]["outline_files"] == len(data["figures"]["outlined"])
    planned = payload(run_ktcli(["plan", str(REPO), "--outline", "always", "--json"], cache))
    assert sorted(d["path"] for d in planned["documents"] if d["outlined"]) == sorted(data["figures"]["outlined"])
    proc = run_ktcli(["plan", str(REPO), "--outline", "always"], cache)
    out = proc.stdout.decode()  # the plan is what `ktcli plan` prints
    assert proc.returncode == 0 and "file(s) as outlines" in out and "--outline never reads every line" in out


def test_threads_are_chosen_by_measurement_unless_given(cache):
    # KTCLI_THREADS=0 (the default): engine.threads picks the count and reports it
    data = payload(run_ktcli(["ask", str(REPO / "README.md"), "What is this?", "--json", "--max-new-tokens", "24"],
                             cache, extra_env={"KTCLI_THREADS": "0"}))
    assert data["figures"]["threads"] in (1, 2, 4, 8, 16, 32, 64) and "thread_switches" in data["figures"]
    data = payload(run_ktcli(["ask", str(REPO / "README.md"), "What is this?", "--json", "--max-new-tokens", "8"], cache))
    # --threads N (KTCLI_THREADS, as every test sets it): as given, and said, with no switches
    assert data["figures"]["threads"] == int(THREADS) and "thread_switches" not in data["figures"]


def test_plan_is_a_dry_run(cache):
    proc = run_ktcli(["plan", str(LONG_TEXT), "How do I define a function?", "--json"], cache)
    data = payload(proc)
    assert data["plan"]["mode"] == "retrieval"
    assert data["plan"]["n_chunks"] > 100
    assert data["plan"]["est_seconds"] > 0 and data["plan"]["est_memory_bytes"] > 0
    assert "loading model" not in proc.stderr.decode()


def test_plan_does_not_import_torch(cache):
    # torch's import was ~1.2 s of a ~2.6 s plan; a dry run needs only the page format's
    # byte figures (kernels.page_format) and the prompt cache's ids. The PDF is near the
    # window, so the plan loads the model's tokenizer and looks in the prompt cache.
    prepared = run_ktcli(["ask", str(PDF), "What is the company's name?", "--max-new-tokens", "4"], cache)
    assert prepared.returncode == 0, prepared.stderr[-2000:]  # converts the model, fills the prompt cache
    proc = run_ktcli(["plan", str(PDF), "What was the revenue?"], cache, extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.decode().splitlines() if "|" in line]
    assert "ktcli.engine.prefix_store" in imported and "kernels.page_format" in imported
    assert "torch" not in imported


def test_quiet_leaves_only_warnings_on_stderr(cache):
    proc = run_ktcli(["ask", str(REPO / "README.md"), "What is this?", "--quiet", *SHORT], cache)
    assert proc.returncode == 0
    # no progress, plan or figures; the answer cut at --max-new-tokens is still said
    assert all(line.startswith("! ") for line in proc.stderr.decode().splitlines()), proc.stderr
    assert proc.stdout.strip()


def test_plan_counts_with_the_models_own_tokenizer(cache, tmp_path):
    # Japanese text that tiktoken puts at ~7.5K tokens is ~10.1K of SmolLM2's: the plan said
    # "full" and the run switched to retrieval. With the converted model's tokenizer at
    # hand the plan counts what the run will count.
    import os
    import subprocess
    import sys

    from .conftest import ROOT, empty_config

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KTCLI_")},
           "KTCLI_CACHE_DIR": str(cache), "KTCLI_CONFIG": str(empty_config(cache)), "HF_HUB_OFFLINE": "1"}
    prepared = subprocess.run([sys.executable, "-m", "ktcli.engine.loading"], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=600)  # converts once, as setup does
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    line = "東京の天気は晴れです。私は毎朝コーヒーを飲みます。この報告書は第三四半期の売上について説明します。"
    doc = tmp_path / "ja.txt"
    doc.write_text("\n".join(f"{i}行目: {line}" for i in range(105)), encoding="utf-8")
    plan = payload(run_ktcli(["plan", str(doc), "秘密の合言葉は何ですか?", "--json"], cache))["plan"]
    assert plan["mode"] == "retrieval" and plan["input_tokens"] > 9500, plan


def test_plan_names_the_largest_documents_of_an_input_past_the_window(cache):
    """What makes a folder expensive was not said (3.4 MB of benchmark JSON was most of
    ktcli's own 2.3M tokens)."""
    folder = LONG_TEXT.parent
    text = run_ktcli(["plan", str(folder), "What is this?"], cache).stdout.decode()
    assert f"largest     {LONG_TEXT} (~" in text
    data = payload(run_ktcli(["plan", str(folder), "What is this?", "--json"], cache))
    assert data["largest"][0]["path"] == str(LONG_TEXT) and data["largest"][0]["tokens"] > 60_000
    # and every file it would read, in input order (a count said which files count)
    assert len(data["documents"]) == data["plan"]["n_documents"] and data["largest"][0] in data["documents"]


def test_plan_takes_exclude_and_reports_it_in_one_line(cache, tmp_path):
    """A repo's tests/fixtures CSVs were 984K of its 1.4M tokens; --exclude leaves them out,
    said in one line on stderr and listed one by one in --json."""
    for i in range(5):
        (tmp_path / "poly" / "tests" / "fixtures").mkdir(parents=True, exist_ok=True)
        (tmp_path / "poly" / "tests" / "fixtures" / f"orders{i}.csv").write_text("id,total\n1,20\n")
    (tmp_path / "poly" / "src").mkdir()
    (tmp_path / "poly" / "src" / "tax.py").write_text("TAX_RATE = 0.2\n")
    args = ["plan", str(tmp_path / "poly"), "What is TAX_RATE?", "--exclude", "tests/fixtures/**", "--exclude", "*.csv"]
    proc = run_ktcli([*args, "-q"], cache)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.decode().splitlines() == [
        f"! excluded 5 files matching --exclude: {tmp_path}/poly/tests/fixtures/orders0.csv, "
        f"{tmp_path}/poly/tests/fixtures/orders1.csv, {tmp_path}/poly/tests/fixtures/orders2.csv and 2 more"]
    assert "input       ~" in proc.stdout.decode() and "1 document(s)" in proc.stdout.decode()
    data = payload(run_ktcli([*args, "--json"], cache))
    assert [s["reason"] for s in data["skipped"]] == ["excluded by --exclude"] * 5
    assert data["warnings"] == [f"excluded 5 files matching --exclude: {tmp_path}/poly/tests/fixtures/orders0.csv, "
                                f"{tmp_path}/poly/tests/fixtures/orders1.csv, {tmp_path}/poly/tests/fixtures/orders2.csv "
                                "and 2 more"]  # what stderr said, for a script that reads stdout only
    # Patterns from a config file: its --json reasons said "--exclude", a flag never given.
    config = tmp_path / "ktcli.toml"
    config.write_text('exclude = ["*.csv"]\n')
    from_file = ["plan", str(tmp_path / "poly"), "What is TAX_RATE?", "--json"]
    data = payload(run_ktcli(from_file, cache, extra_env={"KTCLI_CONFIG": str(config)}))
    assert [s["reason"] for s in data["skipped"]] == [f"excluded by exclude in {config}"] * 5


def _run_with_stderr(args: list[str], cache, stderr) -> subprocess.CompletedProcess:
    """ktcli with fd 2 `stderr` (a pipe nobody reads, /dev/full)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KTCLI_")}
    env.update({"KTCLI_CACHE_DIR": str(cache), "KTCLI_CONFIG": str(empty_config(cache)), "HF_HUB_OFFLINE": "1",
                "KTCLI_THREADS": THREADS})
    return subprocess.run([sys.executable, "-m", "ktcli.cli.app", *args], stdout=subprocess.PIPE, stderr=stderr,
                          env=env, cwd=ROOT, timeout=600)


def _run_with_stderr_gone(args: list[str], cache) -> subprocess.CompletedProcess:
    """ktcli with fd 2 a pipe whose reader has gone (`2>&1 >answer.txt | head -1`)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return _run_with_stderr(args, cache, write_end)
    finally:
        os.close(write_end)


def test_stderrs_reader_gone_keeps_the_answer_and_the_exit_code(cache, tmp_path):
    """A progress line to a stderr whose reader had gone raised BrokenPipeError, taken for
    stdout's reader being done: no answer written, exit 0, even for a missing input."""
    doc = tmp_path / "good.txt"
    doc.write_text("Hello world. The capital of France is Paris.\n")
    proc = _run_with_stderr_gone(["ask", str(doc), "What is the capital of France?", "--max-new-tokens", "12"], cache)
    assert proc.returncode == 0 and "Sources:" in proc.stdout.decode(), proc.stdout
    assert _run_with_stderr_gone(["ask", str(tmp_path / "missing.txt"), "q"], cache).returncode == 3
    with open("/dev/full", "w") as full:  # stderr on a full disk: quiet too, the exit code the run's
        proc = _run_with_stderr(["plan", str(doc), "q"], cache, full)
    assert proc.returncode == 0 and b"mode" in proc.stdout
