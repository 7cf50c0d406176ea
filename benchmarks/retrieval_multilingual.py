"""Retrieval over documents in scripts the bundled embedder cannot read: does the chunk
that answers a question in the document's language reach the top 8 that `ktcli ask` reads?

    python -m benchmarks.retrieval_multilingual --json    # ~1 min here

Synthetic documents, one per language (Arabic, Hebrew, Russian, Greek, Chinese, Japanese,
Korean, German, English): 30 chapters of one repeated report sentence, and in one chapter
a fact (who built a bridge, when, for how much); the question asks it in the document's
language with the fact's own words (`ktcli`'s session probe of 2026-12-05 built these).
Each document is chunked as the CLI chunks it (256 tokens, 32 shared) and indexed with the
real embedder (all-MiniLM-L6-v2, English) and BM25; the fact chunk's rank is then taken
three ways in the same run:
* now: `HybridIndex.search` (the dense ranking weighted by the share of the question the
  embedder reads as words, `Embedder.vocabulary_share`; headings alone ranked last);
* before: the same fusion with the dense ranking at full weight and headings alone where
  their scores put them (the search before 2026-12-05);
* bm25: the lexical ranking alone.
Synthetic text is one shape of document; the English row shows that nothing moved there.
"""

from __future__ import annotations

import time

from benchmarks import common

# (language, heading word, filler sentence, fact, question, words of the answer)
CASES = [
    ("ar", "الفصل", "يصف هذا التقرير الوضع العام للإدارة البلدية ومهامها الرئيسية في العام الحالي. ",
     "تم بناء جسر النيل عام 1902 على يد المهندس أحمد حسن بتكلفة 45000 جنيه.", "من بنى جسر النيل؟", "أحمد حسن"),
    ("he", "פרק", "הדוח מתאר את המצב הכללי של העירייה ואת משימותיה העיקריות בשנה הנוכחית. ",
     "גשר הירקון נבנה בשנת 1925 על ידי המהנדס דוד כהן בעלות של 7000 לירות.", "מי בנה את גשר הירקון?", "דוד כהן"),
    ("ru", "Глава", "В докладе описывается общее положение городской администрации и её задачи в текущем году. ",
     "Мост через реку Яузу был построен в 1903 году инженером Фёдором Ершовым за 52 000 рублей.",
     "Кто построил мост через реку Яузу?", "Ершовым"),
    ("el", "Κεφάλαιο", "Η έκθεση περιγράφει τη γενική κατάσταση της δημοτικής διοίκησης και τα καθήκοντά της. ",
     "Η γέφυρα του Ισθμού χτίστηκε το 1893 από τον μηχανικό Νικόλαο Παπαδόπουλο με κόστος 80.000 δραχμές.",
     "Ποιος έχτισε τη γέφυρα του Ισθμού;", "Παπαδόπουλο"),
    ("zh", "第章", "本报告介绍了城市管理部门在本年度的总体情况和主要工作任务，包括交通、教育、医疗和环境保护等方面的内容。",
     "长江大桥于一九五七年由工程师王建国设计建造，总造价为一千四百万元。", "长江大桥的总造价是多少？", "王建国"),
    ("ja", "第節", "この報告書は、市役所の今年度の全体的な状況と主な業務について説明しています。交通、教育、医療が含まれます。",
     "富士見橋は一八九九年に技師の田中一郎によって建設され、費用は三万五千円でした。", "富士見橋を建設したのは誰ですか？", "田中一郎"),
    ("ko", "장", "이 보고서는 시청의 올해 전반적인 상황과 주요 업무에 대해 설명합니다. 교통, 교육, 의료가 포함됩니다. ",
     "한강대교는 1917년에 기술자 김철수가 건설했으며 비용은 오만 원이었습니다.", "한강대교는 누가 건설했습니까?", "김철수"),
    ("de", "Abschnitt", "Der Bericht beschreibt die allgemeine Lage der Stadtverwaltung und ihre Aufgaben im laufenden Jahr. ",
     "Die Brücke über die Mühlenstraße wurde 1897 von Ingenieur Jürgen Größmann für 43.500 Goldmark gebaut.",
     "Wer hat die Brücke über die Mühlenstraße gebaut?", "Größmann"),
    ("en", "Chapter", "The report describes the general state of the city administration and its tasks this year. ",
     "The bridge over the Mill Street was built in 1897 by engineer Joan Greaves for 43,500 pounds.",
     "Who built the bridge over the Mill Street?", "Greaves"),
]
AT = 13  # the chapter that holds the fact


def _document(heading: str, filler: str, fact: str) -> str:
    return "\n\n".join(f"## {heading} {i}\n\n" + filler * 6 + (fact if i == AT else "") for i in range(1, 31)) + "\n"


def _rank(order: list[int], chunks, answer: str) -> int | None:
    """1-based rank of the first chunk holding the answer in the top 8, else None."""
    for rank, idx in enumerate(order[:8], start=1):
        if answer in chunks[idx].text:
            return rank
    return None


def main() -> None:
    args = common.arg_parser("retrieval_multilingual", __doc__, "retrieval_multilingual").parse_args()
    from ktcli.ingest.chunking import chunk_document
    from ktcli.ingest.loaders import document_from_bytes
    from ktcli.retrieval.embedder import Embedder
    from ktcli.retrieval.retriever import HybridIndex, _fuse
    from ktcli.retrieval.symbols import code_names

    embedder = Embedder()
    started = time.perf_counter()
    rows = []
    for lang, heading, filler, fact, question, answer in CASES:
        name = f"{lang}.md"
        chunks = chunk_document(document_from_bytes(_document(heading, filler, fact).encode(), name, name),
                                chunk_tokens=256, overlap_tokens=32)
        index = HybridIndex.build(chunks, embedder=embedder, store=None)
        depth = min(len(chunks), 50)
        dense = index.dense.search(embedder.embed_query(question), depth)
        lexical = index.lexical.search(question, depth)
        positions = {id(c): k for k, c in enumerate(index.chunks)}
        now = [positions[id(h.chunk)] for h in index.search(question, 8)]
        before = [positions[id(h.chunk)] for h in _fuse(index.chunks, dense, lexical, 8, index.symbols.defining(
            code_names(question)))]
        bm25 = [idx for idx, _ in lexical]
        rows.append({"language": lang, "chunks": len(chunks), "vocabulary_share": round(embedder.vocabulary_share(question), 2),
                     "rank_now": _rank(now, index.chunks, answer), "rank_before": _rank(before, index.chunks, answer),
                     "rank_bm25": _rank(bm25, index.chunks, answer),
                     "headings_alone_in_top8_now": sum(index.chunks[i].heading_only for i in now),
                     "headings_alone_in_top8_before": sum(index.chunks[i].heading_only for i in before)})
    summary = {way: {"recall@1": sum(r[f"rank_{way}"] == 1 for r in rows), "recall@8": sum(r[f"rank_{way}"] is not None for r in rows),
                     "of": len(rows)} for way in ("now", "before", "bm25")}
    result = {"machine": common.machine(), "cases": rows, "summary": summary,
              "wall_s": round(time.perf_counter() - started, 1)}
    for r in rows:
        print(f"{r['language']}: share {r['vocabulary_share']:.2f}, rank now {r['rank_now']}, before {r['rank_before']}, "
              f"bm25 {r['rank_bm25']}; headings alone in the top 8 {r['headings_alone_in_top8_now']} "
              f"(before {r['headings_alone_in_top8_before']})")
    print(summary)
    common.report(args.name, result, args.json)


if __name__ == "__main__":
    main()
