"""Why one input cannot be used: a short reason for the skipped list, a full line for the user."""

from __future__ import annotations

from ktcli.errors import InputError


class RejectedInput(InputError):
    """A file we cannot use. Given explicitly it reaches the user as an InputError whose
    message is the one line shown (reason plus what to do); met in a folder walk it
    becomes Skipped(path, reason)."""

    def __init__(self, display: str, reason: str, hint: str = "") -> None:
        self.display = display
        self.reason = reason
        self.hint = hint
        message = f"{display}: {reason}"
        super().__init__(f"{message}; {hint}" if hint else message)

    @property
    def reason_and_hint(self) -> str:
        """The reason with what to do, as a skipped list names an archive: "binary: a tar
        archive (unpack it ...)"."""
        return f"{self.reason} ({self.hint})" if self.hint else self.reason


class TextOverLimit(Exception):
    """A PDF's text passed the caller's `text_limit` characters by page `page` of `pages`
    (a folder walk's limit: reading on to its end only to skip it took seconds a file)."""

    def __init__(self, page: int, pages: int, chars: int) -> None:
        super().__init__(f"page {page} of {pages}")
        self.page, self.pages, self.chars = page, pages, chars
