"""The interface every generation backend implements (transformers today, our engine next).

The pipeline talks to a Backend only: chat messages in, text deltas out, figures after.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol


GREEDY_BELOW = 1e-6  # a temperature under it is greedy: a logit gap of 0.01 is then 10^4


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # Worth keeping this prompt's K/V for later prompts that start the same way (the whole
    # input read before a question; engine.prefix_store). Backends without a store ignore it.
    keep_prompt: bool = False

    def __post_init__(self) -> None:
        # A temperature this small is greedy: float32 logits divided by 1e-300 (0 in float32)
        # gave NaN, and the sampler's error failed every request batched beside it.
        if not self.temperature >= GREEDY_BELOW:  # (NaN too)
            object.__setattr__(self, "temperature", 0.0)


@dataclass
class GenStats:
    """Figures of the last generate call (summed over a batch)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    ttft_s: float = 0.0
    extra: dict = field(default_factory=dict)  # backend-specific: kv pages, kv bytes, ...

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0


Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": "..."}


class Backend(Protocol):
    name: str
    context_window: int

    def count_tokens(self, text: str) -> int:
        """Exact token count with the model's tokenizer (no special tokens)."""

    def prompt_tokens(self, messages: list[Message]) -> int:
        """Tokens the chat template makes of these messages, generation prompt included."""

    def stream_chat(self, messages: list[Message], params: SamplingParams) -> Iterator[str]:
        """Yield the answer's text as it is generated; stats land in `last_stats`."""

    def generate_chat_batch(self, batch: list[list[Message]], params: SamplingParams) -> list[str]:
        """Answer several independent conversations (map steps); batched where the backend can."""

    def finish(self) -> str | None:
        """Work held back until the answer is out (the native engine's prompt-cache
        write); a warning for the user where it failed, else None."""

    @property
    def last_stats(self) -> GenStats: ...
