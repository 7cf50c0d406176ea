"""Reading a PDF again from the extraction cache (`ingest.extract_cache`) against reading it
from its content streams: what every question after the first about a PDF saves before
the model starts.

    python -m benchmarks.pdf_extract_cache --json
    python -m benchmarks.pdf_extract_cache --json --pdf /usr/share/doc/libtasn1-doc/libtasn1.pdf

Inputs: the sample annual report (9 pages), a report generated here (`--pages`, 150 by
default: prose, a table and a footnote mark on every page, running feet), and any PDF
named with `--pdf` (real ones, from other writers than reportlab, read slower). Each round reads
each PDF through `load_corpus` twice in a fresh cache folder, the first read filling the
cache (the baseline: what a first question costs, writing included), the second from it;
the best of `--rounds` each. The documents read both ways are compared whole.
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, arg_parser, machine, report
from ktcli.ingest import load_corpus
from ktcli.ingest.extract_cache import kept_under

SAMPLE = ROOT / "sample_docs" / "harbor-light-annual-report-2023.pdf"


def generated_report(pages: int) -> bytes:
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate, Table

    styles = getSampleStyleSheet()
    story = []
    for n in range(1, pages + 1):
        story.append(Paragraph(f"Section {n}: Operations review", styles["Heading2"]))
        for k in range(4):
            story.append(Paragraph(
                f"In period {n}.{k} the plant at site {n % 7} treated {1000 + 17 * n + k} cubic metres a day, "
                f"up {k + 1}.{n % 10} percent<super>{k + 1}</super> on the year before, while the crews "
                "replaced valves, flushed mains and logged every interruption of supply for the regulator.",
                styles["BodyText"]))
        story.append(Table([["Quarter", "Volume", "Cost"]] + [[f"Q{q}", f"{n * q * 13}", f"{n + q}.{q}5"] for q in range(1, 5)]))
        story.append(PageBreak())

    def foot(canvas, doc):  # a running foot, as reports print one
        canvas.setFont("Helvetica", 8)
        canvas.drawString(72, 30, f"Water report 2024 - page {doc.page}")

    buffer = io.BytesIO()
    SimpleDocTemplate(buffer, invariant=1).build(story, onFirstPage=foot, onLaterPages=foot)
    return buffer.getvalue()


def timed(path: Path, cache: Path) -> tuple[float, object]:
    with kept_under(cache):
        started = time.perf_counter()
        corpus = load_corpus([str(path)])
        return time.perf_counter() - started, corpus


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser("pdf_extract_cache", __doc__, "pdf_extract_cache")
    parser.add_argument("--pages", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pdf", action="append", default=[], help="another PDF to read (repeatable)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ktcli-extract-bench-"))
    generated = work / f"report-{args.pages}-pages.pdf"
    generated.write_bytes(generated_report(args.pages))
    rows = []
    for path in (SAMPLE, generated, *map(Path, args.pdf)):
        first, again, same = [], [], True
        for round_ in range(args.rounds):
            cache = work / f"cache-{path.stem}-{round_}"
            cold, read = timed(path, cache)
            warm, kept = timed(path, cache)
            first.append(cold)
            again.append(warm)
            same = same and kept == read
        row = {"pdf": path.name, "pages": len(read.documents[0].pages), "chars": len(read.documents[0].text),
               "first_read_s": round(min(first), 3), "from_cache_s": round(min(again), 4),
               "speedup": round(min(first) / max(min(again), 1e-6), 1), "documents_equal": same}
        rows.append(row)
        print(f"{row['pdf']:<40} {row['pages']:>4} pages  first {row['first_read_s']:>7.3f} s  "
              f"cached {row['from_cache_s']:>7.4f} s  {row['speedup']:>7.1f}x  equal: {same}", file=sys.stderr)
    report(args.name, {"benchmark": "pdf_extract_cache", "machine": machine(), "rounds": args.rounds, "rows": rows},
           args.json)
    return 0 if all(r["documents_equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
