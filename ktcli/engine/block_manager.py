"""Which KV page belongs to which sequence. Pure Python: never touches a tensor.

A page (block) holds `block_size` consecutive tokens of one sequence. A sequence's block
table lists its pages in order, so token t lives in slot
`table[t // block_size] * block_size + t % block_size` of the cache.

Allocation prefers the page right after a sequence's last one: a sequence whose pages
are consecutive can be read by attention as one strided view of the cache, no gather.
The free list is a deque of hints checked against `_is_free` (the truth), so taking a
page out of order costs O(1) and stale hints are skipped when popped.
"""

from __future__ import annotations

from collections import deque

from ktcli.errors import OutOfMemoryError


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._is_free = [True] * num_blocks
        self._hints: deque[int] = deque(range(num_blocks))
        self._n_free = num_blocks

    @property
    def num_free(self) -> int:
        return self._n_free

    @property
    def num_used(self) -> int:
        return self.num_blocks - self._n_free

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def can_grow(self, table: list[int], n_tokens: int) -> bool:
        """Whether `table` can cover `n_tokens` tokens with the pages left."""
        return self.blocks_for(n_tokens) - len(table) <= self._n_free

    def grow(self, table: list[int], n_tokens: int) -> None:
        """Extend `table` in place to cover `n_tokens` tokens. All or nothing: raises
        OutOfMemoryError, with `table` unchanged, when the pages left are too few."""
        need = self.blocks_for(n_tokens) - len(table)
        if need <= 0:
            return
        if need > self._n_free:
            raise OutOfMemoryError(
                f"KV cache full: {need} more pages of {self.block_size} tokens needed, "
                f"{self._n_free} of {self.num_blocks} free (raise the KV memory budget or shorten the input)"
            )
        for _ in range(need):
            table.append(self._take(table[-1] + 1 if table else None))

    def _take(self, preferred: int | None) -> int:
        if preferred is not None and preferred < self.num_blocks and self._is_free[preferred]:
            block = preferred
        else:
            while True:
                block = self._hints.popleft()
                if self._is_free[block]:
                    break
        self._is_free[block] = False
        self._n_free -= 1
        return block

    def free(self, table: list[int]) -> None:
        """Return every page of `table` and empty it. Freeing a page twice is a bug in
        the caller and raises rather than corrupting the free list."""
        for block in table:
            if self._is_free[block]:
                raise RuntimeError(f"block {block} freed twice")
        for block in table:
            self._is_free[block] = True
            self._hints.append(block)
        self._n_free += len(table)
        table.clear()
        if len(self._hints) > 4 * self.num_blocks:
            # Stale hints pile up when pages are taken out of order; rebuild now and then.
            self._hints = deque(b for b in range(self.num_blocks) if self._is_free[b])

    def is_free(self, block: int) -> bool:
        return self._is_free[block]
