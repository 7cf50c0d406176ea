"""What goes to stdout: the answer's citations after the streamed text, or one JSON object."""

from __future__ import annotations

import json
from dataclasses import asdict
from enum import Enum

from ktcli.types import SECTION_SEPARATOR, TABLE_TRAIL, Answer, Plan, Skipped


def citations_text(answer: Answer) -> str:
    """What stdout shows after the answer: its Sources block and a summary's file map, with
    no blank lines above them where there was no answer (man-db's docs, of which the model
    wrote nothing, printed two blank lines above their file map: probe 117)."""
    if not answer.text.strip() and answer.plan.task == "ask":
        return no_answer(answer)
    text = _citations_text(answer)
    return text if answer.text.strip() else text.lstrip("\n")


def no_answer(answer: Answer) -> str:
    """What stdout says of a question with no answer: a blank stdout, or the model's bare
    "[1]" over a Sources list (its `.gitignore`), read as an answer to a question the input
    could not answer ("What is the capital of France?" of a code repo). Said on stdout, as
    the not-found notice is: a pipeline loses stderr."""
    labels = answer.stats.get("labels_only")
    said = (f"No answer: the model wrote only a source label ({labels}), no words, so nothing is cited."
            if labels else "No answer: the model wrote none.")
    return f"{said} {_not_found(answer.grounding or {})[0]}." if answer.not_in_documents else said


def _citations_text(answer: Answer) -> str:
    """The Sources block. Numbered as the model read its sources, where it did, so that the
    answer's "[3]" is the Sources' [3] (they were renumbered 1..n, and an answer's [3]
    pointed at nothing or at another source), in their order; the places cited in one
    source are listed under its number, best first."""
    # An answer cut off inside a code block (--max-new-tokens, a stopped loop) left it open:
    # the Sources were shown as code in a Markdown viewer.
    fence = ("\n```" if _open_fence(answer.text) else "") + _files_text(answer)
    if answer.not_in_documents:
        fence += "\n\n" + _not_found_notice(answer.grounding or {})
    if entry := answer.stats.get("option_entry"):
        fence += f"\n\n{option_entry_notice(entry['option'], entry['entry'])}"
    if not answer.citations:
        return fence + _evidence_read(answer)
    labelled = all(c.label for c in answer.citations)  # else (a summary) numbered in order
    groups: dict[int, list] = {}
    shown: set[tuple[int, str]] = set()
    for c in answer.citations:
        # A place is listed once: a notebook saved unindented is one line, and two of its
        # cells were both `churn.ipynb:1`.
        if (c.label if labelled else 0, c.ref) in shown:
            continue
        shown.add((c.label if labelled else 0, c.ref))
        groups.setdefault(c.label if labelled else len(groups) + 1, []).append(c)
    width = len(f"[{max(groups)}]")
    rows = []
    # In label order, as footnotes are read ([11] with its lines came before [1]..[10]).
    for label, cites in sorted(groups.items()):
        for j, c in enumerate(cites):
            mark = f"[{label}]" if j == 0 else ""
            rows.append(f"  {mark:<{width}} {c.ref}{_section_note(c.section)}")
    return fence + "\n\nSources:\n" + "\n".join(rows)


# Said after an answer the documents seem not to hold (`pipeline.grounding`), on stdout with
# the Sources: it is about the answer's worth, and stderr is what `ktcli ask ... | tool` loses.
# Hedged: the judgement is a heuristic, tuned on 16 questions (benchmarks/unanswerable.py),
# and it fires on questions nothing read matches whether or not the answer's words were read.
_NOTHING_MATCHES = ("Not found in the documents: nothing read matches the question well",
                    "so the answer above is likely the model's own guess, not the documents'")
# (`grounding.year_unread`: the question may match the documents well; the year is what they lack)
_NO_YEAR = ("Not found in the documents: the year the question asks about stands nowhere in what was read",
            "so the answer above is likely about another year, or the model's own guess")
NOT_IN_DOCUMENTS = f"{_NOTHING_MATCHES[0]}, {_NOTHING_MATCHES[1]}."
NO_SUCH_YEAR = f"{_NO_YEAR[0]}, {_NO_YEAR[1]}."


def _names_unread(names: list[str]) -> tuple[str, str]:
    """(`grounding.names_unread`: the question matches the documents but for what it names)"""
    said = ", ".join(names[:3])
    return (f"Not found in the documents: {said} {'stands' if len(names[:3]) == 1 else 'stand'} nowhere in the input",
            "so the answer above is likely about something else, or the model's own guess")


def no_such_name(names: list[str]) -> str:
    lack, so = _names_unread(names)
    return f"{lack}, {so}."


def _figures_elsewhere(figures: list[str]) -> tuple[str, str]:
    """(`grounding.figures_elsewhere`: the answer's figures are the input's, said of something else)"""
    said = ", ".join(figures[:3])
    return (f"Not found in the documents, it seems: the answer's {'figure' if len(figures[:3]) == 1 else 'figures'} "
            f"{said} {'stands' if len(figures[:3]) == 1 else 'stand'} in the input only in lines that say nothing of "
            "what the question asks about", "so the answer above is likely another thing's figure, not the answer")


def figures_elsewhere(figures: list[str]) -> str:
    lack, so = _figures_elsewhere(figures)
    return f"{lack}, {so}."


def _not_found(grounding: dict) -> tuple[str, str]:
    """What the documents lack by the one sign that fired where the question matched what
    was read (a year, a name, misplaced figures), else by the general one; and what that
    makes of the answer."""
    if _question_matched(grounding):
        if grounding.get("year_unread"):
            return _NO_YEAR
        if names := grounding.get("names_unread"):
            return _names_unread(names)
        if figures := grounding.get("figures_elsewhere"):
            return _figures_elsewhere(figures)
    return _NOTHING_MATCHES


def _not_found_notice(grounding: dict) -> str:
    lack, so = _not_found(grounding)
    return f"{lack}, {so}."


def option_entry_notice(option: str, entry: str) -> str:
    """(`qa._check_the_entry`: the answer about an option says little of its own entry)"""
    return f"The input's own entry for {option}, of which the answer above says little: \"{entry}\""


def _question_matched(grounding: dict) -> bool:
    """The question matched what was read: the notice fired for another sign alone."""
    from ktcli.pipeline.grounding import QUESTION_MATCH_BELOW

    return grounding.get("question_match", 0) >= QUESTION_MATCH_BELOW


def _files_text(answer: Answer) -> str:
    """A summary's map of its files (`pipeline.file_map`), each line the place it quotes."""
    files = answer.files
    if files is None:
        return ""
    cut = len(files.folder) + 1 if files.folder else 0
    refs = [f"{path[cut:]}:{line}" for path, line, _ in files.entries]
    width = min(max(map(len, refs)), _FILES_REF_WIDTH)
    rows = [f"  {ref:<{width}}  {text}" for ref, (_, _, text) in zip(refs, files.entries)]
    if files.unlisted:
        rows.append(f"  ... and {files.unlisted} more")
    where = f" in {files.folder}/" if files.folder else ""
    return f"\n\nFiles{where} (each in its own words, or what it defines):\n" + "\n".join(rows)


_FILES_REF_WIDTH = 40


def _evidence_read(answer: Answer) -> str:
    """Where no sentence of an answer could be traced to a line, what the model read: an
    answer with no sources under it left the user nothing to check it against, though the
    evidence (click's `def echo`) was right."""
    evidence = answer.stats.get("evidence") or []
    if not answer.text.strip() or not evidence:
        return ""
    # each place once, with how many passages came from it: a PDF page's passages share
    # its ref (one page was listed 4 times of 8)
    counts: dict[str, int] = {}
    for e in evidence:
        counts[e["ref"]] = counts.get(e["ref"], 0) + 1
    rows = [f"  {ref}" + (f"  ({n} passages)" if n > 1 else "") for ref, n in list(counts.items())[:MAX_READ_SHOWN]]
    if len(counts) > MAX_READ_SHOWN:
        rows.append(f"  ... and {len(counts) - MAX_READ_SHOWN} more")
    return "\n\nRead (no sentence of the answer matched a line of it):\n" + "\n".join(rows)


MAX_READ_SHOWN = 8  # the default top_k


def _open_fence(text: str) -> bool:
    """Whether `text` ends inside a ``` code block (an odd number of fence lines)."""
    return sum(line.lstrip().startswith("```") for line in text.split("\n")) % 2 == 1


def _section_note(section: str) -> str:
    """The last two levels of a citation's section trail, in brackets: enough to place it
    ("A First Look at Classes > Class Definition Syntax"); --json carries the whole trail."""
    if not section:
        return ""
    note = SECTION_SEPARATOR.join(section.split(SECTION_SEPARATOR)[-2:])
    if section.startswith(TABLE_TRAIL):  # a TSV's header row, kept as written for the model: tabs on a terminal
        note = note.replace("\t", ", ")
    return f"  ({note if len(note) <= MAX_NOTE_CHARS else note[: MAX_NOTE_CHARS - 1] + chr(0x2026)})"


MAX_NOTE_CHARS = 120  # a wide table's header row is a trail too


def plan_dict(plan: Plan) -> dict:
    out = asdict(plan)
    out["mode"] = plan.mode.value
    out["reasons"] = list(plan.reasons)
    out["alternatives"] = list(plan.alternatives)
    return out


def skipped_list(skipped: tuple[Skipped, ...]) -> list[dict]:
    return [{"path": s.path, "reason": s.reason, "replaced": s.replaced, "part": s.part} for s in skipped]


def _once_each(citations) -> list:
    """Each (label, ref) once, as the Sources list shows them: two lines of an HTML page (a
    heading and its paragraph) can come from one source line, and --json listed it twice."""
    seen: set[tuple] = set()
    out = []
    for c in citations:
        if (c.label, c.ref) not in seen:
            seen.add((c.label, c.ref))
            out.append(c)
    return out


def answer_json(answer: Answer, warnings: list[str] | tuple[str, ...] = ()) -> str:
    """The --json object of an answer; `warnings`: what stderr said (a summary with no
    text said why only there, and --json's answer was "" with no reason)."""
    payload = {
        "answer": answer.text,
        "citations": [{"ref": c.ref, **_span(c.span), "line": c.line, "score": c.score, "section": c.section,
                       "label": c.label or None} for c in _once_each(answer.citations)],
        "plan": plan_dict(answer.plan),
        "figures": answer.stats,
        "skipped": skipped_list(answer.skipped),
        "warnings": list(warnings),
    }
    if answer.plan.task == "ask":
        payload["not_in_documents"] = answer.not_in_documents
        payload["grounding"] = answer.grounding
    if answer.parts:
        payload["documents"] = [{"path": path, "summary": text} for path, text in answer.parts]
    if answer.files is not None:
        payload["files"] = [{"path": path, "line": line, "says": text} for path, line, text in answer.files.entries]
        payload["files_unlisted"] = answer.files.unlisted
    return json.dumps(payload, indent=2, default=_default, ensure_ascii=False)


def plan_json(plan: Plan, skipped: tuple[Skipped, ...], extra: dict) -> str:
    return json.dumps({"plan": plan_dict(plan), "skipped": skipped_list(skipped), **extra},
                      indent=2, default=_default, ensure_ascii=False)


def _span(span) -> dict:
    return {"path": span.path, "line_start": span.line_start, "line_end": span.line_end, "page": span.page,
            "page_label": span.page_label, "unit": span.kind, "chars": list(span.chars) if span.chars else None}


def _default(o: object) -> object:
    if isinstance(o, Enum):
        return o.value
    return str(o)


def human_bytes(n: float) -> str:
    """Binary units, as the figures line's peak RSS (getrusage counts KiB): the plan said
    decimal "782.0 MB" for what the figures line, in MiB, called "746 MB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def figures_line(answer: Answer) -> str:
    f = answer.stats
    if f.get("model_calls", 1) == 0 and not f.get("tokens_in") and not f.get("tokens_out"):
        # files shown whole, badges listed: no rates of a model that never ran ("prefill 0 tok/s")
        return f"no model run · total {f.get('total_s', 0):.1f}s · peak RSS {f.get('peak_rss_mb', 0):.0f} MiB"
    parts = [
        "summary in parts" if _in_parts(answer.plan) else f"mode {answer.plan.mode.value}",
        f"tokens in {f.get('tokens_in', 0):,}"
        + (f" ({f['reused_tokens']:,} read from the prompt cache)" if f.get("reused_tokens") else "")
        + f" / out {f.get('tokens_out', 0):,}",
        None if f.get("ttft_s") is None else f"ttft {f['ttft_s']:.1f}s",  # (null: no answer text came)
        # No prefill rate worth showing for a prompt read back from the prompt cache (a few
        # tokens prefilled), nor for a server (its time to first token includes its queue
        # and the network: a fast one gave "prefill 694142 tok/s").
        None if f.get("reused_tokens") or f.get("backend") == "openai" else
        f"prefill {f.get('prefill_tok_s', 0):.0f} tok/s" + (" (bf16)" if f.get("prefill_dtype") == "bf16" else ""),
        None if f.get("backend") == "openai" and not f.get("decode_tok_s") else  # one piece: nothing timed
        f"decode {f.get('decode_tok_s', 0):.1f} tok/s",
        f"total {f.get('total_s', 0):.1f}s",
        f"peak RSS {f.get('peak_rss_mb', 0):.0f} MiB",
    ]
    parts = [p for p in parts if p]
    if f.get("notes_kept"):  # a summary's parts read in an earlier run: why it took seconds
        parts.append(f"notes of {f['notes_kept']:,} window{'s' if f['notes_kept'] != 1 else ''} from the cache")
    if f.get("peak_gpu_mb"):
        parts.append(f"peak GPU {f['peak_gpu_mb']:.0f} MiB")  # torch's bytes / 2**20, as peak RSS's KiB / 1024
    if f.get("index_bytes"):
        later = f", {f['not_embedded']:,} left for later questions" if f.get("not_embedded") else ""
        parts.append(f"index {human_bytes(f['index_bytes'])} ({f.get('embedded_now', 0):,} embedded now, "
                     f"{f.get('reused', 0):,} reused{later})")
    if f.get("kv_bytes"):
        parts.append(f"KV {human_bytes(f['kv_bytes'])}")
    return " · ".join(parts)


def _seconds(plan: Plan) -> str:
    """The wait for the first token, then the whole answer budget's time: the total alone
    read as a prediction (~11 s for an answer that took 2)."""
    total = f"~{duration(plan.est_seconds)}"
    if not plan.est_first_token_seconds or plan.est_first_token_seconds == plan.est_seconds:
        return total  # (nothing after it: files shown whole, no model)
    return (f"first token in ~{_short(plan.est_first_token_seconds)}, {total} with all "
            f"{plan.answer_budget:,} tokens of the answer budget")


def _short(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 9.95 else duration(seconds)


def duration(seconds: float) -> str:
    """An estimate as read: seconds up to ten minutes, then minutes, then hours (a 36M-token
    input's plan said "first token in ~27559 s", where "~7.7 h" was the news; probe 108)."""
    if seconds < 600:
        return f"{seconds:.0f} s"
    if seconds < 5970:  # (99.5 minutes: past it, "1.7 h" reads better than "100 min")
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# A summary's "retrieval" retrieves nothing: it reads every chunk, window by window (a
# user took "mode retrieval" for a summary of a few passages).
_PARTS = " (a summary in parts: every chunk read, window by window, notes passed on, then the summary)"


def _in_parts(plan: Plan) -> bool:
    return plan.mode.value == "retrieval" and plan.task == "summarize"


def plan_lines(plan: Plan, est_tokens_note: str = "") -> list[str]:
    lines = [
        f"mode        {plan.mode.value}{_PARTS if _in_parts(plan) else ''}",
        f"task        {plan.task}",
        f"input       ~{plan.input_tokens:,} tokens in {plan.n_documents} document(s){est_tokens_note}",
        f"window      {plan.context_window:,} tokens (answer budget {plan.answer_budget:,})",
    ]
    if plan.mode.value == "retrieval":
        lines.append(f"chunks      {plan.n_chunks:,}" + (f", top {plan.top_k} retrieved" if plan.top_k else ""))
        lines.append(f"windows     ~{plan.n_windows} of up to {plan.evidence_budget:,} evidence tokens")
    # --attention topk alone (full or retrieval) reads the model's own pages under a sparse
    # policy: said too, not left for the user to guess from the estimate
    if plan.mode.value == "sparse" or plan.kv_dtype not in ("model", "auto") \
            or plan.attention not in ("dense", "auto", ""):
        pages = plan.kv_dtype if plan.kv_dtype not in ("model", "auto") else "the model's default"
        lines.append(f"kv cache    {pages} pages, {plan.attention} attention")
    if plan.outline_files:
        lines.append(f"reads       ~{plan.read_tokens:,} tokens: {plan.outline_files} file(s) as outlines")
    if plan.cached_tokens:
        lines.append(f"cached      ~{plan.cached_tokens:,} prompt tokens in the prompt cache (read, not prefilled)")
    # No local memory to plan (a remote server holds the model and its cache): not "~0 B".
    memory = f"~{human_bytes(plan.est_memory_bytes)} memory" if plan.est_memory_bytes else "memory on the server"
    lines.append(f"estimate    {_seconds(plan)}, {memory}")
    lines.extend(f"why         {r}" for r in plan.reasons)
    for alt in plan.alternatives:
        lines.append(
            f"instead     {alt['mode']}" + (f" {alt['kv_dtype']} {alt['attention']}" if "kv_dtype" in alt else "")
            + f": ~{duration(alt['est_seconds'])}, ~{human_bytes(alt['est_memory_bytes'])}, "
            f"{alt['n_windows']} window(s)"
        )
    return lines
