"""A cache entry's JSON with a digest of its payload and its own name, checked when read:
an entry that parses but was changed since it was written (edited by hand, another entry
copied under its name, bytes flipped inside a string) is no entry, and is written again.

Why: ktcli trusted any entry that was valid JSON of the right shape. A PDF's kept pages
(`ingest.extract_cache`) edited to say "revenue was 99 dollars" were answered and cited on
every later run; a summary's kept notes (`pipeline.notes_memo`) the same. Not a defence
against someone who can write the cache and recomputes the digest: the digest is no secret.

The entry is `{"sha256":"<digest>","payload":<payload>}`, the digest taken over the
payload's text as written, not re-serialised to check it: reading a 3 MB entry (a 300-page
book's pages) costs ~10 ms more than json.loads alone, where re-serialising it cost ~50.
"""

from __future__ import annotations

import hashlib
import json

_HEAD = '{"sha256":"'
_BETWEEN = '","payload":'
_DIGEST_LEN = 64


def _digest(name: str, body: str) -> str:
    digest = hashlib.sha256(f"{name}\0".encode("utf-8", "surrogatepass"))
    digest.update(body.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def dumps(name: str, payload: dict, **kwargs) -> str:
    """`payload` (a dict of JSON values) as the entry kept under the file name `name`;
    `kwargs` go to json.dumps."""
    body = json.dumps(payload, **kwargs)
    return f"{_HEAD}{_digest(name, body)}{_BETWEEN}{body}}}"


def loads(name: str, text: str) -> dict | None:
    """The payload of the entry `text` kept under `name`; None where it is not such an
    entry, or its digest is not its payload's and name's."""
    start = len(_HEAD) + _DIGEST_LEN + len(_BETWEEN)
    if not (text.startswith(_HEAD) and text[len(_HEAD) + _DIGEST_LEN : start] == _BETWEEN and text.endswith("}")):
        return None
    body = text[start:-1]
    if text[len(_HEAD) : len(_HEAD) + _DIGEST_LEN] != _digest(name, body):
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None
