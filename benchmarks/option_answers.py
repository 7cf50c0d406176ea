"""Option questions about man pages and --help texts ("what does -f do?"), answered with the
key lines (`pipeline.key_lines`, the default `key_lines=2`) and without them (`key_lines=0`,
the baseline, same run, same model, greedy), each answer scored right / part / wrong by
phrases from the option's own entry.

    python -m benchmarks.option_answers            # 44 questions x 2 arms
    python -m benchmarks.option_answers --quick    # 4 questions, a smoke check
    python -m benchmarks.option_answers --cases man_rm:-f,help_grep:-v   # those questions only
    python -m benchmarks.option_answers --set held_out                   # one set only
    python -m benchmarks.option_answers --check-judged   # the scoring against the hand judgments; no model
    python -m benchmarks.option_answers --rescore        # a results file's answers scored again; no model

Two sets kept apart: `tuned` (32 questions the key-line fixes were made on, probe 132) and
`held_out` (12 questions not tuned on). No page text is in the repository: each page is made
at run time on this machine (`man CMD | col -bx` with MANWIDTH=80, `CMD --help` with
COLUMNS=80); a page the machine lacks is skipped and counted. Each page's sha256 prefix is
recorded beside the one probe 132 judged (`page_as_judged`): another man-db or coreutils
version gives another page, and maybe other answers.

Scoring (`score`): an answer that never names the option is wrong; else it is right when it
holds one of the question's `right` phrases (the entry's meaning) and none of its `wrong`
phrases (another option's meaning, or a meaning the entry does not say); part when it holds
only a `part` phrase (the meaning in part, or vaguely) and no wrong one; else wrong. The
phrases were chosen so that the scores agree with probe 132's hand judgments of its final answers
(`benchmarks/option_answers_judged.json`, checked by `--check-judged` and
tests/test_option_answers.py); they are no judge of answers unlike those, and a new answer
that says the meaning in other words scores wrong: read the answers (they are all in the
results file) before trusting a change of a question or two.

The model is loaded once per distinct KV shape (the plan's window and policy; `loads` in the
results) instead of once per question; the prompt cache is off, so neither arm reads
K/V the other wrote and the order of the questions does not matter.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, ROOT, arg_parser, machine, report

JUDGED = ROOT / "benchmarks" / "option_answers_judged.json"
WIDTH = "80"

# (set, source, command, option, right, part, wrong, sha256[:16] of the page probe 132 judged)
# Phrases are matched in the lowercased answer with runs of whitespace made one space;
# alternatives are separated by "|".
QUESTIONS: list[tuple[str, str, str, str, str, str, str, str]] = [
    ("tuned", "man", "rm", "-f", "ignore nonexistent|never prompt", "", "", "36ad5ed2f4ff55ae"),
    ("tuned", "help", "rm", "-f", "ignore nonexistent|never prompt", "", "", "626b2d44c4ad0400"),
    ("tuned", "man", "curl", "-o", "write output to|instead of stdout", "", "output-dir", "1a35a5f73a9cfd41"),
    ("tuned", "help", "grep", "-v", "non-matching|invert|not match", "", "verbose", "e5ab81dfe2b3bd7c"),
    ("tuned", "man", "grep", "-v", "non-matching|invert|not match", "", "verbose", "946ed19f16030c06"),
    ("tuned", "man", "mkdir", "-p", "make parent directories|parent directories as needed|no error if existing", "",
     "selinux|security context|same permissions", "7d0685558614b6a8"),
    ("tuned", "help", "mkdir", "-p", "make parent directories|parent directories as needed|no error if existing", "",
     "selinux|security context|same permissions", "83fe2b1020319516"),
    ("tuned", "man", "uniq", "-c", "number of occurrences|prefix lines|prefixes each line",
     "count the number of times|counts the number of times", "", "bfd4a88a77794ded"),
    ("tuned", "man", "uniq", "-d", "only print duplicate|print only duplicate|print duplicate lines|one for each group", "",
     "skip|specify the field", "bfd4a88a77794ded"),
    ("tuned", "help", "uniq", "-u", "unique lines", "", "", "caee6ce07c4220eb"),
    ("tuned", "man", "xargs", "-0", "terminated by a null|null character instead of|instead of by whitespace", "",
     "exit", "2d54804e86b951ee"),
    ("tuned", "man", "find", "-print0", "followed by a null character", "", "", "543871553f2a5a58"),
    ("tuned", "man", "ssh", "-p", "port to connect", "port", "", "a7c009e09c8d223c"),
    ("tuned", "man", "ls", "-S", "file size", "", "", "c2d882696fa522ef"),
    ("tuned", "man", "sort", "-r", "reverse", "", "", "55a81dd25e524964"),
    ("tuned", "man", "sort", "-n", "numerical value|numeric value", "", "", "55a81dd25e524964"),
    ("tuned", "man", "head", "-n", "first num lines", "first n lines", "", "293381f3089a0024"),
    ("tuned", "man", "tail", "-f", "appended data|file grows", "", "", "7407f0dbf282cdf5"),
    ("tuned", "man", "wc", "-l", "newline count|line count", "", "byte count|word count", "5b8866d2b5c03fda"),
    ("tuned", "man", "cut", "-d", "delim instead of tab|field delimiter", "", "", "bd53fae637259ac0"),
    ("tuned", "man", "cp", "-i", "prompt before overwrite", "", "", "d1b9519897145aa8"),
    ("tuned", "man", "mv", "-n", "not overwrite", "avoid overwriting", "", "3ef739b62ff03ff6"),
    ("tuned", "man", "ln", "-s", "symbolic link", "", "target directory|numbered links", "92c16807deae7548"),
    ("tuned", "man", "du", "-h", "human readable|human-readable", "", "", "71cb52c1f74dcd2f"),
    ("tuned", "man", "tar", "-x", "extract files|--extract", "", "xattr|new-directory|old-archive", "c3494dc72b253ce6"),
    ("tuned", "man", "tar", "-z", "through gzip|gzip(1)", "", "", "c3494dc72b253ce6"),
    ("tuned", "man", "gzip", "-d", "decompress", "", "", "30e6672f37322016"),
    ("tuned", "man", "cat", "-n", "number all output lines|numbers all output lines", "",
     "nonblank|suppress repeated", "314960d54adafc02"),
    ("tuned", "man", "diff", "-u", "unified context|lines of unified", "", "", "0bb5f23d4e390d10"),
    ("tuned", "help", "sort", "-k", "sort via a key|location and type", "by key|key-value", "", "3bfb9cc774677fdc"),
    ("tuned", "man", "curl", "-L", "redo the request|redirect|follow", "", "", "1a35a5f73a9cfd41"),
    ("tuned", "man", "tr", "-d", "delete characters in|characters in set1|characters in array1",
     "delete|deleted|deletes", "", "d116856ec290b46c"),
    ("held_out", "man", "touch", "-a", "access time", "", "", "862518f2ae18c29a"),
    ("held_out", "man", "tee", "-a", "append", "", "", "0ca1434e9c2f833b"),
    ("held_out", "man", "split", "-l", "lines/records per output|lines per output", "", "", "ba61c20e08baedde"),
    ("held_out", "man", "date", "-u", "utc|universal", "", "iso 8601", "91e83ab7d0a055ed"),
    ("held_out", "man", "chmod", "-R", "recursively", "", "", "adeb77eb1da7516c"),
    ("held_out", "help", "du", "-s", "total for each argument", "summarize", "", "e6e179c3f9ac9c33"),
    ("held_out", "man", "sed", "-i", "in place|in-place", "", "", "170777903b511d19"),
    ("held_out", "man", "ssh", "-i", "private key|public key authentication", "identity file|identity",
     "port|destination", "a7c009e09c8d223c"),
    ("held_out", "help", "ls", "-t", "sort by time|newest first", "", "", "afa92b8bda01cfa8"),
    ("held_out", "man", "curl", "-s", "silent|quiet", "", "version", "1a35a5f73a9cfd41"),
    ("held_out", "help", "od", "-x", "hexadecimal 2-byte|-t x2", "hexadecimal", "", "347721c1735359ad"),
    ("held_out", "man", "nl", "-b", "body lines", "numbering style", "", "baeaa597e8cc804b"),
]
QUICK = (1, 9, 13, 35)  # help rm -f, help uniq -u, man ls -S, man date -u: short pages


@dataclasses.dataclass(frozen=True)
class Question:
    set: str
    source: str  # "man" or "help"
    cmd: str
    option: str
    right: tuple[str, ...]
    part: tuple[str, ...]
    wrong: tuple[str, ...]
    judged_sha: str

    @property
    def page(self) -> str:
        return f"{self.source}_{self.cmd}"

    @property
    def text(self) -> str:
        return f"what does {self.option} do?"


def questions() -> list[Question]:
    def split(s: str) -> tuple[str, ...]:
        return tuple(p for p in s.split("|") if p)

    return [Question(st, src, cmd, opt, split(r), split(p), split(w), sha)
            for st, src, cmd, opt, r, p, w, sha in QUESTIONS]


def select(qs: list[Question], cases: str = "", only_set: str = "") -> list[Question]:
    """The questions `cases` names ("man_rm:-f,help_grep:-v", a page and an option each; a
    page alone names all its questions) within the set `only_set` ("" for both). A name
    that is no question's is an error, not an empty run."""
    if only_set:
        if only_set not in {row[0] for row in QUESTIONS}:
            raise SystemExit(f"--set: no set {only_set!r} (tuned, held_out)")
        qs = [q for q in qs if q.set == only_set]
    if not cases:
        return qs
    wanted = [c.strip() for c in cases.split(",") if c.strip()]
    picked = []
    for case in wanted:
        page, _, option = case.partition(":")
        found = [q for q in qs if q.page == page and (not option or q.option == option)]
        if not found:
            raise SystemExit(f"--cases: no question {case!r} (a page and an option, as man_rm:-f)")
        picked += [q for q in found if q not in picked]
    return picked


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower())


def score(answer: str, q: Question) -> str:
    """right / part / wrong, by the question's phrases (see the module's doc)."""
    low = _norm(answer)
    if not re.search(r"(?<![\w-])" + re.escape(q.option.lower()) + r"(?![\w-])", low):
        return "wrong"  # the tool described, not the option (probe 132: wc's "prints the line counts", W)
    right = any(p in low for p in q.right)
    part = any(p in low for p in q.part)
    wrong = any(p in low for p in q.wrong)
    if wrong:
        return "wrong"
    return "right" if right else "part" if part else "wrong"


def check_judged() -> dict:
    """The scores of probe 132's final answers against its hand judgments (R/P/W)."""
    judged = json.loads(JUDGED.read_text())
    by_key = {(q.page, q.text): q for q in questions()}
    names = {"R": "right", "P": "part", "W": "wrong"}
    rows, disagree = [], []
    for j in judged["answers"]:
        q = by_key[(j["page"], j["q"])]
        got = score(j["answer"], q)
        rows.append(got)
        if got != names[j["hand"]]:
            disagree.append({"page": j["page"], "q": j["q"], "hand": names[j["hand"]], "scored": got,
                             "answer": j["answer"]})
    return {"answers": len(rows), "agree": len(rows) - len(disagree), "disagree": disagree}


# -- pages --------------------------------------------------------------------------------


def page_text(source: str, cmd: str) -> str | None:
    """The page as probe 132 made it, on this machine: None where it lacks one."""
    env = {**os.environ, "MANWIDTH": WIDTH, "COLUMNS": WIDTH}
    env.pop("MAN_KEEP_FORMATTING", None)
    try:
        if source == "man":
            if not shutil.which("man"):
                return None
            raw = subprocess.run(["man", cmd], capture_output=True, env=env, timeout=60)
            if raw.returncode != 0 or not raw.stdout.strip():
                return None
            if shutil.which("col"):
                out = subprocess.run(["col", "-bx"], input=raw.stdout, capture_output=True, timeout=60).stdout
                return out.decode("utf-8", "replace")
            text = raw.stdout.decode("utf-8", "replace")  # col -b by hand: overstrikes dropped
            return re.sub(r".\x08", "", text).expandtabs()
        if not shutil.which(cmd):
            return None
        raw = subprocess.run([cmd, "--help"], capture_output=True, env=env, timeout=60)
        text = raw.stdout.decode("utf-8", "replace")
        return text if raw.returncode == 0 and text.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


# -- answering ------------------------------------------------------------------------------


class _Backends:
    """`api._load`, kept: one backend per distinct KV shape (`loading._long_context`), so
    the weights are read once and the answers are those a fresh load gives."""

    def __init__(self) -> None:
        from ktcli.engine import loading
        from ktcli.pipeline import api

        self.api, self.loading, self.real = api, loading, api._load
        self.kept: dict[str, object] = {}
        self.load_s = 0.0

    def __enter__(self):
        def load(settings, reporter, plan=None):
            key = json.dumps(self.loading._long_context(settings, plan), sort_keys=True, default=str)
            if key not in self.kept:
                start = time.perf_counter()
                self.kept[key] = self.real(settings, reporter, plan)
                self.load_s += time.perf_counter() - start
            return self.kept[key]

        self.api._load = load
        return self

    def __exit__(self, *exc) -> None:
        self.api._load = self.real


def ask(q: Question, page: str, settings) -> dict:
    from ktcli.pipeline import api
    from ktcli.pipeline.events import NullReporter

    class Warnings(NullReporter):
        def __init__(self) -> None:
            self.warns: list[str] = []

        def warn(self, message: str) -> None:
            self.warns.append(message)

    reporter = Warnings()
    start = time.perf_counter()
    try:
        answer = api.ask(["-"], q.text, settings, reporter, stdin_text=page)
        text, mode = answer.text.strip(), getattr(answer.plan.mode, "value", str(answer.plan.mode))
    except Exception as e:  # noqa: BLE001 - an error is a wrong answer, kept in the results
        text, mode = f"ERROR {e!r}", "?"
    return {"answer": text, "score": score(text, q), "mode": mode, "s": round(time.perf_counter() - start, 1),
            "entry_warning": any("own entry" in w for w in reporter.warns)}


def tally(rows: list[dict], arm: str) -> dict:
    scores = [r[arm]["score"] for r in rows if arm in r]
    return {k: scores.count(k) for k in ("right", "part", "wrong")} | {"answered": len(scores)}


ARMS = ("key_lines", "baseline")


def summary(rows: list[dict], skipped: list[dict]) -> dict:
    """Per set: right/part/wrong with and without key lines, and the ratio of the rights."""
    sets = {}
    for name in ("tuned", "held_out"):
        mine = [r for r in rows if r["set"] == name]
        missed = sum(sk["set"] == name for sk in skipped)
        if not mine and not missed:
            continue
        kl, bl = tally(mine, "key_lines"), tally(mine, "baseline")
        sets[name] = {"questions": len(mine) + missed, "skipped": missed, "key_lines": kl, "baseline": bl,
                      "right_ratio": round(kl["right"] / bl["right"], 2) if bl["right"] else None,
                      "pages_as_judged": sum(r["page_as_judged"] for r in mine)}
    return sets


def print_table(result: dict) -> None:
    print(f"\n{'set':<9} {'n':>3} {'skip':>4}  {'key lines R/P/W':>16}  {'baseline R/P/W':>15}  right ratio")
    for name, s in result["sets"].items():
        kl, bl = s["key_lines"], s["baseline"]
        print(f"{name:<9} {kl['answered']:>3} {s['skipped']:>4}  {kl['right']:>6}/{kl['part']}/{kl['wrong']:<6}  "
              f"{bl['right']:>5}/{bl['part']}/{bl['wrong']:<6}  {s['right_ratio']}")
    print(f"loads {result['loads']} ({result['load_s']} s), wall {result['wall_s']} s")


def main(argv: list[str] | None = None) -> dict:
    parser = arg_parser("option_answers", __doc__, "option_answers")
    parser.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} questions (a smoke check)")
    parser.add_argument("--only", default="", help="only questions whose page or option contains this")
    parser.add_argument("--cases", default="",
                        help="only these questions, comma-separated PAGE:OPTION (man_rm:-f,help_grep:-v; a page alone: all its)")
    parser.add_argument("--set", default="", choices=("", "tuned", "held_out"), help="only this set's questions")
    parser.add_argument("--check-judged", action="store_true",
                        help="score probe 132's hand-judged answers and say where the scoring disagrees; no model")
    parser.add_argument("--rescore", action="store_true",
                        help="score the answers in benchmarks/results/NAME.json again (after a change of phrases); no model")
    args = parser.parse_args(argv)

    if args.check_judged:
        checked = check_judged()
        print(f"scoring agrees with the hand judgments on {checked['agree']}/{checked['answers']}")
        for d in checked["disagree"]:
            print(f"  {d['page']} {d['q']}: hand {d['hand']}, scored {d['scored']}: {d['answer'][:120]!r}")
        return checked

    if args.rescore:
        result = json.loads((RESULTS / f"{args.name}.json").read_text())
        by_key = {(q.page, q.text): q for q in questions()}
        for row in result["questions"]:
            for arm in ARMS:
                row[arm]["score"] = score(row[arm]["answer"], by_key[(row["page"], row["q"])])
        result["sets"] = summary(result["questions"], result["skipped"])
        result["rescored"] = machine()["date"]
        print_table(result)
        return report(args.name, result, args.json)

    from ktcli.config import load_settings

    qs = questions()
    if args.quick:
        qs = [qs[i] for i in QUICK]
        if args.name == "option_answers":
            args.name = "option_answers_quick"
    if args.only:
        qs = [q for q in qs if args.only in q.page or args.only in q.option]
    qs = select(qs, args.cases, args.set)
    if (args.only or args.cases or args.set) and args.name == "option_answers":
        args.name = "option_answers_subset"  # (not over the full run's results)
    base = dataclasses.replace(load_settings({}), temperature=0.0, prompt_cache=False)
    arms = {"key_lines": base if base.key_lines else dataclasses.replace(base, key_lines=2),
            "baseline": dataclasses.replace(base, key_lines=0)}

    rows, skipped, pages = [], [], {}
    started = time.perf_counter()
    with _Backends() as backends:
        for i, q in enumerate(qs, 1):
            if q.page not in pages:
                pages[q.page] = page_text(q.source, q.cmd)
            page = pages[q.page]
            if page is None:
                skipped.append({"set": q.set, "page": q.page, "q": q.text})
                print(f"[{i}/{len(qs)}] {q.page} {q.option}: no such page here, skipped", flush=True)
                continue
            sha = hashlib.sha256(page.encode()).hexdigest()[:16]
            row = {"set": q.set, "page": q.page, "q": q.text, "page_sha": sha, "page_as_judged": sha == q.judged_sha}
            for arm, settings in arms.items():
                row[arm] = ask(q, page, settings)
            rows.append(row)
            print(f"[{i}/{len(qs)}] {q.page} {q.option}: key lines {row['key_lines']['score']} "
                  f"({row['key_lines']['s']} s), baseline {row['baseline']['score']} ({row['baseline']['s']} s)",
                  flush=True)

    sets = summary(rows, skipped)
    result = {
        "benchmark": "option_answers",
        "command": "python -m benchmarks.option_answers" + (" --quick" if args.quick else "")
                   + (f" --only {args.only}" if args.only else "")
                   + (f" --cases {args.cases}" if args.cases else "") + (f" --set {args.set}" if args.set else ""),
        "machine": machine(),
        "settings": {"model": base.model, "engine": base.engine, "weights": base.weights, "temperature": 0.0,
                     "key_lines": arms["key_lines"].key_lines, "baseline_key_lines": 0, "prompt_cache": False,
                     "manwidth": WIDTH, "locale": os.environ.get("LC_ALL") or os.environ.get("LANG", "")},
        "loads": len(backends.kept), "load_s": round(backends.load_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
        "skipped": skipped,
        "sets": sets,
        "questions": rows,
    }
    print_table(result)
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
