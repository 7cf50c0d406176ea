"""A deterministic stand-in for a model, for pipeline tests that must not wait on one.

It "reads" like an extractive reader: it answers with the source lines that share the
most words with the question, so tests can check what evidence reached the model.
"""

from __future__ import annotations

import re

from ktcli.engine.backend import GenStats, SamplingParams

WORD = re.compile(r"[a-z0-9]+")


class FakeBackend:
    name = "fake"

    def __init__(self, context_window: int = 8192, count=None) -> None:
        """`count`: text -> tokens (default: words and line breaks; a BPE count where
        punctuation-heavy text such as paths must cost what it does in a real model)."""
        self.context_window = context_window
        self._count = count
        self.calls: list[list[dict]] = []
        self._stats = GenStats()

    def finish(self) -> str | None:
        return None

    @property
    def last_stats(self) -> GenStats:
        return self._stats

    def count_tokens(self, text: str) -> int:
        if self._count is not None:
            return self._count(text)
        return len(text.split()) + text.count("\n")

    def prompt_tokens(self, messages) -> int:
        return sum(self.count_tokens(m["content"]) + 4 for m in messages)

    def _reply(self, messages) -> str:
        content = messages[-1]["content"]
        question = content.rsplit("Question:", 1)[-1].split("\n")[0] if "Question:" in content else ""
        qwords = set(WORD.findall(question.lower())) - {"what", "is", "the", "a", "of"}
        best, best_score = "I could not find it.", 0
        for line in content.split("\n"):
            if line.startswith(("Question:", "Answer", "Update", "[")):
                continue
            score = len(qwords & set(WORD.findall(line.lower())))
            if score > best_score:
                best, best_score = line.strip(), score
        return best

    def stream_chat(self, messages, params: SamplingParams):
        # As the engine does ("KV cache full"): a prompt and answer budget past the window
        # is the pipeline's mistake, and every pipeline test checks for it.
        needed = self.prompt_tokens(messages) + params.max_new_tokens
        if needed > self.context_window:
            raise AssertionError(f"{needed} tokens sent into a {self.context_window}-token window")
        self.calls.append(messages)
        reply = self._reply(messages)
        self._stats = GenStats(prompt_tokens=self.prompt_tokens(messages), new_tokens=len(reply.split()),
                               prefill_s=0.01, decode_s=0.01, ttft_s=0.01)
        for word in reply.split(" "):
            yield word + " "

    def generate_chat_batch(self, batch, params):
        return ["".join(self.stream_chat(m, params)).strip() for m in batch]
