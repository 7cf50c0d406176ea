"""Notes a step wrote, kept on disk under what made them: the model and how it runs (the
backend's `outputs_key`), the prompt, the sampling settings. A summary read in parts
writes one set of notes per part, each from the part and the notes before it, so the same
command again finds every part's notes and writes only the summary; one interrupted (or
killed) picks up at the first part it had not read. A summary of ktcli/pipeline took 38 s
a second time over; it now takes the last step's seconds.

Only greedy steps are kept (a sampled step's notes are one draw of many) and only where
the prompt cache is on (`prompt_cache`: what was read stays off the disk where it is
off). Entries are small (a few KB), with a digest of their text and name (`checked_json`:
an entry edited by hand is written again, not read as notes); the oldest go past
MAX_ENTRIES. The key is the prompt's tokens as the backend renders them (an edited chat
template is another prompt), the sampling settings, the backend's outputs_key and
ktcli's, torch's and transformers' versions. The plan, which loads no model and renders
no prompt, cannot find the entries by their keys: each request (its task, question,
input and settings: `request_key`) records the entries its run read or wrote, in
`requests/`, and the plan counts those still kept (`kept`). A summary's rerun was
planned at ~54 s and took 3.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import NamedTuple

from ktcli.checked_json import dumps, loads
from ktcli.engine.backend import Backend, Message, SamplingParams

FOLDER = "notes"
REQUESTS = "requests"  # under FOLDER: each request's entries, for the plan
MAX_ENTRIES = 4096
FORMAT = 1
# Settings that change no step's prompt or output (where the cache lives, threads, the
# server's key and patience), left out of a request's key.
_NOT_IN_REQUEST = frozenset({"cache_dir", "threads", "api_key", "request_timeout", "origins"})
# Settings that steer only the plan's choice of read (the mode, whether a summary reads
# outlines), also left out: the choice itself is in the key (`request_key`'s `read`). A
# rerun that added only --outline always, where the first run had outlined for its time
# budget, or another --max-seconds, was planned at ~127 s and read its notes back in 8.7.
_PLANNED = frozenset({"mode", "outline", "max_seconds", "max_memory"})


def request_key(task: str, question: str, documents, settings, read: object = None) -> str:
    """What a request's note steps follow from, as the plan knows it before any model is
    loaded: the task, the question, the documents (paths and texts' hashes), the settings
    that shape its windows and prompts, and `read`: the read its plan chose (`read_chosen`),
    not the settings that chose it (`_PLANNED`). Not exact (a model file replaced under
    its name keeps the key): the plan's estimate only; a step is read back by its own key."""
    from dataclasses import asdict

    from ktcli.plan.planner import MEMORY_TOKENS

    shaping = {k: v for k, v in asdict(settings).items() if k not in _NOT_IN_REQUEST | _PLANNED}
    # The answer budget shapes the note steps' windows as what a step writes: never less
    # than the notes' MEMORY_TOKENS (`planner.evidence_room`). A rerun with --max-new-tokens
    # 200 read all 5 parts' notes back in 5 s and was planned at ~349 s (a probe's).
    shaping["max_new_tokens"] = max(settings.max_new_tokens, MEMORY_TOKENS)
    blob = json.dumps({"format": FORMAT, "task": task, "question": question, "settings": shaping, "read": read,
                       "documents": [(d.path, d.sha256 or hashlib.sha256(d.text.encode("utf-8", "surrogatepass")).hexdigest())
                                     for d in documents], "versions": _versions(), "prompts": _prompt_words()},
                      sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def read_chosen(plan) -> dict:
    """What of a plan its note steps follow from: its mode, KV pages and attention, and
    whether a summary reads outlines (all outlines or none: `prepare`)."""
    return {"mode": plan.mode.value, "kv_dtype": plan.kv_dtype, "attention": plan.attention,
            "outlined": bool(plan.outline_files)}


def _record(cache_dir: Path, request: str) -> dict:
    """`request`'s record, as its last run wrote it ({} where there is none, or it is not
    a JSON object)."""
    try:
        record = json.loads((Path(cache_dir) / FOLDER / REQUESTS / f"{request}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


class KeptNotes(NamedTuple):
    """What a request's last run left in the memo, for the plan of the next."""

    steps: int = 0  # its note steps still kept (0 where none ran)
    whole: bool = False  # all of its steps: it read every part, and none has gone since
    text: str = ""  # those notes in step order, joined: what a summary whose every step is kept reads
    # The windows it packed (0 where not known): the same read packs the same, where the
    # plan's estimate may not (a folder of uneven files planned at 8 windows was read in 5,
    # and its summary resumed after Ctrl-C was planned at 277 s for 137).
    windows: int = 0


def kept(cache_dir: Path, request: str) -> KeptNotes:
    """`request`'s notes still kept, read once: its record, then each entry's text with its
    digest checked, as the run's `get` does (a few KB each: ~0.1 ms). Counted by existence,
    an entry edited since it was written was planned as read back and then written again."""
    folder = Path(cache_dir) / FOLDER
    record = _record(cache_dir, request)
    windows = record.get("windows", 0)
    windows = windows if isinstance(windows, int) and not isinstance(windows, bool) and windows > 0 else 0
    entries = record.get("entries")
    if not isinstance(entries, list):
        return KeptNotes(windows=windows)
    texts = [_entry_text(folder / Path(name).name) if isinstance(name, str) else None for name in entries]
    found = [text for text in texts if text is not None]
    whole = record.get("complete") is True and len(found) == len(entries) > 0
    return KeptNotes(len(found), whole, "\n".join(found), windows)


class NotesMemo:
    def __init__(self, folder: Path, outputs_key: str, params: SamplingParams, render=None, request: str = ""):
        """`render`: messages -> the prompt's token ids (the backend's `chat_ids`), which
        the key hashes where given: an edited chat template changes them, not the messages.
        `request`: the run's `request_key`, under which its entries are recorded."""
        self.folder = Path(folder)
        self._base = {"format": FORMAT, "backend": outputs_key, "max_new_tokens": params.max_new_tokens,
                      "stop": list(params.stop), "top_k": params.top_k, "versions": _versions()}
        self._render = render
        self._last: tuple[str, Path] | None = None  # the last messages' JSON and their entry
        self.kept = 0  # notes read back in this run
        self.failed = False  # a note could not be kept (a read-only or full disk)
        self._trimmed = False
        self._request = request
        self._entries: list[str] = []  # this run's entries, in step order
        self._complete = False  # every note step of the run has been taken (`finish`)
        # The windows the run packed, recorded for a rerun's plan (`kept`); 0: not said.
        self.windows = 0

    @classmethod
    def for_run(cls, cache_dir: Path, prompt_cache: bool, backend: Backend,
                params: SamplingParams, request: str = "") -> NotesMemo | None:
        """The memo for a run's note steps, or None where notes are not kept: the prompt
        cache off, a sampled step, or a backend whose outputs can change under the same
        name (a server's model)."""
        key = getattr(backend, "outputs_key", None)
        if not prompt_cache or params.temperature > 0 or not key:
            return None
        return cls(Path(cache_dir) / FOLDER, key, params, getattr(backend, "chat_ids", None), request)

    def holds(self, messages: list[Message]) -> bool:
        """Whether notes for `messages` are kept (their step will read them back): the entry
        read and its digest checked, as `get` will (by existence alone, an entry edited since
        it was written was held, and its step then wrote it again)."""
        return _entry_text(self._path(messages)) is not None

    def get(self, messages: list[Message]) -> str | None:
        path = self._path(messages)
        text = _entry_text(path)
        if text is None:
            return None
        try:
            os.utime(path)  # used: the last to go
        except OSError:
            pass
        self.kept += 1
        self._record(path)
        return text

    def put(self, messages: list[Message], text: str) -> None:
        """Keep `text` for `messages`; a disk that refuses keeps nothing, quietly (the run
        has its notes; only a later one loses them)."""
        path = self._path(messages)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp.write_text(dumps(path.name, {"text": text}), encoding="utf-8")
            os.replace(tmp, path)  # a reader never sees half an entry
        except OSError:
            self.failed = True
            _unlink(tmp)
            return
        self._record(path)
        try:
            self._trim()
        except OSError:
            pass  # kept all the same; the next run trims

    def finish(self) -> None:
        """Every note step of the run is taken: recorded so, so a plan of the same request
        counts all of its note steps as kept, whatever number of windows it estimates (a
        summary planned 7 where the run read 6 was priced at one window read: 52 s to its
        first token, against 7 s)."""
        if self._entries and not self._complete and not self.failed:
            self._complete = True
            self._write_record()

    def _record(self, path: Path) -> None:
        """`path` among the request's entries, the record rewritten whole (a few hundred
        bytes), so that a run killed midway leaves its parts so far recorded."""
        if not self._request or path.name in self._entries:
            return
        self._entries.append(path.name)
        self._write_record()

    def _write_record(self) -> None:
        if not self._request:
            return
        folder = self.folder / REQUESTS
        record = folder / f"{self._request}.json"
        tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            record_json = {"entries": self._entries, "complete": self._complete} | \
                ({"windows": self.windows} if self.windows else {})
            tmp.write_text(json.dumps(record_json), encoding="utf-8")
            os.replace(tmp, record)
        except OSError:
            _unlink(tmp)  # the plan then does not know; the notes are kept all the same

    def _path(self, messages: list[Message]) -> Path:
        """The entry of `messages`. A step's `get` and `put` ask for the same messages: the
        prompt is rendered into tokens (the whole window's, thousands) once for both."""
        plain = json.dumps(messages, sort_keys=True, ensure_ascii=False)
        if self._last is not None and self._last[0] == plain:
            return self._last[1]
        prompt: object = messages
        if self._render is not None:
            try:
                prompt = self._render(messages)
            except Exception:  # noqa: BLE001 - the step itself then says what is wrong
                prompt = messages
        blob = json.dumps(self._base | {"prompt": prompt}, sort_keys=True, ensure_ascii=False)
        path = self.folder / (hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:40] + ".json")
        self._last = (plain, path)
        return path

    def _trim(self) -> None:
        """The oldest entries past MAX_ENTRIES, and temp files a killed run left (an hour
        old); once a run, as its first note is kept: every part of a 100-part summary
        statted all 4,096 entries."""
        if self._trimmed:
            return
        self._trimmed = True
        from ktcli.engine.model_store import sweep_stale

        sweep_stale(self.folder, ".*.tmp")  # `put`'s temp files
        sweep_stale(self.folder / REQUESTS, ".*.tmp")
        for folder in (self.folder, self.folder / REQUESTS):
            entries = []
            for p in folder.glob("*.json"):
                try:
                    entries.append((p.stat().st_mtime, p))
                except OSError:
                    continue
            for _, p in sorted(entries)[:max(0, len(entries) - MAX_ENTRIES)]:
                _unlink(p)


def _entry_text(path: Path) -> str | None:
    """The notes kept in the entry at `path`; None where there is none, or it is damaged,
    changed since it was written (its digest) or unreadable: written again."""
    try:
        text = loads(path.name, path.read_text(encoding="utf-8"))["text"]  # (loads' None: changed)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return text if isinstance(text, str) else None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _prompt_words() -> str:
    """A digest of every word ktcli writes into a prompt: notes written under other words are
    no step of this request's. A prompt edited between two runs of one version was planned
    as "notes of 2 of its 2 note steps are kept" and read every part again (probe 117)."""
    from ktcli.pipeline import prompts

    return hashlib.sha256((prompts.instructions() + prompts.OUTLINE_NOTE).encode()).hexdigest()[:16]


def _versions() -> str:
    """ktcli's and torch's versions: a new release may clean notes up otherwise, or compute
    a step's numbers otherwise, and its notes are its own."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("ktcli", "torch", "transformers"):
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            out.append(f"{name} -")
    return ", ".join(out)
