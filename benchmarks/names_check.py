"""How often the names check (`citations.invented_names`: "the answer's names X, Y stand in
none of the input") fires on real answers of the bundled model, beside the figures check
(`citations.invented_figures`) on the same answers; and the made-up code check
(`summary_lines.made_up_blocks`: "1 code block of the answer is not in the input").

    python -m benchmarks.names_check --json

The answers are those `benchmarks.qa_accuracy` recorded (every results/qa_accuracy*.json,
each distinct (document, question, answer) once): the sample PDF, the Python tutorial and
the four documents of `benchmarks/qa_docs/`. Each answer is checked against its whole
document and its question, as `ktcli ask` checks a whole read (and a retrieval's answer
against the rest of the input). Every flagged answer is printed with its names, to be read
by hand: a warning is false where the name is an everyday word the model capitalised, or
the input says the same thing in other words. No model runs: it takes seconds.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

from benchmarks.common import ROOT, arg_parser, machine, report

DOCUMENTS = {
    "pdf": "sample_docs/harbor-light-annual-report-2023.pdf",
    "tutorial": "sample_docs/python-tutorial-3.11.rst",
    "guide": "benchmarks/qa_docs/field-guide-kestrel-ridge.md",
    "water": "benchmarks/qa_docs/municipal-water-report-2024.md",
    "memo": "benchmarks/qa_docs/steering-committee-notes.txt",
    "policy": "benchmarks/qa_docs/travel-expense-policy.txt",
}


def main(argv=None) -> dict:
    args = arg_parser("names_check", __doc__, "names_check").parse_args(argv)
    from ktcli.ingest.loaders import load_file
    from ktcli.pipeline.citations import invented_figures, invented_names
    from ktcli.pipeline.summary_lines import made_up_blocks

    texts = {key: load_file(ROOT / path, path).text for key, path in DOCUMENTS.items()}
    answers: dict[tuple[str, str, str], bool] = {}
    files = sorted(glob.glob(str(ROOT / "benchmarks" / "results" / "qa_accuracy*.json")))
    for path in files:
        for case in json.loads(Path(path).read_text())["results"]:
            for row in case["rows"]:
                answers[(case["case"].split("-")[0], row["question"], row["answer"])] = row["right"]
    flagged, figures, code = [], 0, []
    for (doc, question, answer), right in answers.items():
        names = invented_names(answer, [texts[doc]], question)
        figures += bool(invented_figures(answer, [texts[doc]], question))
        if made_up_blocks(answer, [texts[doc]]):
            code.append({"document": doc, "question": question, "right": right, "answer": answer})
        if names:
            flagged.append({"document": doc, "question": question, "names": names, "right": right, "answer": answer})
            print(f"{doc} | {question} | {', '.join(names)}{' | scored right' if right else ''}\n    "
                  f"{' '.join(answer.split())[:300]}")
    result = {"machine": machine(), "answer_files": [Path(p).name for p in files], "answers": len(answers),
              "names_flagged": len(flagged), "figures_flagged": figures,
              "names_flagged_right_answers": sum(f["right"] for f in flagged), "flagged": flagged,
              "answers_with_code_blocks": sum("```" in a or "~~~" in a for _, _, a in answers),
              "code_blocks_flagged": len(code), "code_flagged": code}
    for c in code:
        print(f"code | {c['document']} | {c['question']}{' | scored right' if c['right'] else ''}\n    "
              f"{' '.join(c['answer'].split())[:300]}")
    print(f"{len(answers)} answers: names check {len(flagged)} flagged ({result['names_flagged_right_answers']} of "
          f"them scored right), figures check {figures}; made-up code check {len(code)} of "
          f"{result['answers_with_code_blocks']} answers with a code block")
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
