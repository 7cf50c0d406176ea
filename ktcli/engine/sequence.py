"""One request moving through the engine: its tokens, its pages, its progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

from ktcli.engine.backend import SamplingParams


class Status(Enum):
    WAITING = "waiting"  # no pages yet (or preempted: pages given back, recompute later)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    token_ids: list[int]  # prompt followed by generated tokens
    prompt_len: int
    max_new_tokens: int
    block_table: list[int] = field(default_factory=list)
    num_cached: int = 0  # tokens whose K/V are in the cache
    reused: int = 0  # of them, prompt tokens whose K/V were read from the prefix store
    # Leading prompt tokens the prefix store's best entry holds already, whether or not they
    # could be read back (a sparse read takes whole chunks, short of the question's)
    held: int = 0
    keep_prompt: bool = False  # write the prompt's K/V to the prefix store when it leaves
    # Leading prompt tokens prefilled in whole chunks from position 0, none of them the
    # prompt's last chunk: where rows depend on the chunks (quantized pages), the rows a
    # later prompt that starts the same way would compute alike (engine.prefix_store).
    aligned: int = 0
    waited: int = 0  # prefill steps in a row that gave it no chunk (Engine._take_chunks)
    passed: int = 0  # sequences admitted past it while its pages did not fit (Engine._admit)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    generator: torch.Generator | None = None  # sampling RNG, per sequence
    # Its own temperature, top-k and top-p where they differ from the run's (a server's
    # requests of other sampling share a batch); None: the run's.
    params: SamplingParams | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def pending(self) -> int:
        """Tokens whose K/V still have to be computed (prompt in prefill, 1 in decode)."""
        return len(self.token_ids) - self.num_cached

    @property
    def in_prefill(self) -> bool:
        # More than the last sampled token is missing: the prompt (or a recompute after
        # preemption) is not cached yet.
        return self.pending > 1 or self.num_generated == 0
