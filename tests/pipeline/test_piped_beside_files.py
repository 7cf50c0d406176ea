"""Standard input piped beside files: read whole, and a diff's changed names looked up."""

from __future__ import annotations

from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.qa import answer_question
from ktcli.pipeline.runner import Tally
from ktcli.retrieval.symbols import changed_names

from .fake_backend import FakeBackend
from .test_qa_pipeline import StatusLog, settings_for

DIFF = """diff --git a/svc/http_client.py b/svc/http_client.py
--- a/svc/http_client.py
+++ b/svc/http_client.py
@@ -3,3 +3,3 @@ import time
-MAX_RETRIES = 5
+MAX_RETRIES = 0
@@ -10,4 +10,4 @@ def fetch_with_retry(session, url, retries=MAX_RETRIES):
-    for attempt in range(retries):
+    for attempt in range(retries - 1):
"""


def http_client_repo(tmp_path):
    """A repo whose svc/http_client.py defines what DIFF changes (its callers are the test's)."""
    repo = tmp_path / "repo"
    (repo / "svc").mkdir(parents=True)
    (repo / "svc" / "http_client.py").write_text(
        "import time\n\nMAX_RETRIES = 5\n\n\ndef fetch_with_retry(session, url, retries=MAX_RETRIES):\n"
        "    for attempt in range(retries):\n        time.sleep(attempt)\n")
    return repo


def test_the_names_a_diff_changes():
    assert changed_names(DIFF) == ["MAX_RETRIES", "fetch_with_retry"]  # changed lines first, then hunk headers
    assert changed_names("MAX_RETRIES = 5\ndef f(): pass\n") == []  # no diff: nothing changed


def test_a_diff_piped_beside_a_repo_is_read_whole_with_the_callers_of_what_it_changes(tmp_path):
    repo = http_client_repo(tmp_path)
    (repo / "svc" / "billing.py").write_text(
        "from svc.http_client import fetch_with_retry\n\n\ndef charge_customer(session, customer):\n"
        "    return fetch_with_retry(session, customer.invoice_url)\n")
    for i in range(12):  # distractors: words of the question, none of the names
        (repo / f"notes{i}.md").write_text(f"# Notes {i}\n\nThis change may break the build; what does it break?\n")
    settings = settings_for(tmp_path, top_k=4)
    prep = prepare(["-", str(repo)], "What does this change break?", "ask", settings, NullReporter(), stdin_text=DIFF)
    backend = FakeBackend()
    answer = answer_question(prep, backend, settings, NullReporter(), Tally())
    prompt = backend.calls[-1][-1]["content"]
    assert "+MAX_RETRIES = 0" in prompt  # the diff, whole
    assert "def charge_customer" in prompt  # the caller of what it changed
    paths = [e["path"] for e in answer.stats["evidence"]]
    assert paths[0] == "<stdin>" and any(p.endswith("billing.py") for p in paths)
    # each passage's section in --json's evidence: the diff's file, the notes' headings
    sections = {e["section"] for e in answer.stats["evidence"]}
    assert "svc/http_client.py" in sections and any(s.startswith("Notes") for s in sections)


def test_the_plan_says_whether_standard_input_is_read_whole_beside_the_files(tmp_path):
    """Probe 128: `git log -p | ktcli plan - folder "q"` said "retrieve the top 8 of 156
    chunks" alone, of a piped log over half the evidence budget, which retrieval then ranked
    as any other chunks; now one line says which, as the run does it."""
    from ktcli.pipeline.prepare import reads_piped_whole

    repo = tmp_path / "repo"
    repo.mkdir()
    for i in range(12):
        (repo / f"notes{i}.md").write_text(f"# Notes {i}\n\n" + f"Paragraph {i} of the notes on the build. " * 60 + "\n")
    settings = settings_for(tmp_path, top_k=4)
    question = "What does this change break?"
    small = prepare(["-", str(repo)], question, "ask", settings, NullReporter(), stdin_text=DIFF)
    said = [r for r in small.plan.reasons if r.startswith("<stdin>")]
    assert len(said) == 1 and "is read whole" in said[0] and "2 name(s) its diff changes" in said[0]
    assert reads_piped_whole(small.document_tokens["<stdin>"], small.plan.evidence_budget)

    log = "".join(f"commit {i:040x}\nAuthor: A <a@b>\n\n    Change {i} to the retry loop of the client.\n\n"
                  for i in range(400))
    big = prepare(["-", str(repo)], question, "ask", settings, NullReporter(), stdin_text=log)
    said = [r for r in big.plan.reasons if r.startswith("<stdin>")]
    assert len(said) == 1 and "not read whole" in said[0] and "diff" not in said[0]
    assert not reads_piped_whole(big.document_tokens["<stdin>"], big.plan.evidence_budget)
    # (a question about the files alone, or a summary, says nothing of it)
    assert not any(r.startswith("<stdin>") for r in prepare([str(repo)], question, "ask", settings,
                                                             NullReporter()).plan.reasons)


def test_the_plan_and_the_run_weigh_standard_input_in_the_model_s_tokens(tmp_path):
    """The check compared the chunks' estimate-tokenizer counts with a budget in model tokens:
    a digit-heavy log of ~1,500 estimate tokens (~1,725 model tokens) against a 3,072-token
    budget was planned as "(~1,725 tokens) is read whole", over the half it allows. Now the
    plan and the run both weigh the model tokens the plan counted, and agree."""
    from ktcli.pipeline.prepare import piped_beside_files

    repo = tmp_path / "repo"
    repo.mkdir()
    for i in range(12):
        (repo / f"notes{i}.md").write_text(f"# Notes {i}\n\n" + f"Paragraph {i} of the notes on the build. " * 60 + "\n")
    settings = settings_for(tmp_path, top_k=4)
    log = "".join(f"{i * 7919:08d} 2026-12-07T21:{i % 60:02d}:00 ok 200 {i * 31:06d}\n" for i in range(60))
    prep = prepare(["-", str(repo)], "What failed?", "ask", settings, NullReporter(), stdin_text=log)
    half = prep.plan.evidence_budget // 2
    assert sum(c.n_tokens for c in piped_beside_files(prep.corpus, prep.chunks)) <= half < prep.document_tokens["<stdin>"]
    assert any(r.startswith("<stdin>") and "not read whole" in r for r in prep.plan.reasons)
    said = StatusLog()
    answer_question(prep, FakeBackend(), settings, said, Tally())
    assert any("not read whole" in m for m in said.lines)
