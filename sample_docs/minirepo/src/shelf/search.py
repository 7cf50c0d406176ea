"""Ranking of search results."""

from __future__ import annotations

from shelf.models import Book

# Lower ranks come first.
EXACT_TITLE, TITLE_PREFIX, TITLE_WORD, AUTHOR, TAG = range(5)


def rank(book: Book, query: str) -> int | None:
    """The best way `query` matches `book`, or None when it does not match."""
    q = query.casefold().strip()
    title = book.title.casefold()
    if title == q:
        return EXACT_TITLE
    if title.startswith(q):
        return TITLE_PREFIX
    if q in title.split():
        return TITLE_WORD
    if q in book.author.casefold():
        return AUTHOR
    if q in (t.casefold() for t in book.tags):
        return TAG
    return None


def find(books: list[Book], query: str, limit: int = 20) -> list[Book]:
    """Matches by rank, ties broken by year, newest first (books without a year last)."""
    scored = [(r, book) for book in books if (r := rank(book, query)) is not None]
    scored.sort(key=lambda pair: (pair[0], -(pair[1].year or 0)))
    return [book for _, book in scored[:limit]]
