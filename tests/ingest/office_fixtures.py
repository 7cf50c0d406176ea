"""Small Word, OpenDocument and EPUB files built with zipfile, written as their tools write
them: namespaces declared at the root, runs split mid-word (Word splits a run wherever
its revision id or proofing state changes), styles in their own part, relationships."""

from __future__ import annotations

import io
import zipfile

W_NS = ('xmlns:wpc="http://schemas.microsoft.com/office/word/2010/wordprocessingCanvas" '
        'xmlns:mc="http://schemas.openxmlformats.org/markup-compatibility/2006" '
        'xmlns:o="urn:schemas-microsoft-com:office:office" '
        'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships" '
        'xmlns:m="http://schemas.openxmlformats.org/officeDocument/2006/math" '
        'xmlns:v="urn:schemas-microsoft-com:vml" '
        'xmlns:wp="http://schemas.openxmlformats.org/drawingml/2006/wordprocessingDrawing" '
        'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main" '
        'xmlns:pic="http://schemas.openxmlformats.org/drawingml/2006/picture" '
        'xmlns:w14="http://schemas.microsoft.com/office/word/2010/wordml" '
        'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" '
        'xmlns:wps="http://schemas.microsoft.com/office/word/2010/wordprocessingShape" '
        'mc:Ignorable="w14 wp14"')
_PREAMBLE = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\r\n'
_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"

STYLES = f"""{_PREAMBLE}<w:styles {W_NS}>
<w:docDefaults><w:rPrDefault><w:rPr><w:rFonts w:asciiTheme="minorHAnsi"/><w:sz w:val="22"/></w:rPr></w:rPrDefault></w:docDefaults>
<w:style w:type="paragraph" w:default="1" w:styleId="Normal"><w:name w:val="Normal"/><w:qFormat/></w:style>
<w:style w:type="paragraph" w:styleId="Heading1"><w:name w:val="heading 1"/><w:basedOn w:val="Normal"/><w:next w:val="Normal"/>
  <w:link w:val="Heading1Char"/><w:uiPriority w:val="9"/><w:qFormat/><w:pPr><w:keepNext/><w:spacing w:before="240"/><w:outlineLvl w:val="0"/></w:pPr></w:style>
<w:style w:type="paragraph" w:styleId="Heading2"><w:name w:val="heading 2"/><w:basedOn w:val="Normal"/><w:pPr><w:outlineLvl w:val="1"/></w:pPr></w:style>
<w:style w:type="paragraph" w:styleId="berschrift3"><w:name w:val="heading 3"/><w:basedOn w:val="Normal"/></w:style>
<w:style w:type="paragraph" w:styleId="ClauseHeading"><w:name w:val="Clause Heading"/><w:basedOn w:val="Heading2"/></w:style>
<w:style w:type="paragraph" w:styleId="Title"><w:name w:val="Title"/><w:basedOn w:val="Normal"/></w:style>
<w:style w:type="paragraph" w:styleId="ListBullet"><w:name w:val="List Bullet"/><w:basedOn w:val="Normal"/>
  <w:pPr><w:numPr><w:numId w:val="1"/></w:numPr></w:pPr></w:style>
<w:style w:type="paragraph" w:styleId="ListParagraph"><w:name w:val="List Paragraph"/><w:basedOn w:val="Normal"/><w:pPr><w:ind w:left="720"/></w:pPr></w:style>
<w:style w:type="paragraph" w:styleId="TOC1"><w:name w:val="toc 1"/><w:basedOn w:val="Normal"/></w:style>
<w:style w:type="character" w:styleId="SecretNote"><w:name w:val="Secret Note"/><w:rPr><w:vanish/></w:rPr></w:style>
<w:style w:type="character" w:styleId="FootnoteReference"><w:name w:val="footnote reference"/><w:rPr><w:vertAlign w:val="superscript"/></w:rPr></w:style>
</w:styles>"""


def p(*runs: str, style: str = "", ppr: str = "", rsid: str = "00A1B2C3") -> str:
    """A paragraph of runs (see `r`), with a style and other paragraph properties."""
    props = (f'<w:pStyle w:val="{style}"/>' if style else "") + ppr
    return (f'<w:p w14:paraId="1A2B3C4D" w14:textId="77777777" w:rsidR="{rsid}" w:rsidRDefault="{rsid}">'
            + (f"<w:pPr>{props}</w:pPr>" if props else "") + "".join(runs) + "</w:p>")


def r(text: str = "", rpr: str = "", extra: str = "") -> str:
    """A run: its properties, anything before its text (a break), and its text."""
    t = f'<w:t xml:space="preserve">{text}</w:t>' if text else ""
    return f'<w:r w:rsidRPr="00D4E5F6">' + (f"<w:rPr>{rpr}</w:rPr>" if rpr else "") + extra + t + "</w:r>"


def split_runs(text: str, at: int) -> str:
    """`text` in two runs cut inside a word, with a proofing mark between, as Word saves it."""
    return (r(text[:at], '<w:rFonts w:cs="Arial"/>') + '<w:proofErr w:type="spellStart"/>'
            + r(text[at:], '<w:rFonts w:cs="Arial"/><w:lang w:val="en-GB"/>') + '<w:proofErr w:type="spellEnd"/>')


def table(*rows: list[str]) -> str:
    """A table of rows of cell contents (each a paragraph's XML, or text)."""
    def cell(content: str) -> str:
        body = content if content.startswith("<w:") else p(r(content))
        return f'<w:tc><w:tcPr><w:tcW w:w="3000" w:type="dxa"/></w:tcPr>{body}</w:tc>'

    grid = "".join('<w:gridCol w:w="3000"/>' for _ in rows[0])
    return (f'<w:tbl><w:tblPr><w:tblStyle w:val="TableGrid"/><w:tblW w:w="0" w:type="auto"/></w:tblPr>'
            f"<w:tblGrid>{grid}</w:tblGrid>"
            + "".join(f'<w:tr w:rsidR="00112233">{"".join(cell(c) for c in row)}</w:tr>' for row in rows) + "</w:tbl>")


def notes_part(kind: str, notes: dict[int, str]) -> str:
    """footnotes.xml / endnotes.xml: the two separators Word always writes, then the notes."""
    tag = kind[:-1]
    body = "".join(
        f'<w:{tag} w:id="{nid}"><w:p><w:pPr><w:pStyle w:val="FootnoteText"/></w:pPr>'
        f'<w:r><w:rPr><w:rStyle w:val="FootnoteReference"/></w:rPr><w:{tag}Ref/></w:r>'
        f'<w:r><w:t xml:space="preserve"> {text}</w:t></w:r></w:p></w:{tag}>'
        for nid, text in notes.items())
    return (f"{_PREAMBLE}<w:{kind} {W_NS}>"
            f'<w:{tag} w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r></w:p></w:{tag}>'
            f'<w:{tag} w:type="continuationSeparator" w:id="0"><w:p><w:r><w:continuationSeparator/></w:r></w:p></w:{tag}>'
            f"{body}</w:{kind}>")


def comments_part(comments: dict[int, tuple[str, str]]) -> str:
    body = "".join(f'<w:comment w:id="{cid}" w:author="{author}" w:date="2024-03-01T10:00:00Z" w:initials="X">'
                   f'<w:p><w:r><w:annotationRef/></w:r><w:r><w:t>{text}</w:t></w:r></w:p></w:comment>'
                   for cid, (author, text) in comments.items())
    return f"{_PREAMBLE}<w:comments {W_NS}>{body}</w:comments>"


def level(ilvl: int, text: str, fmt: str = "decimal", *, start: int = 1, extra: str = "") -> str:
    """A numbering level (w:lvl) as Word writes one: start, format, text, indentation."""
    return (f'<w:lvl w:ilvl="{ilvl}" w15:tentative="1"><w:start w:val="{start}"/><w:numFmt w:val="{fmt}"/>{extra}'
            f'<w:lvlText w:val="{text}"/><w:lvlJc w:val="left"/>'
            f'<w:pPr><w:ind w:left="{360 * (ilvl + 1)}" w:hanging="360"/></w:pPr></w:lvl>')


def numbering_part(abstracts: dict[int, str], nums: dict[int, tuple[int, str]]) -> dict[str, str]:
    """make_docx's `parts` and `rels` for word/numbering.xml: abstract definitions (id -> their
    levels' XML), then instances (numId -> (abstractNumId, its overrides' XML))."""
    body = "".join(f'<w:abstractNum w:abstractNumId="{aid}" w15:restartNumberingAfterBreak="0">'
                   f'<w:nsid w:val="1A2B3C{aid:02d}"/><w:multiLevelType w:val="hybridMultilevel"/>{levels}</w:abstractNum>'
                   for aid, levels in abstracts.items())
    body += "".join(f'<w:num w:numId="{nid}"><w:abstractNumId w:val="{aid}"/>{overrides}</w:num>'
                    for nid, (aid, overrides) in nums.items())
    w15 = 'xmlns:w15="http://schemas.microsoft.com/office/word/2012/wordml" '
    return {"word/numbering.xml": f"{_PREAMBLE}<w:numbering {w15}{W_NS}>{body}</w:numbering>"}


NUMBERING_REL = f'<Relationship Id="rId7" Type="{_REL}/numbering" Target="numbering.xml"/>'


def make_docx(body: str, *, footnotes: dict[int, str] | None = None, endnotes: dict[int, str] | None = None,
              comments: dict[int, tuple[str, str]] | None = None, header: str = "", parts: dict[str, str] | None = None,
              rels: str = "", main: str = "word/document.xml", macro: bool = False) -> bytes:
    """A .docx around `body` (the XML inside w:body, before its final w:sectPr)."""
    doc_rels = [f'<Relationship Id="rId1" Type="{_REL}/styles" Target="styles.xml"/>']
    files = {"word/styles.xml": STYLES, **(parts or {})}
    overrides = []
    if footnotes is not None:
        files["word/footnotes.xml"] = notes_part("footnotes", footnotes)
        doc_rels.append(f'<Relationship Id="rId2" Type="{_REL}/footnotes" Target="footnotes.xml"/>')
    if endnotes is not None:
        files["word/endnotes.xml"] = notes_part("endnotes", endnotes)
        doc_rels.append(f'<Relationship Id="rId3" Type="{_REL}/endnotes" Target="endnotes.xml"/>')
    if comments is not None:
        files["word/comments.xml"] = comments_part(comments)
        doc_rels.append(f'<Relationship Id="rId4" Type="{_REL}/comments" Target="comments.xml"/>')
    sect_refs = ""
    if header:
        files["word/header1.xml"] = f"{_PREAMBLE}<w:hdr {W_NS}>{header}</w:hdr>"
        doc_rels.append(f'<Relationship Id="rId5" Type="{_REL}/header" Target="header1.xml"/>')
        sect_refs = '<w:headerReference w:type="default" r:id="rId5"/>'
    doc_rels.append(rels)
    main_type = ("application/vnd.ms-word.document.macroEnabled.main+xml" if macro else
                 "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml")
    overrides.append(f'<Override PartName="/{main}" ContentType="{main_type}"/>')
    document = (f"{_PREAMBLE}<w:document {W_NS}><w:body>{body}"
                f'<w:sectPr w:rsidR="00A1B2C3">{sect_refs}<w:pgSz w:w="11906" w:h="16838"/>'
                f'<w:pgMar w:top="1440" w:right="1440" w:bottom="1440" w:left="1440"/></w:sectPr></w:body></w:document>')
    folder, name = main.rsplit("/", 1)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", f"{_PREAMBLE}<Types xmlns=\"http://schemas.openxmlformats.org/package/2006/content-types\">"
                   '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
                   '<Default Extension="xml" ContentType="application/xml"/>' + "".join(overrides) + "</Types>")
        z.writestr("_rels/.rels", f'{_PREAMBLE}<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                   f'<Relationship Id="rId1" Type="{_REL}/officeDocument" Target="{main}"/>'
                   f'<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/package/2006/relationships/metadata/core-properties" Target="docProps/core.xml"/>'
                   "</Relationships>")
        z.writestr("docProps/core.xml", f'{_PREAMBLE}<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/core-properties" '
                   'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:creator>Ada Quill</dc:creator></cp:coreProperties>')
        z.writestr(main, document)
        z.writestr(f"{folder}/_rels/{name}.rels",
                   f'{_PREAMBLE}<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
                   + "".join(doc_rels) + "</Relationships>")
        for part, xml in files.items():
            z.writestr(part, xml)
    return out.getvalue()


def drawing(descr: str, *, chart: bool = False, name: str = "Picture 1") -> str:
    """An inline picture (or chart) run with its alt text, as Word 365 writes one."""
    if chart:
        graphic = ('<a:graphicData uri="http://schemas.openxmlformats.org/drawingml/2006/chart">'
                   '<c:chart xmlns:c="http://schemas.openxmlformats.org/drawingml/2006/chart" r:id="rId9"/></a:graphicData>')
    else:
        graphic = ('<a:graphicData uri="http://schemas.openxmlformats.org/drawingml/2006/picture"><pic:pic>'
                   f'<pic:nvPicPr><pic:cNvPr id="0" name="{name}"/><pic:cNvPicPr/></pic:nvPicPr>'
                   '<pic:blipFill><a:blip r:embed="rId8"/></pic:blipFill><pic:spPr/></pic:pic></a:graphicData>')
    return ('<w:r><w:drawing><wp:inline distT="0" distB="0" distL="0" distR="0"><wp:extent cx="5731510" cy="3223895"/>'
            f'<wp:docPr id="1" name="{name}" descr="{descr}"/><a:graphic>{graphic}</a:graphic></wp:inline></w:drawing></w:r>')


# ---- OpenDocument ----------------------------------------------------------------------

ODF_NS = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
          'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
          'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
          'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0" '
          'xmlns:draw="urn:oasis:names:tc:opendocument:xmlns:drawing:1.0" '
          'xmlns:fo="urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0" '
          'xmlns:xlink="http://www.w3.org/1999/xlink" xmlns:dc="http://purl.org/dc/elements/1.1/" '
          'xmlns:meta="urn:oasis:names:tc:opendocument:xmlns:meta:1.0" '
          'xmlns:svg="urn:oasis:names:tc:opendocument:xmlns:svg-compatible:1.0" office:version="1.3"')


def make_odt(body: str, *, automatic_styles: str = "", master: str = "", mimetype: bool = True) -> bytes:
    """An .odt as LibreOffice writes one: an uncompressed mimetype first, content, styles."""
    content = (f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-content {ODF_NS}>'
               f"<office:automatic-styles>{automatic_styles}</office:automatic-styles>"
               f"<office:body><office:text><text:sequence-decls><text:sequence-decl text:display-outline-level=\"0\" "
               f'text:name="Illustration"/></text:sequence-decls>{body}</office:text></office:body></office:document-content>')
    styles = (f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-styles {ODF_NS}><office:styles>'
              '<style:style style:name="Standard" style:family="paragraph" style:class="text"/>'
              '<style:style style:name="Heading" style:family="paragraph" style:parent-style-name="Standard"/>'
              '<style:style style:name="Title" style:family="paragraph" style:parent-style-name="Heading"/>'
              '<style:style style:name="Hidden_20_Words" style:display-name="Hidden Words" style:family="text">'
              '<style:text-properties text:display="none"/></style:style>'
              f"</office:styles><office:master-styles>{master}</office:master-styles></office:document-styles>")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        if mimetype:
            z.writestr(zipfile.ZipInfo("mimetype"), "application/vnd.oasis.opendocument.text", zipfile.ZIP_STORED)
        z.writestr("content.xml", content)
        z.writestr("styles.xml", styles)
        z.writestr("meta.xml", f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-meta {ODF_NS}/>')
        z.writestr("META-INF/manifest.xml",
                   '<?xml version="1.0" encoding="UTF-8"?>\n<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" manifest:version="1.3">'
                   '<manifest:file-entry manifest:full-path="/" manifest:media-type="application/vnd.oasis.opendocument.text"/>'
                   '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
                   "</manifest:manifest>")
    return out.getvalue()


# ---- EPUB ------------------------------------------------------------------------------

def xhtml(title: str, body: str) -> str:
    return ('<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n'
            '<html xmlns="http://www.w3.org/1999/xhtml" xmlns:epub="http://www.idpf.org/2007/ops" lang="en">\n'
            f'<head>\n<title>{title}</title>\n<link rel="stylesheet" type="text/css" href="../Styles/book.css"/>\n</head>\n'
            f"<body>\n{body}\n</body>\n</html>\n")


def make_epub(chapters: list[tuple[str, str]], *, toc: list[tuple[int, str, str]] | None = None, nav_in_spine: bool = True,
              ncx: bool = False, encrypted: bool = False, title: str = "The Lighthouse Keeper",
              author: str = "Ada Quill", extra: dict[str, bytes] | None = None) -> bytes:
    """An EPUB 3 of `chapters` (file name under OEBPS/Text/, XHTML) in spine order, its
    navigation document listing `toc` (depth, file name, title) — or an EPUB 2 NCX."""
    toc = toc if toc is not None else [(1, name, name) for name, _ in chapters]
    items = "".join(f'<item id="c{i}" href="Text/{name}" media-type="application/xhtml+xml"/>'
                    for i, (name, _) in enumerate(chapters))
    spine = "".join(f'<itemref idref="c{i}"/>' for i in range(len(chapters)))
    if not ncx:
        items += '<item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>'
        if nav_in_spine:
            spine = '<itemref idref="nav" linear="yes"/>' + spine
    else:
        items += '<item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>'
    toc_attribute = ' toc="ncx"' if ncx else ""
    opf = ('<?xml version="1.0" encoding="UTF-8"?>\n<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="uid">'
           '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
           f'<dc:identifier id="uid">urn:uuid:1234</dc:identifier><dc:title>{title}</dc:title>'
           f"<dc:creator>{author}</dc:creator><dc:language>en</dc:language></metadata>"
           f"<manifest>{items}</manifest><spine{toc_attribute}>{spine}</spine></package>")

    def nested(entries, as_ncx: bool) -> str:
        out, depth = "", 0
        for level, name, label in entries:
            if as_ncx:
                while depth >= level:
                    out += "</navPoint>"
                    depth -= 1
                out += f'<navPoint id="n{len(out)}"><navLabel><text>{label}</text></navLabel><content src="Text/{name}"/>'
                depth = level
            else:
                if level > depth:
                    out += "<ol>" * (level - depth)
                else:
                    out += "</li>" + "</ol></li>" * (depth - level)
                out += f'<li><a href="Text/{name}">{label}</a>'
                depth = level
        if as_ncx:
            return out + "</navPoint>" * depth
        return out + "</li>" + "</ol></li>" * (depth - 1) + "</ol>"

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip", zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml",
                   '<?xml version="1.0"?>\n<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
                   '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles></container>')
        z.writestr("OEBPS/content.opf", opf)
        if ncx:
            z.writestr("OEBPS/toc.ncx", '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE ncx PUBLIC "-//NISO//DTD ncx 2005-1//EN" '
                       '"http://www.daisy.org/z3986/2005/ncx-2005-1.dtd">\n<ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1">'
                       f"<head/><docTitle><text>{title}</text></docTitle><navMap>{nested(toc, True)}</navMap></ncx>")
        else:
            z.writestr("OEBPS/nav.xhtml", xhtml("Contents", f'<nav epub:type="toc" id="toc"><h1>Contents</h1>{nested(toc, False)}</nav>'))
        for name, body in chapters:
            z.writestr(f"OEBPS/Text/{name}", body)
        if encrypted:
            z.writestr("META-INF/encryption.xml",
                       '<?xml version="1.0"?>\n<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
                       'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
                       '<enc:EncryptionMethod Algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc"/>'
                       f'<enc:CipherData><enc:CipherReference URI="OEBPS/Text/{chapters[0][0]}"/></enc:CipherData>'
                       "</enc:EncryptedData></encryption>")
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return out.getvalue()
