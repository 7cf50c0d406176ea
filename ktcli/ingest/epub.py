"""An EPUB book as the text of its chapters in reading order (the spine of its package),
each chapter's XHTML read by `ingest.htmltext` as a web page is, and cited as a chapter.

An EPUB has no pages: a reader reflows it to the screen, and a line of the text ktcli
joins from its chapters is nowhere a reader can go. Its table of contents is what a reader
navigates by, so each chapter is a page-like unit (`Page`, cited `book.epub ch.3`, the
third chapter in reading order) and its title in the table of contents heads its section
trail (`(Part One > Loomings)`), as a PDF's bookmarks head its pages'. A file of the spine
the table of contents does not list (a chapter split in two files by a converter) reads
as part of the chapter before it (one before any it lists, a title page, as part of the
first it lists); a book without one has a chapter per file.

The navigation document and the NCX are the table of contents, not content: not read as
chapters.
"""

from __future__ import annotations

import re
from xml.etree import ElementTree as ET

from ktcli.ingest.errors import RejectedInput
from ktcli.ingest.normalize import UndecodableError, decode_bytes
from ktcli.ingest.zipdoc import DamagedDocument, ZipDocument, ZippedText, resolve
from ktcli.types import CHAPTER

OPF = "{http://www.idpf.org/2007/opf}"
CONTAINER = "{urn:oasis:names:tc:opendocument:xmlns:container}"
NCX = "{http://www.daisy.org/z3986/2005/ncx/}"
XHTML = "{http://www.w3.org/1999/xhtml}"
OPS = "{http://www.idpf.org/2007/ops}"
DC = "{http://purl.org/dc/elements/1.1/}"
ENC = "{http://www.w3.org/2001/04/xmlenc#}"
# Chapters ktcli reads: (X)HTML, and SVG pages, whose <text> the HTML reader takes.
_READ_TYPES = frozenset({"application/xhtml+xml", "text/html", "application/xml", "text/xml", "image/svg+xml"})
# Font obfuscation (IDPF, Adobe): fonts mangled so they cannot be reused; the text is not encrypted.
_OBFUSCATION = frozenset({"http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC"})
_HEADING = re.compile(r"(#{1,6}) (.*)")
_IMAGE = re.compile(rb"<(?:[\w-]+:)?(?:img|image)\b", re.IGNORECASE)
_DEEPEST = 6


def epub_text(z: ZipDocument) -> ZippedText:
    package = _package_path(z)
    opf = z.xml(package)
    manifest: dict[str, tuple[str, str, str]] = {}  # id -> (member, media type, properties)
    for item in opf.iter(f"{OPF}item"):
        if item.get("id") and item.get("href"):
            manifest[item.get("id", "")] = (resolve(package, item.get("href", "")), item.get("media-type", ""),
                                            item.get("properties", ""))
    spine = opf.find(f"{OPF}spine")
    if spine is None:
        raise DamagedDocument(f"{package} has no spine (no reading order)")
    navigation = {member for member, _, props in manifest.values() if "nav" in props.split()}
    ncx = manifest.get(spine.get("toc", ""), ("", "", ""))[0] or next(
        (m for m, typ, _ in manifest.values() if typ == "application/x-dtbncx+xml"), "")
    navigation.add(ncx)
    toc = _table_of_contents(z, navigation, ncx)
    _refuse_drm(z, {manifest[r.get("idref", "")][0] for r in spine.iter(f"{OPF}itemref") if r.get("idref") in manifest})

    chapters: list[list[str]] = []
    front: list[str] = []  # lines before the first chapter the table of contents lists
    shift = 0  # levels the headings of the chapter before were moved by
    images = unread = 0
    for ref in spine.iter(f"{OPF}itemref"):
        member, media_type, _ = manifest.get(ref.get("idref", ""), ("", "", ""))
        if not member or member in navigation:
            continue
        if media_type not in _READ_TYPES or not z.has(member):
            unread += 1
            continue
        data = z.read(member)
        images += len(_IMAGE.findall(data))
        lines = _chapter_lines(data, member)
        entry = toc.get(member)
        if entry is not None:
            lines, shift = _under_entry(lines, *entry)
        elif shift:
            lines = [_shifted(line, shift) for line in lines]
        if not any(line.strip() for line in lines):
            continue  # a cover or a page of pictures: counted in `images`
        if entry is None and toc:
            if chapters:
                chapters[-1].extend(["", *lines])  # the rest of the chapter before, in a file of its own
            else:
                # A title page or cover with words, which the table of contents does not
                # list: read with the first chapter it does list. As a chapter of its own
                # it put every chapter one number later ("ch.3" for "Chapter 2").
                front.extend([*lines, ""])
            continue
        chapters.append(front + lines)
        front = []
    if front:  # a table of contents that lists none of the files
        chapters.append(front[:-1])
    if chapters:
        chapters[0][:0] = _metadata_lines(opf)
    left_out = []
    if images:
        left_out.append(f"{images:,} image{'s' if images > 1 else ''} not read (alt text kept where given)")
    if unread:
        left_out.append(f"{unread:,} file{'s' if unread > 1 else ''} of its reading order not read (not XHTML, or missing)")
    return ZippedText(["\n".join(lines) for lines in chapters], paged=True, unit=CHAPTER, left_out=left_out,
                      images=images)


def _package_path(z: ZipDocument) -> str:
    container = z.xml("META-INF/container.xml", required=False)
    for rootfile in container.iter(f"{CONTAINER}rootfile") if container is not None else ():
        path = rootfile.get("full-path", "")
        if path and rootfile.get("media-type", "application/oebps-package+xml") == "application/oebps-package+xml":
            return path
    found = [name for name in z.names() if name.lower().endswith(".opf")]
    if len(found) == 1:
        return found[0]
    raise DamagedDocument("no package document (META-INF/container.xml names none)")


def _refuse_drm(z: ZipDocument, chapters: set[str]) -> None:
    """A book whose chapters are encrypted (Adobe, Apple, Kobo DRM) cannot be read, and a
    page of ciphertext read as text would be nonsense: refused, saying why."""
    root = z.xml("META-INF/encryption.xml", required=False)
    for data in root.iter(f"{ENC}EncryptedData") if root is not None else ():
        method = data.find(f"{ENC}EncryptionMethod")
        if method is not None and method.get("Algorithm") in _OBFUSCATION:
            continue
        reference = data.find(f"{ENC}CipherData/{ENC}CipherReference")
        if reference is not None and resolve("", reference.get("URI", "")) in chapters:
            raise RejectedInput(z.display, "EPUB with DRM: its chapters are encrypted",
                                "ktcli reads DRM-free books only; use a DRM-free copy or export its text")


# A table of contents' entry for a file: (depth, title, the titles above it that no file
# of their own heads: (depth, title) of a part named without a link, or of one whose link
# is its first chapter's).
_Entry = tuple[int, str, tuple[tuple[int, str], ...]]


def _table_of_contents(z: ZipDocument, navigation: set[str], ncx: str) -> dict[str, _Entry]:
    """member -> its entry (`_Entry`), of the first entry that points into it: EPUB 3's
    navigation document, else EPUB 2's NCX. A table of contents that does not parse is
    done without (the chapters are still read)."""
    for member in sorted(navigation - {ncx, ""}) + ([ncx] if ncx else []):
        try:
            root = z.xml(member, required=False)
        except DamagedDocument:
            continue
        if root is None:
            continue
        flat: list[tuple[int, str | None, str]] = []  # (depth, href or None, title) in order
        if member == ncx:
            nav_map = root.find(f"{NCX}navMap")
            if nav_map is not None:
                _ncx_points(nav_map, 1, flat)
        else:
            navs = [n for n in root.iter(f"{XHTML}nav")]
            toc = next((n for n in navs if "toc" in n.get(f"{OPS}type", "").split()), navs[0] if navs else None)
            lists = toc.find(f"{XHTML}ol") if toc is not None else None
            if lists is not None:
                _nav_items(lists, 1, flat)
        entries = _entries(flat, member)
        if entries:
            return entries
    return {}


def _entries(flat: list[tuple[int, str | None, str]], base: str) -> dict[str, _Entry]:
    """The table of contents' entries in order as each file's `_Entry`. A part's title
    heads the file of its first chapter where the part has no file of its own: named
    without a link (`<li><span>Part Two</span><ol>...`), or linked to the very place its
    first chapter is (an NCX written by ebooklib). Else its chapters took the trail of
    the chapter before them (`Loomings > The Carpet-Bag`, a chapter of Part Two under one
    of Part One)."""
    entries: dict[str, _Entry] = {}
    heads: list[tuple[int, str]] = []  # parts whose title no file has headed yet
    previous: tuple[int, str] | None = None  # (depth, href) of the entry that made the last one
    for depth, href, title in flat:
        heads = [head for head in heads if head[0] < depth]  # a part's title goes to its own chapters only
        if href is None:
            heads.append((depth, title))
            previous = None
            continue
        target = resolve(base, href)
        if target not in entries:
            entries[target] = (depth, title, tuple(heads))
            heads, previous = [], (depth, href)
        elif previous is not None and previous[1] == href and previous[0] < depth:
            part_depth, part_title, above = entries[target]
            entries[target] = (depth, title, (*above, (part_depth, part_title)))
            previous = (depth, href)
        else:
            previous = None
    return entries


def _nav_items(ol: ET.Element, depth: int, flat: list[tuple[int, str | None, str]]) -> None:
    for li in ol.findall(f"{XHTML}li"):
        link = li.find(f"{XHTML}a")
        label = link if link is not None else li.find(f"{XHTML}span")
        title = " ".join("".join(label.itertext()).split()) if label is not None else ""
        if link is not None and link.get("href"):
            flat.append((depth, link.get("href", ""), title))
        elif title:
            flat.append((depth, None, title))
        inner = li.find(f"{XHTML}ol")
        if inner is not None:
            _nav_items(inner, depth + 1, flat)


def _ncx_points(parent: ET.Element, depth: int, flat: list[tuple[int, str | None, str]]) -> None:
    for point in parent.findall(f"{NCX}navPoint"):
        content = point.find(f"{NCX}content")
        label = point.find(f"{NCX}navLabel/{NCX}text")
        if content is not None and content.get("src"):
            title = " ".join((label.text or "").split()) if label is not None else ""
            flat.append((depth, content.get("src", ""), title))
        _ncx_points(point, depth + 1, flat)


def _chapter_lines(data: bytes, member: str) -> list[str]:
    from ktcli.ingest.htmltext import html_to_text

    try:
        markup, _ = decode_bytes(data)
    except UndecodableError as e:
        raise DamagedDocument(f"{member} cannot be decoded ({e})") from None
    text, _ = html_to_text(markup, title=False)
    return text.split("\n") if text.strip() else []


def _under_entry(lines: list[str], depth: int, title: str, parts: tuple[tuple[int, str], ...] = ()) -> tuple[list[str], int]:
    """A chapter's lines with its headings moved to sit under its place in the table of
    contents (a chapter of Part One whose title is an <h1> becomes "## Title"), and its
    title as its first heading where it opens with none: a chapter with no heading of its
    own took the trail of the chapter before. `parts`: the titles above it that no file
    heads (`_entries`), put first; one the chapter opens with itself is not said twice.
    Second: the levels moved by."""
    first = next((line for line in lines if line.strip()), "")
    opening = _HEADING.fullmatch(first)
    if parts and opening and opening.group(2).strip().casefold() == parts[-1][1].casefold():
        (depth, title), parts = parts[-1], parts[:-1]  # the part's file is this one: headed by its own words
    depth = min(depth, _DEEPEST)
    levels = [len(m.group(1)) for line in lines if (m := _HEADING.fullmatch(line))]
    titled = bool(title and lines and not opening)
    # its own headings at its depth, or a level below the title put above them
    shift = (depth + titled - min(levels)) if levels else 0
    lines = [_shifted(line, shift) for line in lines] if shift else lines
    if titled:
        lines = [f"{'#' * depth} {title}", "", *lines]
    above = [line for part_depth, part_title in parts for line in (f"{'#' * min(part_depth, _DEEPEST)} {part_title}", "")]
    return above + lines, shift


def _shifted(line: str, shift: int) -> str:
    m = _HEADING.fullmatch(line)
    if m is None:
        return line
    return f"{'#' * max(1, min(len(m.group(1)) + shift, _DEEPEST))} {m.group(2)}"


def _metadata_lines(opf: ET.Element) -> list[str]:
    """The book's title and authors, which its chapters may never say."""
    metadata = opf.find(f"{OPF}metadata")
    if metadata is None:
        return []
    title = next((" ".join((t.text or "").split()) for t in metadata.iter(f"{DC}title") if (t.text or "").strip()), "")
    authors = [" ".join((c.text or "").split()) for c in metadata.iter(f"{DC}creator") if (c.text or "").strip()]
    lines = ([f"Title: {title}"] if title else []) + ([f"By: {', '.join(authors)}"] if authors else [])
    return [*lines, ""] if lines else []

