"""Tokenizer and chat template straight from the model folder's tokenizer.json and
template, without transformers' AutoTokenizer (which takes seconds to build here; the
`tokenizers` library reads the same file in a fraction of that). The template is
rendered the way transformers renders it: a sandboxed Jinja environment with
trim_blocks / lstrip_blocks and the special tokens as variables.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ktcli.errors import InputError


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # serialized AddedToken
        return value.get("content")
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
            raise InputError(f"{folder}: no tokenizer.json")
        self.tok = Tokenizer.from_file(str(path))
        cfg_path = folder / "tokenizer_config.json"
        self.config = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
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
        self.name_or_path = str(folder)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return self.tok.get_vocab(with_added_tokens=True)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        if not self.chat_template:
            raise InputError("this model has no chat template")
        text = _compile(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )
        # The template writes the special tokens itself; adding them again would double BOS.
        return self.encode(text, add_special_tokens=False)


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)
