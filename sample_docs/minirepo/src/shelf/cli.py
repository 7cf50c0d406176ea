"""The argparse front end: parse, call one function, print."""

from __future__ import annotations

import argparse
import sys

from shelf import storage
from shelf.models import Book, InvalidBook
from shelf.search import find


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shelf", description="A catalogue for a home library")
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="add a book")
    add.add_argument("title")
    add.add_argument("--author", required=True)
    add.add_argument("--year", type=int)
    add.add_argument("--tag", action="append", default=[])
    search = commands.add_parser("find", help="search by title, author or tag")
    search.add_argument("query")
    listing = commands.add_parser("list", help="list books")
    listing.add_argument("--tag")
    lend = commands.add_parser("lend", help="lend a book to someone")
    lend.add_argument("id", type=int)
    lend.add_argument("--to", required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    books = storage.load()
    try:
        if args.command == "add":
            book = Book(storage.next_id(books), args.title, args.author, args.year, args.tag)
            book.validate()
            books.append(book)
            storage.save(books)
            print(f"added #{book.id}")
        elif args.command == "find":
            for book in find(books, args.query):
                print(f"#{book.id} {book.title} ({book.author}, {book.year or 'n.d.'})")
        elif args.command == "list":
            for book in books:
                if args.tag is None or args.tag in book.tags:
                    print(f"#{book.id} {book.title}")
        elif args.command == "lend":
            book = next((b for b in books if b.id == args.id), None)
            if book is None:
                print(f"no book #{args.id}", file=sys.stderr)
                return 1
            book.lend(args.to)
            storage.save(books)
    except InvalidBook as e:
        print(f"shelf: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
