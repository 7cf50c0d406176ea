from shelf.models import Book
from shelf.search import AUTHOR, EXACT_TITLE, TITLE_PREFIX, find, rank


def test_exact_title_beats_prefix() -> None:
    exact = Book(1, "Dune", "Frank Herbert", 1965)
    prefix = Book(2, "Dune Messiah", "Frank Herbert", 1969)
    assert rank(exact, "dune") == EXACT_TITLE
    assert rank(prefix, "dune") == TITLE_PREFIX
    assert find([prefix, exact], "dune") == [exact, prefix]


def test_author_match() -> None:
    assert rank(Book(3, "Kindred", "Octavia E. Butler", 1979), "butler") == AUTHOR
