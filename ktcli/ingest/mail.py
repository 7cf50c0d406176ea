"""An e-mail (.eml, RFC 5322 with MIME) as the text a mail program shows: its headers
(From, To, Cc, Date, Subject), its body decoded, forwarded messages and text attachments
after it, each under a heading of its own.

Read as plain text, a message's quoted-printable body broke numbers at its soft line breaks
("EUR 410,=" / "000"), and its base64 parts (an HTML copy of the body, a PDF attached) were
most of its tokens: 7 of 8 passages retrieved from one such message were base64. Where a
message has both a plain and an HTML body (multipart/alternative), the plain one is read;
HTML alone is read as a web page. Attachments that are not text are said, not read.
"""

from __future__ import annotations

import email
import email.policy
import re
from email.message import EmailMessage

from ktcli.ingest.layout import escaped_hash

_SHOWN_HEADERS = ("From", "To", "Cc", "Date")
MAX_DEPTH = 8  # messages forwarded inside messages: deeper is a broken or hostile file


class MailError(ValueError):
    """Not a message that can be read."""


# Headers only a message sent through a mail system has: text copied out of a mail program
# ("From: / Sent: / To: / Subject:") is read as the text it is.
_MIME_EVIDENCE = {b"mime-version", b"content-type", b"message-id", b"received"}


def looks_like_mail(data: bytes) -> bool:
    """A header block of a message, as stdin holds one piped in: "From:" with "Subject:" or
    "Date:", and a header of the mail system's, before the first blank line. Not an mbox
    (its messages open with "From " lines: one message would hide the rest) nor `git
    format-patch` output (which opens the same way): those are read as text."""
    if data.startswith(b"From "):
        return False
    head = data[:8192].replace(b"\r\n", b"\n").split(b"\n\n", 1)[0].lower().split(b"\n")
    names = {line.split(b":", 1)[0] for line in head if b":" in line and not line[:1].isspace()}
    return (len(head) >= 2 and b"from" in names and bool({b"subject", b"date"} & names) and bool(_MIME_EVIDENCE & names)
            and all(b":" in line or line[:1].isspace() for line in head if line.strip()))


def holds_several(data: bytes) -> bool:
    """An mbox: messages each opened by a "From " line after a blank one."""
    return bool(_MBOX_SEPARATOR.search(data))


_MBOX_SEPARATOR = re.compile(rb"\n\r?\nFrom \S+ +\S")
_FROM_LINE = re.compile(rb"(?:\A|\n\r?\n)From \S+ +\S[^\n]*\n")
_ESCAPED_FROM = re.compile(rb"^>(>*From )", re.MULTILINE)


def mbox_messages(data: bytes) -> list[bytes]:
    """The messages of an mbox, each without its "From " line, a body's escaped ">From "
    lines as the sender wrote them (mboxrd: one ">" less)."""
    return [_ESCAPED_FROM.sub(rb"\1", part) for part in _FROM_LINE.split(data) if part.strip()]


def mail_text(data: bytes, html_to_text) -> tuple[str, list[str]]:
    """(text, what was left out, in words); `html_to_text(markup) -> text` reads an HTML
    body. Raises MailError."""
    lines: list[str] = []
    left_out: list[str] = []
    try:
        message = email.message_from_bytes(data, policy=email.policy.default)
        _message(message, lines, left_out, html_to_text, level=1, depth=0)
    except RecursionError:  # parts nested thousands deep: a broken or hostile file
        raise MailError("e-mail nested too deep to read") from None
    except (LookupError, ValueError, TypeError, AttributeError, UnicodeError) as e:
        raise MailError(f"unreadable e-mail ({type(e).__name__})") from None
    return "\n".join(lines).strip("\n") + "\n", left_out


def _message(message: EmailMessage, lines: list[str], left_out: list[str], html_to_text, level: int, depth: int) -> None:
    if depth > MAX_DEPTH:
        left_out.append("messages forwarded more than 8 deep")
        return
    # The subject heads the message, named as the other headers are: as a bare heading, a
    # question about "the subject" of a mail found no line that said so.
    subject = _header(message, "Subject")
    lines.append(f"{'#' * level} Subject: {subject or '(none)'}")
    for name in _SHOWN_HEADERS:
        value = _header(message, name)
        if value:
            lines.append(f"{name}: {value}")
    lines.append("")
    body = _body(message)
    if body is not None:
        lines.append(_part_text(body, html_to_text).strip("\n"))
        lines.append("")
    pictures = 0
    for part in _attachments(message, body):
        name = part.get_filename() or part.get_content_type()
        if part.get_content_maintype() == "image" and part.get_content_disposition() != "attachment":
            pictures += 1  # shown in the body (a logo, a screenshot): said together
            continue
        if part.get_content_type() == "message/rfc822":
            inner = part.get_payload()
            inner = inner[0] if isinstance(inner, list) and inner else inner
            if isinstance(inner, EmailMessage):
                _message(inner, lines, left_out, html_to_text, min(level + 1, 6), depth + 1)
                continue
        if part.get_content_maintype() == "text":
            lines.append(f"{'#' * min(level + 1, 6)} Attachment: {name}")
            lines.append("")
            lines.append(_part_text(part, html_to_text).strip("\n"))
            lines.append("")
        else:
            left_out.append(f"attachment {name} ({part.get_content_type()}) not read: save it and name it to read it")
    if pictures:
        left_out.append(f"{pictures} picture{'s' if pictures > 1 else ''} shown in the message not read")


def _header(message: EmailMessage, name: str) -> str:
    try:
        value = message.get(name)
    except (ValueError, TypeError, AttributeError):  # a header the parser cannot decode
        value = message.get_all(name, [""])[0] if hasattr(message, "get_all") else ""
    return " ".join(str(value or "").split())


def _body(message: EmailMessage):
    """The part a mail program shows as the message: plain text before HTML."""
    try:
        return message.get_body(preferencelist=("plain", "html"))
    except (KeyError, TypeError, AttributeError):
        return None


def _attachments(message: EmailMessage, body) -> list:
    """The message's other leaf parts (and forwarded messages), in order; the body's
    alternatives are not among them."""
    out = []
    if not message.is_multipart():
        return out
    alternatives = set()
    for part in message.walk():
        if part.get_content_type() == "multipart/alternative" and body is not None and any(p is body for p in part.iter_parts()):
            alternatives |= {id(p) for p in part.iter_parts()}
    for part in message.iter_parts() if message.get_content_type() != "multipart/alternative" else []:
        out.extend(_leaves(part, body, alternatives))
    return out


def _leaves(part, body, alternatives: set[int]) -> list:
    if part is body or id(part) in alternatives:
        return []
    if part.get_content_type() == "message/rfc822":
        return [part]
    if part.is_multipart():
        return [leaf for inner in part.iter_parts() for leaf in _leaves(inner, body, alternatives)]
    return [part]


def _part_text(part, html_to_text) -> str:
    """A text part decoded: by its charset where it names one Python knows, else as any
    file is (a part with no charset is ASCII by the standard, and its 8-bit letters, "Größe"
    or Chinese, became U+FFFD)."""
    raw = part.get_payload(decode=True) or b""
    charset = part.get_content_charset()
    text = None
    if charset and (charset.lower() not in ("us-ascii", "ascii") or raw.isascii()):
        try:
            text = raw.decode(charset)
        except (LookupError, UnicodeError):
            text = None
    if text is None:
        from ktcli.ingest.normalize import UndecodableError, decode_bytes

        try:
            text = decode_bytes(raw)[0] if raw else ""
        except UndecodableError:
            text = raw.decode("utf-8", "replace")
    if part.get_content_subtype() == "html":
        return html_to_text(text)  # (its reader escapes a paragraph's leading "# " itself)
    # A body line that starts "# " is no heading of ours (a script quoted, "# of units"):
    # escaped, as the Word and HTML readers do.
    return "\n".join(escaped_hash(line) for line in text.replace("\r\n", "\n").split("\n"))
