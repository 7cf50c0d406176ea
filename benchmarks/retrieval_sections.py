"""Retrieval of a section a question names by number ("What does section 3.2 say?").

    python -m benchmarks.retrieval_sections --json

The corpus is a 12-page report PDF written here with reportlab (seeded, the same every
run): 6 numbered sections of 3 subsections each, on different topics, whose text cites
other sections by number ("as section 4.2 shows") the way reports and papers do. It is
read and chunked as `ktcli ask` reads it (`ingest.loaders`, `ingest.chunking`; the
numbered headings give the trails, `ingest.pdf_headings`) and indexed with the real
embedder. Questions name a subsection ("What does section 3.2 say?", "Summarize clause
5.1") or a section ("What is in section 2?"); a hit is a chunk at least half of whose
lines lie in the named section (chunks straddle a section's start and end).

Same run, same index: the ranking without the section bonus (`retriever.SECTION_BONUS`
set to 0: the fusion of BM25 and dense alone) against the ranking `ask` uses. Reported:
recall@1 and @8, MRR@8, and the share of the 8 passages read that lie in the section.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from benchmarks.common import arg_parser, machine, report
from ktcli.ingest.chunking import chunk_document
from ktcli.ingest.loaders import load_file
from ktcli.retrieval import retriever
from ktcli.retrieval.embedder import Embedder

TOPICS = [
    ("Harbor Operations", ["Berth allocation", "Pilotage", "Tug services"]),
    ("Water Quality", ["Sampling stations", "Nutrient levels", "Heavy metals"]),
    ("Lighthouse Maintenance", ["Lens cleaning", "Lamp replacement", "Tower repairs"]),
    ("Fisheries", ["Catch records", "Quota rules", "Vessel licences"]),
    ("Budget", ["Income from dues", "Staff costs", "Capital projects"]),
    ("Safety", ["Incident reports", "Drills", "Protective equipment"]),
]
WORDS = ("the harbor board reviewed records crews vessels quarterly annual staff budget tide water "
         "station report figures rose fell remained within limits season contractors inspections").split()
QUESTIONS = ["What does section {n} say?", "Summarize clause {n}.", "What is described in section {n}?",
             "Tell me about section {n}."]


def _sentence(rng: random.Random, topic: str, others: list[str]) -> str:
    words = rng.sample(WORDS, 9)
    cite = f" as section {rng.choice(others)} shows" if rng.random() < 0.35 else ""
    return f"The {topic.lower()} {' '.join(words)}{cite}."


def write_report(path: Path) -> dict[str, tuple[str, ...]]:
    """The report PDF; returns each section number's headings (to find its lines)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import Paragraph, SimpleDocTemplate

    rng = random.Random(7)
    numbers = [f"{i + 1}.{j + 1}" for i in range(len(TOPICS)) for j in range(3)]
    styles = getSampleStyleSheet()
    story = [Paragraph("Annual Report of the Port Alder Harbor Board", styles["Title"])]
    for i, (section, subsections) in enumerate(TOPICS, start=1):
        story.append(Paragraph(f"{i} {section}", styles["Heading1"]))
        for j, sub in enumerate(subsections, start=1):
            story.append(Paragraph(f"{i}.{j} {sub}", styles["Heading2"]))
            others = [n for n in numbers if n != f"{i}.{j}"]
            for _ in range(4):
                story.append(Paragraph(" ".join(_sentence(rng, sub, others) for _ in range(5)), styles["BodyText"]))
    SimpleDocTemplate(str(path), pagesize=A4, invariant=1).build(story)
    return {n: () for n in numbers}


def _section_of_lines(doc) -> list[str]:
    """Each text line's innermost section number (from the numbered headings)."""
    from ktcli.ingest.sections import paged_trails

    lines = doc.text.split("\n")
    trails = paged_trails(doc.pages, lines)
    out = []
    for k in range(len(lines)):
        innermost = trails.at(k).split(" > ")[-1] if trails.at(k) else ""
        out.append(innermost.split(" ", 1)[0])
    return out


def _in(number: str, wanted: str) -> bool:
    return number == wanted or number.startswith(wanted + ".")


def _share_in(span, sections_by_line: list[str], wanted: str) -> float:
    lines = range(span.line_start - 1, span.line_end)
    return sum(_in(sections_by_line[k], wanted) for k in lines) / max(len(lines), 1)


def evaluate(index, chunks, sections_by_line, cases) -> dict:
    ranks, shares = [], []
    for question, wanted in cases:
        hits = index.search(question, 8)
        good = [_share_in(h.chunk.span, sections_by_line, wanted) >= 0.5 for h in hits]
        ranks.append(next((r for r, ok in enumerate(good, start=1) if ok), None))
        shares.append(sum(good) / max(len(good), 1))
    n = len(cases)
    return {"recall@1": round(sum(r == 1 for r in ranks) / n, 3), "recall@8": round(sum(r is not None for r in ranks) / n, 3),
            "mrr@8": round(sum(1 / r for r in ranks if r) / n, 3), "in_section_share@8": round(sum(shares) / n, 3),
            "ranks": ranks}


def main(argv: list[str] | None = None) -> dict:
    args = arg_parser("retrieval_sections", __doc__, "retrieval_sections").parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ktcli-sections-") as tmp:
        path = Path(tmp) / "report.pdf"
        numbers = list(write_report(path))
        doc = load_file(path, "report.pdf")
    chunks = chunk_document(doc)
    sections_by_line = _section_of_lines(doc)
    rng = random.Random(11)
    cases = [(rng.choice(QUESTIONS).format(n=n), n) for n in numbers]
    cases += [(f"What is in section {i}?", str(i)) for i in range(1, len(TOPICS) + 1)]
    index = retriever.HybridIndex.build(chunks, embedder=Embedder("minilm"), store=None)
    bonus = retriever.SECTION_BONUS
    try:
        retriever.SECTION_BONUS = 0.0
        baseline = evaluate(index, chunks, sections_by_line, cases)
    finally:
        retriever.SECTION_BONUS = bonus
    now = evaluate(index, chunks, sections_by_line, cases)
    result = {"machine": machine(), "pages": len(doc.pages), "chunks": len(chunks), "questions": len(cases),
              "baseline": "no section bonus (the fused BM25 and dense ranking)", "cases": [q for q, _ in cases],
              "without_bonus": baseline, "now": now}
    for name, r in (("without bonus", baseline), ("now", now)):
        print(f"{name:14s} recall@1 {r['recall@1']:.2f}  recall@8 {r['recall@8']:.2f}  MRR@8 {r['mrr@8']:.3f}  "
              f"in-section share of 8 {r['in_section_share@8']:.2f}")
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
