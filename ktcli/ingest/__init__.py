"""Sources to records: files, folders and stdin become a Corpus of Documents, and
Documents become token-aware, overlapping Chunks that cite their lines (or PDF page)."""

from ktcli.ingest.chunking import chunk_corpus, chunk_document
from ktcli.ingest.corpus import load_corpus
from ktcli.ingest.tokens import count_tokens

__all__ = ["chunk_corpus", "chunk_document", "count_tokens", "load_corpus"]
