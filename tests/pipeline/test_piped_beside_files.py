"""Standard input piped beside files: read whole, and a diff's changed names looked up."""

from __future__ import annotations

from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.qa import answer_question
from ktcli.pipeline.runner import Tally
from ktcli.retrieval.symbols import changed_names

from .fake_backend import FakeBackend
from .test_qa_pipeline import settings_for

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


def test_the_names_a_diff_changes():
    assert changed_names(DIFF) == ["MAX_RETRIES", "fetch_with_retry"]  # changed lines first, then hunk headers
    assert changed_names("MAX_RETRIES = 5\ndef f(): pass\n") == []  # no diff: nothing changed


def test_a_diff_piped_beside_a_repo_is_read_whole_with_the_callers_of_what_it_changes(tmp_path):
    repo = tmp_path / "repo"
    (repo / "svc").mkdir(parents=True)
    (repo / "svc" / "http_client.py").write_text(
        "import time\n\nMAX_RETRIES = 5\n\n\ndef fetch_with_retry(session, url, retries=MAX_RETRIES):\n"
        "    for attempt in range(retries):\n        time.sleep(attempt)\n")
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
