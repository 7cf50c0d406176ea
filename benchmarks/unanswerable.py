"""Does `ktcli ask` say "not in the documents" when they are not, and only then?
(`pipeline.grounding`: `--json`'s `not_in_documents`.)

    python -m benchmarks.unanswerable --json                   # the model's own answers
    python -m benchmarks.unanswerable --answers made-up        # every answer made up (no model run)

False positives: the answerable questions of `benchmarks.qa_accuracy` (every case, read
whole and through retrieval as it reads them), where the notice must not fire. True
positives: UNANSWERABLE, questions written on 2026-12-07 about the sample documents whose
answer they do not hold: some far off ("Who won the 1998 World Cup?"), some of the
documents' own kind (a price the report gives for two lanterns and not the third, the
chief executive's salary, revenue in a year it does not cover).
`--answers made-up`: each answer is "Zebras quietly juggle purple xylophones." (no word of
any document), so the notice fires wherever the question matches nothing read: the most it
can fire on the answerable questions, whatever the model writes, in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from dataclasses import replace

from benchmarks.common import machine, write_result
from benchmarks.qa_accuracy import CASES, PDF, TUTORIAL
from ktcli.config import Settings
from ktcli.engine.loading import load_backend
from ktcli.pipeline.events import NullReporter
from ktcli.pipeline.prepare import prepare
from ktcli.pipeline.qa import answer_question
from ktcli.pipeline.runner import Tally

UNANSWERABLE = {  # input: questions whose answer it does not hold
    PDF: ["Who won the 1998 World Cup?", "What is the capital of France?",
          "What is the chief executive officer's salary?", "How much does the Driftwood desk lamp cost?",
          "How many stores does the company operate in Japan?", "What is the company's stock ticker symbol?",
          "Who is the head of marketing?", "How many patents does the company hold?",
          "What was the research and development budget?",
          "What email address should investors use to contact the company?", "What was the revenue in 2019?",
          "Which bank lends money to the company?"],
    TUTORIAL: ["Who won the 1998 World Cup?", "What is the recommended dose of ibuprofen for adults?",
               "How do I configure a Kubernetes cluster?", "What is the boiling point of water at sea level?"],
}
MADE_UP = "Zebras quietly juggle purple xylophones."


@contextlib.contextmanager
def _made_up(backend):
    """Every answer MADE_UP, with no model call."""
    def stream_chat(messages, params):
        yield MADE_UP

    current = backend.stream_chat
    backend.stream_chat = stream_chat
    try:
        yield
    finally:
        backend.stream_chat = current


def _asked(cases: list[str]) -> list[tuple[str, str, str, str, bool]]:
    """(case, input, mode, question, answerable) for each question."""
    out = [(case, CASES[case][0], CASES[case][1], q, True) for case in cases for q, _, _ in CASES[case][2]]
    for path, questions in UNANSWERABLE.items():
        modes = ("full", "retrieval") if path == PDF else ("retrieval",)  # the tutorial fits no window
        out += [("unanswerable", path, mode, q, False) for mode in modes for q in questions]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="also write benchmarks/results/NAME.json")
    parser.add_argument("--name", default="unanswerable")
    parser.add_argument("--answers", choices=("model", "made-up"), default="model")
    parser.add_argument("--cases", default=",".join(CASES), help="qa_accuracy's cases (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="as qa_accuracy (default 96)")
    args = parser.parse_args(argv)
    base = Settings(max_new_tokens=args.max_new_tokens)
    prep = prepare([PDF], "warm up", "ask", replace(base, mode="full"), NullReporter())
    backend = load_backend(base, None, prep.plan)
    rows = []
    with _made_up(backend) if args.answers == "made-up" else contextlib.nullcontext():
        for case, path, mode, question, answerable in _asked(args.cases.split(",")):
            settings = replace(base, mode=mode)
            started = time.perf_counter()
            answer = answer_question(prepare([path], question, "ask", settings, NullReporter()), backend, settings,
                                     NullReporter(), Tally())
            rows.append({"case": case, "mode": mode, "question": question, "answerable": answerable,
                         "fired": answer.not_in_documents, "grounding": answer.grounding,
                         "answer": answer.text[:300], "seconds": round(time.perf_counter() - started, 2)})
            r = rows[-1]
            print(f"{'fired' if r['fired'] else '-':<6} {case:<18} {mode:<9} {question[:60]:<60} {r['grounding']}",
                  flush=True)
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]
    summary = {"false_positives": sum(r["fired"] for r in answerable), "answerable": len(answerable),
               "true_positives": sum(r["fired"] for r in unanswerable), "unanswerable": len(unanswerable)}
    print(f"notice on answerable questions: {summary['false_positives']}/{summary['answerable']}; "
          f"on unanswerable ones: {summary['true_positives']}/{summary['unanswerable']} ({args.answers} answers)")
    payload = {"benchmark": "unanswerable", "answers": args.answers, "machine": machine(), "model": base.model,
               "max_new_tokens": base.max_new_tokens, "summary": summary, "rows": rows}
    if args.json:
        print(f"wrote {write_result(args.name, payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
