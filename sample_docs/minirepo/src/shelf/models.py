"""The Book record and the rules a valid book follows."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

MAX_TITLE_LENGTH = 200
FIRST_PRINTED_YEAR = 1450  # movable type in Europe; nothing on a home shelf is older


class InvalidBook(ValueError):
    """A book that breaks one of the rules below; the message says which."""


@dataclass
class Book:
    id: int
    title: str
    author: str
    year: int | None = None
    tags: list[str] = field(default_factory=list)
    lent_to: str | None = None

    def validate(self) -> None:
        if not self.title.strip():
            raise InvalidBook("a book needs a title")
        if len(self.title) > MAX_TITLE_LENGTH:
            raise InvalidBook(f"titles are at most {MAX_TITLE_LENGTH} characters")
        this_year = datetime.date.today().year
        if self.year is not None and not FIRST_PRINTED_YEAR <= self.year <= this_year:
            raise InvalidBook(f"year must lie between {FIRST_PRINTED_YEAR} and {this_year}")

    def lend(self, borrower: str) -> None:
        if self.lent_to is not None:
            raise InvalidBook(f"book {self.id} is already lent to {self.lent_to}")
        self.lent_to = borrower

    def give_back(self) -> None:
        self.lent_to = None
