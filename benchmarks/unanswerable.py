"""Does `ktcli ask` say "not in the documents" when they are not, and only then?
(`pipeline.grounding`: `--json`'s `not_in_documents`.)

    python -m benchmarks.unanswerable --json                   # the model's own answers
    python -m benchmarks.unanswerable --answers made-up        # every answer made up (no model run)
    python -m benchmarks.unanswerable --json --set heldout --name unanswerable_heldout   # questions never tuned on

False positives: the answerable questions of `benchmarks.qa_accuracy` (every case, read
whole and through retrieval as it reads them), where the notice must not fire. True
positives: UNANSWERABLE, questions written on 2026-12-07 about the sample documents whose
answer they do not hold: some far off ("Who won the 1998 World Cup?"), some of the
documents' own kind (a price the report gives for two lanterns and not the third, the
chief executive's salary, revenue in a year it does not cover).
`--answers made-up`: each answer is "Zebras quietly juggle purple xylophones." (no word of
any document), so the notice fires wherever the question matches nothing read: the most it
can fire on the answerable questions, whatever the model writes, in seconds.

`--set heldout`: HELDOUT, written on 2026-12-07 by a helper probe, and committed on its
own before it was first run, after `grounding`'s thresholds were tuned on the set above:
seven inputs the tuning never asked an unanswerable question of (qa_docs' four, which it
read only for their answerable questions, the sample repo `sample_docs/minirepo`, the
libtasn1 manual and dpkg's rootless-builds spec from /usr/share/doc, both read as they
are installed and skipped where they are not). For each: questions of the input's own
kind whose answer it does not hold (a figure it does not give, a person it does not
name, a year it does not cover, a function the repo does not have), one or two far off,
and new answerable ones (none of qa_accuracy's), some in the input's words and some
paraphrased, with the strings that make an answer right ("right" in the rows: whether
the answer says one). Its rates are the held-out estimate; a rule changed after reading
them is tuned on it too, and must be measured on both sets.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import machine, write_result
from benchmarks.qa_accuracy import CASES, PDF, TUTORIAL, _says
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
_DOCS = "benchmarks/qa_docs/"
# input: (modes, [(answerable question, strings any one of which makes the answer right)],
#         [unanswerable questions])
HELDOUT = {
    _DOCS + "municipal-water-report-2024.md": (("full", "retrieval"), [
        ("Who chairs the Board of Directors?", ["Anselm"]),
        ("When was the ultraviolet disinfection stage commissioned?", ["3 April"]),
        ("How many regulatory samples were collected during the year?", ["6,212", "6212"]),
        ("What is the annual standing charge?", ["64.50"]),
        ("How many times did pipes burst last year?", ["73"]),
        ("Who became Chief Engineer in September?", ["Velleman"]),
    ], [
        "How many residents did the utility serve in 2020?",
        "What was the utility's total revenue in 2022?",
        "Who is the utility's head of human resources?",
        "What is the average water pressure in the Kestermoor district?",
        "How much fluoride is added to the water?",
        "How many customer complaints were received in the first quarter of 2023?",
        "What is the tallest mountain in Africa?",
    ]),
    _DOCS + "field-guide-kestrel-ridge.md": (("full",), [
        ("What does a full day at the Fellgate car park cost?", ["4.20"]),
        ("How many bunks does Curlew Hut have?", ["14"]),
        ("Who led the 2024 kestrel breeding survey?", ["Pryce"]),
        ("How much rain does the ridge get in a year?", ["2,260", "2260"]),
        ("What time does the last shuttle bus leave Sedge Tarn?", ["18:10"]),
        ("What is the largest group allowed to stay overnight?", ["12"]),
    ], [
        "How many visitors came to the ridge in 2024?",
        "How long is the Heron Water Trail?",
        "What is the phone number of the Fellgate visitor centre?",
        "Who was the head ranger before Ingrid Ashcombe?",
        "What was the average July temperature on Harrier Crown in 1990?",
        "How many pairs of peregrine falcons nest on the Merlin Tor crags?",
        "What is the exchange rate between the euro and the yen?",
    ]),
    _DOCS + "steering-committee-notes.txt": (("full",), [
        ("Which vendors were shortlisted?", ["Norlys", "Brightpath"]),
        ("By when does Ingrid want a revised forecast?", ["28 May"]),
        ("Who abstained in the vendor vote?", ["Marco"]),
        ("Why was the launch moved?", ["audit"]),
        ("What was the original launch date?", ["3 June"]),
    ], [
        "How much does the KodeVerk contract cost?",
        "Who is the project's sponsor on the board?",
        "What was decided at the previous meeting in April?",
        "How much has been spent on cloud hosting so far?",
        "Which city will host the public launch event?",
        "How do I bake sourdough bread?",
    ]),
    _DOCS + "travel-expense-policy.txt": (("full",), [
        ("Which class may be booked for flights of 6 hours or more?", ["premium economy"]),
        ("What is the hotel limit outside Tier 1 cities?", ["120"]),
        ("Which agency must hotel bookings go through?", ["TravelDesk"]),
        ("Can I claim the cost of alcohol?", ["not reimbursable", "no"]),
        ("What happens to claims submitted after 60 days?", ["rejected"]),
        ("How are relocation costs handled?", ["HR-17", "Relocation Policy"]),
    ], [
        "What is the mileage rate for using a private car?",
        "How much can be claimed for a taxi from the airport?",
        "Who approves travel for contractors?",
        "What was the hotel limit in version 4.1 of the policy?",
        "What is the limit for laundry expenses?",
        "What is the speed of light?",
    ]),
    "sample_docs/minirepo": (("auto",), [
        ("What is the maximum length of a book title?", ["200"]),
        ("Where is the catalogue stored by default?", ["books.json"]),
        ("Which environment variable overrides the catalogue path?", ["SHELF_FILE"]),
        ("How are ties in search results broken?", ["year", "newest"]),
        ("What version is shelf?", ["0.3.1"]),
        ("What exception is raised for an invalid book?", ["InvalidBook"]),
    ], [
        "How do I delete a book from the catalogue?",
        "How is the SQLite database schema defined?",
        "What does the export_csv function do?",
        "What port does the shelf web server listen on?",
        "Who is the author of the shelf project?",
        "What is the capital of Australia?",
    ]),
    "/usr/share/doc/libtasn1-doc/libtasn1.pdf": (("auto",), [
        ("What is the header file of the library?", ["libtasn1.h"]),
        ("Which function returns a string describing an error?", ["asn1_strerror", "asn1 strerror"]),
        ("Which ASN.1 type does this version not handle?", ["REAL"]),
        ("Under what license is the library itself distributed?", ["Lesser General Public License", "LGPL"]),
        ("What does asn1Parser generate?", ["array"]),
        ("Which function checks the library version?", ["asn1_check_version", "asn1 check version"]),
    ], [
        "How do I encode a value with the Packed Encoding Rules?",
        "Which function parses XML Encoding Rules input?",
        "What changed in version 3.0 of libtasn1?",
        "How much memory does asn1_der_decoding use on average?",
        "How do I install the Python bindings for libtasn1?",
        "What port does the libtasn1 server listen on?",
        "Who won the 2010 Tour de France?",
    ]),
    "/usr/share/doc/dpkg/spec/rootless-builds.txt": (("full",), [
        ("What field is added to the Source stanza of debian/control?", ["Rules-Requires-Root"]),
        ("Which environment variable holds the gain root command?", ["DEB_GAIN_ROOT_CMD"]),
        ("What was DEB_GAIN_ROOT_CMD called before?", ["DPKG_GAIN_ROOT_CMD"]),
        ("What is the default value of Rules-Requires-Root?", ["binary-targets"]),
        ("Which dpkg-deb option sets owner and group values without root?", ["--root-owner-group", "root-owner-group"]),
        ("What does dh_testroot do when Rules-Requires-Root is no?", ["no-op", "nothing"]),
    ], [
        "In which Debian release did rootless builds become the default?",
        "Who wrote the rootless builds specification?",
        "How does rpmbuild handle root privileges?",
        "Which keyword does the cmake build system use for Rules-Requires-Root?",
        "How many packages in the archive set Rules-Requires-Root to no?",
        "What is the recommended daily intake of vitamin C?",
    ]),
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


def _heldout() -> list[tuple[str, str, str, str, bool, list[str]]]:
    """(case, input, mode, question, answerable, accepted) for each held-out question whose input is here."""
    out = []
    for path, (modes, answerable, unanswerable) in HELDOUT.items():
        if not Path(path).exists():
            print(f"skipped (not here): {path}", flush=True)
            continue
        case = Path(path).name
        out += [(case, path, mode, q, True, accepted) for mode in modes for q, accepted in answerable]
        out += [(case, path, mode, q, False, []) for mode in modes for q in unanswerable]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="also write benchmarks/results/NAME.json")
    parser.add_argument("--name", default="unanswerable")
    parser.add_argument("--set", choices=("tuned", "heldout"), default="tuned",
                        help="tuned: the questions grounding was tuned on (default); heldout: HELDOUT")
    parser.add_argument("--answers", choices=("model", "made-up"), default="model")
    parser.add_argument("--cases", default=",".join(CASES), help="qa_accuracy's cases (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="as qa_accuracy (default 96)")
    args = parser.parse_args(argv)
    base = Settings(max_new_tokens=args.max_new_tokens)
    prep = prepare([PDF], "warm up", "ask", replace(base, mode="full"), NullReporter())
    backend = load_backend(base, None, prep.plan)
    rows = []
    with _made_up(backend) if args.answers == "made-up" else contextlib.nullcontext():
        asked = (_heldout() if args.set == "heldout"
                 else [(*row, None) for row in _asked(args.cases.split(","))])
        for case, path, mode, question, answerable, accepted in asked:
            settings = replace(base, mode=mode)
            started = time.perf_counter()
            answer = answer_question(prepare([path], question, "ask", settings, NullReporter()), backend, settings,
                                     NullReporter(), Tally())
            rows.append({"case": case, "mode": mode, "question": question, "answerable": answerable,
                         "fired": answer.not_in_documents, "grounding": answer.grounding,
                         "answer": answer.text[:300], "seconds": round(time.perf_counter() - started, 2)})
            if accepted:
                rows[-1]["right"] = any(_says(answer.text, a) for a in accepted)
            r = rows[-1]
            print(f"{'fired' if r['fired'] else '-':<6} {case:<18} {mode:<9} {question[:60]:<60} {r['grounding']}",
                  flush=True)
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]
    summary = {"false_positives": sum(r["fired"] for r in answerable), "answerable": len(answerable),
               "true_positives": sum(r["fired"] for r in unanswerable), "unanswerable": len(unanswerable)}
    print(f"notice on answerable questions: {summary['false_positives']}/{summary['answerable']}; "
          f"on unanswerable ones: {summary['true_positives']}/{summary['unanswerable']} ({args.answers} answers)")
    payload = {"benchmark": "unanswerable", "set": args.set, "answers": args.answers, "machine": machine(), "model": base.model,
               "max_new_tokens": base.max_new_tokens, "summary": summary, "rows": rows}
    if args.json:
        print(f"wrote {write_result(args.name, payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
