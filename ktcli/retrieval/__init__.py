"""Retrieval: embedder, BM25 lexical index, faiss dense index, persistent store, hybrid retriever.

Imports are light: torch and sentence-transformers load only when an Embedder first embeds.
"""

from ktcli.retrieval.embedder import Embedder, TextEmbedder
from ktcli.retrieval.retriever import Hit, HybridIndex
from ktcli.retrieval.store import IndexStore

__all__ = ["Embedder", "Hit", "HybridIndex", "IndexStore", "TextEmbedder"]
