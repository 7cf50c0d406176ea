"""Tokenizer and chat template straight from the model folder's tokenizer.json and
template, without transformers' AutoTokenizer (which takes seconds to build here; the
`tokenizers` library reads the same file in a fraction of that). The template is
rendered the way transformers renders it: a sandboxed Jinja environment with
trim_blocks / lstrip_blocks and the special tokens as variables.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from ktcli.errors import UsageError


class ChatTemplateError(UsageError):
    """The model's chat template refuses a conversation (even with the system message
    folded into the first user turn). `ktcli serve` answers it with a 400."""


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # serialized AddedToken
        return value.get("content")
    return value


NO_CHAT_TEMPLATE = "this model has no chat template"


def no_chat_template(folder: Path | str) -> str:
    """Where a template would be, so the fix is plain: a base model, or files left out."""
    return (f"{NO_CHAT_TEMPLATE} ({folder}: no chat_template.jinja, no chat_template in tokenizer_config.json); "
            "give an instruct/chat model")


def no_tokenizer(folder: Path, engine_hf: bool = False) -> str:
    """Where the fix lies: a folder with a slow tokenizer's files (vocab.json and merges.txt,
    tokenizer.model) runs under transformers, which reads them."""
    slow = [] if engine_hf else [n for n in ("vocab.json", "merges.txt", "tokenizer.model") if (Path(folder) / n).is_file()]
    hint = f"; it has {' and '.join(slow)}, which --engine hf reads" if slow else ""
    return f"no tokenizer in {folder} (tokenizer.json){hint}"


def _unreadable(folder: Path, name: str, error: Exception) -> str:
    """A model file that is there but damaged (a download or copy cut short): the file and
    the parser's first line, as a damaged config.json is said (`model_store.model_facts`)."""
    reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
    return f"{folder}: {name} cannot be read ({reason}); copy or download the model again"


def _json_object(path: Path, folder: Path) -> dict:
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, OSError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UsageError(_unreadable(folder, path.name, e)) from None
    if not isinstance(value, dict):
        raise UsageError(_unreadable(folder, path.name, ValueError(f"a JSON {type(value).__name__}, not an object")))
    return value


@lru_cache(maxsize=4)
def load_chat_tokenizer(folder: Path) -> "ChatTokenizer":
    """One ChatTokenizer per model folder and process (~0.2 s to load): the planner counts a
    whole read's prompt with it (`pipeline.prepare`), then the engine uses the same one."""
    return ChatTokenizer(folder)


class ChatTokenizer:
    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise UsageError(no_tokenizer(folder))
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as e:  # noqa: BLE001 - `tokenizers` raises a bare Exception for a file it cannot parse
            raise UsageError(_unreadable(folder, path.name, e)) from None
        cfg_path = folder / "tokenizer_config.json"
        self.config = _json_object(cfg_path, folder) if cfg_path.is_file() else {}
        template_path = folder / "chat_template.jinja"
        if template_path.is_file():
            self.chat_template = template_path.read_text()
        else:
            self.chat_template = self.config.get("chat_template")
            if isinstance(self.chat_template, list):  # named templates: take "default"
                named = {t["name"]: t["template"] for t in self.chat_template}
                self.chat_template = named.get("default") or next(iter(named.values()))
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.eos_token_id = self.tok.token_to_id(self.eos_token) if self.eos_token else None
        self.bos_token_id = self.tok.token_to_id(self.bos_token) if self.bos_token else None
        self.name_or_path = str(folder)
        self._special = frozenset(i for i, t in self.tok.get_added_tokens_decoder().items() if t.special)
        self._plain = None  # the same tokenizer reading special tokens' strings as text (`_as_text`)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return self.tok.get_vocab(with_added_tokens=True)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            template_kwargs: dict | None = None) -> list[int]:
        """The template's text as ids, where a message's own text is only ever text: a
        document that says "<|im_end|>" (one about chat templates) or "<filename>" (a
        README's usage line; SmolLM2 has that special token) would otherwise close the
        user's turn or insert a control token mid-evidence. The template's own special
        tokens stay special."""
        text = self.render(messages, add_generation_prompt, template_kwargs)
        spans = self._content_spans(text, messages, add_generation_prompt, template_kwargs)
        # The template writes the special tokens itself; adding them again would double BOS.
        enc = self.tok.encode(text, add_special_tokens=False)
        ids: list[int] = []
        for tid, (start, end) in zip(enc.ids, enc.offsets):
            if tid in self._special and any(a <= start and end <= b for a, b in spans):
                ids.extend(self._as_text(text[start:end]))
            else:
                ids.append(tid)
        return ids

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               template_kwargs: dict | None = None) -> str:
        """The chat template's text for `messages`, as transformers renders it, with two
        choices of ours: thinking off where the template has the switch (Qwen3's: a
        question about a document wants the answer, not 384 tokens of reasoning), and a
        system message folded into the first user turn where the template refuses one
        (Mistral-Instruct v0.1/v0.2 raise "Conversation roles must alternate").
        `template_kwargs`: the caller's own variables (a server client's
        `chat_template_kwargs`, e.g. {"enable_thinking": true})."""
        from jinja2.exceptions import TemplateError

        if not self.chat_template:
            raise ChatTemplateError(no_chat_template(self.name_or_path))
        try:
            template = _compile(self.chat_template)
        except TemplateError as e:
            raise ChatTemplateError(f"the model's chat template cannot be read: {e}") from None
        kwargs = dict(add_generation_prompt=add_generation_prompt, bos_token=self.bos_token or "",
                      eos_token=self.eos_token or "", enable_thinking=False)
        kwargs.update(template_kwargs or {})
        try:
            return template.render(messages=messages, **kwargs)
        except TemplateError as e:
            refused = e
        folded = _system_folded(messages)
        if folded is not None:
            try:
                return template.render(messages=folded, **kwargs)
            except TemplateError as e:
                refused = e
        raise ChatTemplateError(f"the model's chat template refuses this conversation: {refused}") from None

    def _content_spans(self, text: str, messages: list[dict], add_generation_prompt: bool,
                       template_kwargs: dict | None) -> list[tuple[int, int]]:
        """Where each message's text sits in the rendered `text`: read off the same template
        rendered with a marker for each message's text (`_spans_by_markers`), so that a
        message whose text also occurs in the template before it (a user message
        "<|im_end|>" and the system turn's own end) is not found there; else searched for
        in order."""
        marked = [{**m, "content": _MARKER.format(i)} if _has_text(m) else m for i, m in enumerate(messages)]
        try:
            skeleton = self.render(marked, add_generation_prompt, template_kwargs)
        except ChatTemplateError:
            skeleton = None
        spans = _spans_by_markers(text, skeleton, messages) if skeleton is not None else None
        return spans if spans is not None else _found_spans(text, messages)

    def _as_text(self, text: str) -> list[int]:
        """`text` (a special token's string) tokenised as plain text."""
        if self._plain is None:
            from tokenizers import Tokenizer

            self._plain = Tokenizer.from_str(self.tok.to_str())
            self._plain.encode_special_tokens = True
        return self._plain.encode(text, add_special_tokens=False).ids


# Private-use characters around the message's index: no template trims or escapes them.
_MARKER = "\ue000{}\ue001"
_MARKERS = re.compile("\ue000(\\d+)\ue001")


def _has_text(message: dict) -> bool:
    content = message.get("content")
    return isinstance(content, str) and bool(content.strip())


def _spans_by_markers(text: str, skeleton: str, messages: list[dict]) -> list[tuple[int, int]] | None:
    """Spans of the messages' texts in `text`, walking `skeleton` (the same rendering with
    markers in their place): the template's own text must match piece by piece, and each
    message's text (or, where the template trims it, its stripped form) sit where its
    marker is. None where they do not line up (a template that renders a text by what it
    says, not as is)."""
    spans: list[tuple[int, int]] = []
    at = last = 0
    for marker in _MARKERS.finditer(skeleton):
        literal = skeleton[last : marker.start()]
        if not text.startswith(literal, at):
            return None
        at += len(literal)
        index = int(marker.group(1))
        if index >= len(messages):
            return None
        content = messages[index]["content"]
        form = next((f for f in (content, content.strip()) if text.startswith(f, at)), None)
        if form is None:
            return None
        spans.append((at, at + len(form)))
        at += len(form)
        last = marker.end()
    return spans if text[at:] == skeleton[last:] else None


def _found_spans(text: str, messages: list[dict]) -> list[tuple[int, int]]:
    """Where each message's text sits in the rendered `text`, found in order (a template
    may trim it: then its stripped form)."""
    spans: list[tuple[int, int]] = []
    at = 0
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            continue
        for form in (content, content.strip()):
            found = text.find(form, at)
            if found >= 0:
                spans.append((found, found + len(form)))
                at = found + len(form)
                break
    return spans


def _system_folded(messages: list[dict]) -> list[dict] | None:
    """The conversation with a leading system message put at the head of the first user
    turn; None where there is no system message to fold."""
    if not messages or messages[0].get("role") != "system":
        return None
    system, rest = messages[0].get("content") or "", list(messages[1:])
    for i, m in enumerate(rest):
        if m.get("role") == "user":
            rest[i] = {**m, "content": f"{system}\n\n{m.get('content') or ''}"}
            return rest
    return [{"role": "user", "content": system}, *rest]


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    from jinja2.ext import Extension

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}` marks the assistant's text for training
        masks (transformers' AssistantTracker); rendering, it is its body."""
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", GenerationBlock])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, separators=None, sort_keys=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    # Llama 3.x templates date their system header with it (transformers provides it too)
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
