"""Access tokens written inside ordinary files (a GitHub token in a config.yml, an AWS key in
a script): masked in what is sent to a remote model server (`--backend openai`).

Files that hold secrets by their name (.env, keys) or a private key by their content are
left out of folder walks already (`ingest.walk`); a token inside a file that is otherwise
worth reading was read without a word, and with --backend openai sent to the server with
the question. A local model reads it where it lies: nothing is masked then.

Only formats whose shape says what they are, with a fixed prefix, are matched, so prose,
hashes and ids are not: a token is kept as its prefix and asterisks to its length, so the
text keeps its line breaks and offsets (a PDF's pages, the citations' lines) and the model
still sees that a token stands there.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ktcli.types import Document

# (what it is, its pattern: the part kept, then the part masked)
_TOKENS = (
    ("a GitHub token", r"(gh[pousr]_)([A-Za-z0-9]{36,255})"),
    ("a GitHub token", r"(github_pat_)([A-Za-z0-9_]{60,255})"),
    ("an AWS access key", r"((?:AKIA|ASIA))([0-9A-Z]{16})"),
    ("a Slack token", r"(xox[abposr]-)([0-9A-Za-z-]{10,250})"),
    ("an OpenAI or Anthropic API key", r"(sk-(?:proj-|ant-(?:api|admin)\d\d-)?)([A-Za-z0-9_-]{32,250})"),
    ("a Google API key", r"(AIza)([0-9A-Za-z_-]{35})"),
    ("a Stripe secret key", r"((?:sk|rk)_live_)([0-9A-Za-z]{24,99})"),
    ("a GitLab token", r"(glpat-)([0-9A-Za-z_-]{20,})"),
    ("a Hugging Face token", r"(hf_)([A-Za-z0-9]{34,})"),
)
_PATTERN = re.compile("|".join(f"(?<![A-Za-z0-9_-]){p}(?![A-Za-z0-9_])" for _, p in _TOKENS))


def mask(text: str) -> tuple[str, list[tuple[str, int]]]:
    """`text` with each token's secret part as asterisks (same length), and (what it is,
    its line) for each."""
    found: list[tuple[str, int]] = []

    def masked(m: re.Match[str]) -> str:
        group = next(i for i in range(1, len(m.groups()) + 1, 2) if m.group(i) is not None)
        found.append((_TOKENS[group // 2][0], text.count("\n", 0, m.start()) + 1))
        return m.group(group) + "*" * len(m.group(group + 1))

    return _PATTERN.sub(masked, text), found


def masked_documents(documents: tuple[Document, ...]) -> tuple[tuple[Document, ...], list[str]]:
    """The documents with their tokens masked, and a note for each document that held any
    ("config.yml:3 (a GitHub token)")."""
    from ktcli.ingest.loaders import text_sha256

    out, notes = [], []
    for doc in documents:
        text, found = mask(doc.text)
        if not found:
            out.append(doc)
            continue
        pages = tuple(replace(p, text=mask(p.text)[0]) for p in doc.pages)
        out.append(replace(doc, text=text, pages=pages, sha256=text_sha256(text)))
        kinds = sorted({kind for kind, _ in found})
        notes.append(f"{doc.path}:{found[0][1]} ({', '.join(kinds)}{f', {len(found)} in all' if len(found) > 1 else ''})")
    return tuple(out), notes
