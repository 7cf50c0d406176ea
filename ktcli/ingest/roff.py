"""A man page's roff source (`ls.1`, `/usr/share/man/man1/ls.1.gz`) as `man` shows it: read
raw, `.TH`, `.SH NAME`, `\\fB-a\\fR` and `\\-` reached the model and its citations.

No groff here (it may be absent, and a page is a program): a small reader of what man pages
use. The man(7) macros (`.SH` and `.SS` as `##` and `###` headings, the page's title as
`#`, paragraphs, tagged paragraphs indented, `.TS` tables as ` | ` rows), the common mdoc(7)
ones (BSD pages: `.Sh`, `.Fl`, `.Ar`, `.Op`, `.Xr`...), strings (`.ds`), conditions as nroff
takes them (`.ie n`, `.if \\n(.g`), escapes (fonts and sizes dropped, `\\-` as "-",
`\\(em` as a dash); comments, macro definitions and other requests left out. Each line of
the text keeps the source line it came from, so a citation still names the file's line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePath

# A page's name: section 1-9 and a suffix ("ls.1", "openssl.1ssl", "File::Spec.3perl"), or .man
_MAN_NAME = re.compile(r"\.(?:[1-9][a-z0-9+_]{0,6}|man|mdoc)$", re.IGNORECASE)


def has_man_page_name(name: str) -> bool:
    """`ls.1`, `ls.1.gz`, `openssl.1ssl.xz`, `x.man`: a man page's file name, compressed or not."""
    return bool(_MAN_NAME.search(re.sub(r"\.(?:gz|bz2|xz|zst|lzma|Z)$", "", PurePath(name).name)))


_REQUEST = re.compile(r"^[.'][ \t]*([A-Za-z][A-Za-z0-9]{0,3}|\\\")")
_COMMENT = re.compile(r"^[.'][ \t]*\\[\"#]|^\.\s*$|^'''")
_TITLE = re.compile(r"^[.'][ \t]*(?:(?:TH|Dd|Dt)\b|so[ \t]+\S)")


def looks_like_roff(text: str, name: str = "") -> bool:
    """A man page's source: its first line that is no comment a request, and a title (`.TH`,
    mdoc's `.Dd`/`.Dt`) near the start, or `.SH` and a man page's name (`ls.1`), or a page
    that is a link to another (`.so man1/other.1`)."""
    head = text[:20_000].split("\n", 300)[:300]
    lines = [line for line in head if line.strip() and not _COMMENT.match(line)]
    if not lines:
        return False
    if _REQUEST.match(lines[0]) and any(_TITLE.match(line) for line in lines[:60]):
        return True
    # by its name, where requests are a share of its lines and one makes it a page (a64l.3
    # opens with a stray "\t" line)
    return (bool(_MAN_NAME.search(PurePath(name).name)) and sum(bool(_REQUEST.match(line)) for line in lines) >= 3
            and any(re.match(r"^[.']\s*(?:TH|S[Hh]|Dt)\b", line) for line in lines))


# Special characters (`\(em`, `\[bu]`) as plain text; those not named here are left out.
_CHARS = {
    "em": "—", "en": "–", "hy": "-", "mi": "-", "-": "-", "bu": "•", "lq": '"', "rq": '"', "oq": "'", "cq": "'",
    "aq": "'", "dq": '"', "ga": "`", "aa": "'", "ti": "~", "ha": "^", "rs": "\\", "sl": "/", "ba": "|", "br": "|",
    "co": "©", "rg": "®", "tm": "™", "de": "°", "mu": "×", "di": "÷", "+-": "±", "<=": "<=", ">=": ">=", "!=": "!=",
    "==": "==", "->": "->", "<-": "<-", "ua": "↑", "da": "↓", "rA": "=>", "lA": "<=", "Fo": "«", "Fc": "»",
    "fo": "‹", "fc": "›", "bv": "|", "at": "@", "sh": "#", "Do": "$", "Eu": "€", "Po": "£", "ct": "¢", "ps": "¶",
    "sc": "§", "dg": "†", "dd": "‡", "lh": "☜", "rh": "☞", "sq": "□", "ci": "○", "OK": "✓", "ss": "ß", "ae": "æ",
    "AE": "Æ", "o/": "ø", "O/": "Ø", ":a": "ä", ":o": "ö", ":u": "ü", ":A": "Ä", ":O": "Ö", ":U": "Ü", "'e": "é",
    "`e": "è", "'a": "á", "`a": "à", "^e": "ê", ",c": "ç", "~n": "ñ", "12": "½", "14": "¼", "34": "¾",
    "*a": "α", "*b": "β", "*g": "γ", "*d": "δ", "*e": "ε", "*l": "λ", "*m": "μ", "*p": "π", "*s": "σ", "*W": "Ω",
    "if": "∞", "pl": "+", "eq": "=", "lB": "[", "rB": "]", "lC": "{", "rC": "}", "la": "<", "ra": ">", "st": "∗",
    "lb": "", "rb": "", "lt": "", "rt": "", "lk": "", "rk": "", "bracketleft": "[", "bracketright": "]",
    # (C's comments in X11's and others' structs, `/\(** ... \(**/`, read "/ saver window */")
    "**": "*", "ul": "_", "mc": "µ", "or": "|", "tmu": "×", "shc": "", "fm": "′", "sd": "″", "S1": "¹", "S2": "²",
    "S3": "³", "^a": "â", "^o": "ô", "oa": "å", ":i": "ï", "ts": "ς", "*i": "ι", "*t": "τ", "*h": "θ", "*r": "ρ",
    "*n": "ν", "*f": "φ", "*x": "χ", "*y": "η", "*z": "ζ", "*k": "κ", "*w": "ω", "*u": "υ", "*q": "ψ", "*c": "ξ",
    "*D": "Δ", "*G": "Γ", "*L": "Λ", "*P": "Π", "*S": "Σ", "*F": "Φ", "*Q": "Ψ", "*H": "Θ",
}
# Predefined strings (`\*R`, `\*(Tm`); a page's own `.ds` add to them.
_STRINGS = {"R": "®", "Tm": "™", "lq": '"', "rq": '"', "S": "", "HF": ""}
# mdoc's predefined strings (`\*[Lt]`, `\*q`), as man shows them: dash.1's `2\*[Gt]&1` read "2&1"
_MDOC_STRINGS = {"Lt": "<", "Gt": ">", "Le": "<=", "Ge": ">=", "Ne": "!=", "Eq": "=", "Pm": "±", "If": "∞",
                 "Pi": "π", "Na": "NaN", "Ba": "|", "Am": "&", "q": '"', "Lq": '"', "Rq": '"', "lp": "(", "rp": ")",
                 "left-bracket": "[", "right-bracket": "]", "left-parenthesis": "(", "right-parenthesis": ")",
                 "aa": "'", "ga": "`", "ua": "^", "Px": "POSIX", "Ai": "ANSI"}
# Escapes that take a delimited argument and print nothing of it (motions, widths, drawing).
_DELIMITED_DROP = set("hvwlLDXxNbRSHAoBZC")
# Escapes that take a name (one character, (xx, or [name]) and print nothing.
_NAMED_DROP = set("fFgkmMnVYsO$")
_NOTHING = set("&)/,%:^|dupra{}!")


class _Line:
    """What escapes left of one input line, and whether it ends in `\\c` (joins the next)."""

    def __init__(self, text: str, joins: bool) -> None:
        self.text, self.joins = text, joins


def _name_at(s: str, i: int) -> tuple[str, int]:
    """An escape's name at `s[i:]`: "x", "(xx" or "[long name]"; the name and where it ends."""
    if i >= len(s):
        return "", i
    if s[i] == "(":
        return s[i + 1 : i + 3], i + 3
    if s[i] == "[":
        end = s.find("]", i)
        return (s[i + 1 : end], end + 1) if end >= 0 else (s[i + 1 :], len(s))
    return s[i], i + 1


def _char(name: str) -> str:
    if name in _CHARS:
        return _CHARS[name]
    codes: list[int] = []
    if re.fullmatch(r"u[0-9A-Fa-f]{4,6}(?:_[0-9A-Fa-f]{4,6})*", name):
        codes = [int(part.lstrip("u"), 16) for part in name.split("_")]
    elif name.startswith("char") and name[4:].isdigit() and len(name) < 12:
        codes = [int(name[4:])]
    # no surrogate (`\[uD800]`: no encoder takes one alone) and nothing past Unicode
    return "".join(chr(c) for c in codes if c < 0x110000 and not 0xD800 <= c < 0xE000)


def unescape(s: str, strings: dict[str, str], depth: int = 0) -> _Line:
    """`s` with roff's escapes resolved as nroff prints them."""
    out: list[str] = []
    i, n = 0, len(s)
    joins = False
    while i < n:
        j = s.find("\\", i)
        if j < 0:
            out.append(s[i:])
            break
        out.append(s[i:j])
        if j + 1 >= n:  # a backslash at the end: the line goes on (a macro argument's) - dropped
            break
        c = s[j + 1]
        i = j + 2
        if c in "\"#":  # a comment to the end of the line (`\#` joins the next as well)
            joins = c == "#"
            break
        if c == "-":
            out.append("-")
        elif c in " ~0":
            out.append(" ")
        elif c in "\\eE":
            out.append("\\")
        elif c in ".'`":
            out.append(c)
        elif c == "t":
            out.append("\t")
        elif c == "c":
            joins = True
        elif c == "(" or c == "[":
            name, i = _name_at(s, j + 1)
            out.append(_char(name))
        elif c == "*":
            name, i = _name_at(s, i)
            value = strings.get(name, "")
            # a string's own strings were put in when it was defined (`_Reader.define`): one
            # level, where strings naming strings grew without end (`.ds x \*x\*x...`)
            if depth == 0:
                out.append(unescape(value, strings, depth + 1).text if "\\" in value else value)
        elif c in _DELIMITED_DROP:
            if i < n:
                end = s.find(s[i], i + 1)
                arg = s[i + 1 : end] if end >= 0 else s[i + 1 :]
                i = end + 1 if end >= 0 else n
                if c in "Zo":  # printed (without moving, or on top of each other): its text
                    out.append(unescape(arg, strings, depth + 1).text if depth < 8 else "")
                elif c == "C":
                    out.append(_char(arg))
                elif c == "h" and re.fullmatch(r"\+?0*[1-9][0-9]*(?:\.[0-9]*)?[uimnpPvcf]?", arg.strip()) \
                        and out and not out[-1].endswith(" "):
                    # a move right: a space between words (DocBook's lists, `\h'-04' 1.\h'+01'The`
                    # and `\(bu\h'+03'`, read "1.The" and "•produce")
                    out.append(" ")
        elif c in _NAMED_DROP:
            if c == "s":  # \s-1 \s+2 \s0 \s(12 \s[10] \s'..'
                m = re.match(r"[-+]?(?:\(\d\d|\[[^\]]*\]|'[^']*'|\d)", s[i:])
                i += m.end() if m else 0
            elif c == "n" and i < n and s[i] in "+-":  # \n+x: incremented, read: nothing printed
                _, i = _name_at(s, i + 1)
            else:
                _, i = _name_at(s, i)
        elif c == "z":
            pass  # zero width: the next character prints
        elif c in _NOTHING:
            pass
        else:
            out.append(c)
    return _Line("".join(out), joins)


def _copied(arg: str) -> str:
    """A macro's argument as copy mode reads it: `\\\\` is one backslash, so xargs.1's
    `.B "\\-\\-show\\\\-limits"` reads "--show-limits", as `man xargs` shows it (not
    "--show\\-limits")."""
    return arg.replace("\\\\", "\\") if "\\\\" in arg else arg


def split_args(s: str) -> list[str]:
    """A request's or macro's arguments, raw: split on blanks outside double quotes (`""`
    in a quoted one is a quote); an escaped blank (`\\ `) does not split."""
    args: list[str] = []
    i, n = 0, len(s)
    while i < n:
        while i < n and s[i] in " \t":
            i += 1
        if i >= n:
            break
        if s[i] == '"':
            i += 1
            arg = []
            while i < n:
                if s[i] == '"':
                    if i + 1 < n and s[i + 1] == '"':
                        arg.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                if s[i] == "\\" and i + 1 < n:
                    arg.append(s[i : i + 2])
                    i += 2
                    continue
                arg.append(s[i])
                i += 1
            args.append("".join(arg))
        else:
            start = i
            while i < n and s[i] not in " \t":
                i += 2 if s[i] == "\\" and i + 1 < n else 1
            args.append(s[start:i])
    return args


_CONDITION = re.compile(r"""\s*(!?)\s*(\\n\(\.g|\\n\[\.g\]|[ntoe](?![A-Za-z0-9])|[rdcmF]\s+\S+|'[^']*'[^']*'|\([^\s]*\)|\S+)\s?""")
# mdoc macros, as `man` prints them
_MDOC_ENCLOSE = {"Op": ("[", "]"), "Dq": ('"', '"'), "Qq": ('"', '"'), "Sq": ("'", "'"), "Ql": ("'", "'"),
                 "Pq": ("(", ")"), "Bq": ("[", "]"), "Brq": ("{", "}"), "Aq": ("<", ">"), "Eq": ("", "")}
_MDOC_OPEN = {"Oo": "[", "Do": '"', "Qo": '"', "So": "'", "Po": "(", "Bo": "[", "Bro": "{", "Ao": "<", "Eo": ""}
_MDOC_CLOSE = {"Oc": "]", "Dc": '"', "Qc": '"', "Sc": "'", "Pc": ")", "Bc": "]", "Brc": "}", "Ac": ">", "Ec": ""}
_MDOC_PLAIN = frozenset("Ar Pa Ev Cm Ic Li Em Sy Dv Va Er Fa Ft Vt Tn Ad Ms Cd Fd Ot No Sx Mt Lk St An Lb Ic Hf "
                        "Nx Ox Fx Bsx Dx Ux Xo Xc Tg Ef Ek Bk Sm Es En Ta".split())
_MDOC_NAMES = {"At": "AT&T UNIX", "Bx": "BSD", "Nx": "NetBSD", "Ox": "OpenBSD", "Fx": "FreeBSD", "Dx": "DragonFly",
               "Bsx": "BSD/OS", "Ux": "UNIX"}
_MDOC_STANDARDS = {"-ansiC": "ANSI X3.159-1989 (\"ANSI C89\")", "-isoC": "ISO/IEC 9899:1990 (\"ISO C90\")",
                   "-isoC-99": "ISO/IEC 9899:1999 (\"ISO C99\")", "-isoC-2011": "ISO/IEC 9899:2011 (\"ISO C11\")",
                   "-p1003.1": "IEEE Std 1003.1 (\"POSIX.1\")", "-p1003.2": "IEEE Std 1003.2 (\"POSIX.2\")",
                   "-p1003.1-2001": "IEEE Std 1003.1-2001 (\"POSIX.1\")", "-p1003.1-2008": "IEEE Std 1003.1-2008 (\"POSIX.1\")",
                   "-susv2": "Version 2 of the Single UNIX Specification (\"SUSv2\")",
                   "-susv3": "Version 3 of the Single UNIX Specification (\"SUSv3\")",
                   "-xpg4": "X/Open Portability Guide Issue 4 (\"XPG4\")"}
_PUNCTUATION = frozenset(".,:;)]?!")
_STRING_USE = re.compile(r"\\\*(?:\(([^\n]{2})|\[([^\]\n]*)\]|([^(\[\n]))")
_MAX_STRING = 4096  # a string's length at most
# requests that print nothing of their arguments (a page's macro made of them prints nothing)
_SILENT_REQUEST = re.compile(r"^[.']\s*(?:tm|tm1|tmc|nr|ds|as|ne|RS|in|ti|sp|ll|ft|ps|vs|ta|rr|ig)(?![A-Za-z0-9])")
_MAX_INCLUDES = 4  # `.so` pages read in one in another, at most
_MAX_EXPANSION = 8  # a page's own macros run one in another, at most
# the lines of a page's macro that is run (`expand`): text, and fonts, and conditions on
# text; one that sets fill, tabs or indents is said by its words (Xft's `.PS` says `.nf`,
# and its `.PE`, which says `.fi`, prints nothing: run alone, it left the page unfilled)
_EXPANDABLE = re.compile(r"^(?:[^.']|[.']\s*(?:\\[\"#]|(?:B|I|BR|BI|IB|RB|RI|IR|SM|SB)(?:\s|$)"
                         r"|(?:ie|if)\s+\S+\s+[^.'\s]|el\s+[^.'\s])|$)")
_MACRO_ARGUMENT = re.compile(r"\\\$(\d|\*|@|\(\d\d|\[\d+\])")
_LITERAL = "\x01"  # marks an mdoc word written with `\&`: said as it is
# a number or register, alone or compared with another (`\n(zZ=1`)
_REGISTER = r"\\n(?:\([^\s]{2}|\[[^\]\s]+\]|[^(\[\s])"
_SIMPLE_EXPRESSION = re.compile(rf"({_REGISTER}|\d+)(?:(==|=|<=|>=|<|>)({_REGISTER}|\d+))?")
# The manual a section's pages are in, as man says it where the page names none.
_MANUALS = {"1": "General Commands Manual", "2": "System Calls Manual", "3": "Library Functions Manual",
            "4": "Kernel Interfaces Manual", "5": "File Formats Manual", "6": "Games Manual",
            "7": "Miscellaneous Information Manual", "8": "System Manager's Manual", "9": "Kernel Developer's Manual"}
_LIKE_A_HEADING = re.compile(r"#{1,6}(?:\s|$)")
# A tag this short shares its body's first line ("-S  sort by file size"), the body indented past it.
_HANGING = 2
# A filled line takes the next source line's words until it is this long (man fills to 80 columns).
_FILL_WIDTH = 80
# mdoc's list kinds, and the marks of those that mark their items
_MDOC_LIST_KINDS = frozenset("-bullet -dash -hyphen -enum -item -tag -diag -hang -ohang -inset -column".split())
_MDOC_MARKED = {"-bullet": "•", "-dash": "-", "-hyphen": "-", "-enum": ""}
# mdoc's block and state macros: their arguments (`.Bk -words`, `.Bl -tag -width Ds`) print nothing
_MDOC_SILENT = frozenset("Bk Ek Sm Tg Bf Ef Os Xo Xc".split())


class _Reader:
    def __init__(self) -> None:
        self.out: list[tuple[str, int]] = []  # (line, source line)
        self.strings = dict(_STRINGS)
        self.indent = 0  # .RS levels
        self.body = False  # inside a tagged paragraph's body: indented
        self.tag_next = False  # the next text line is a .TP tag
        self.prefix = ""  # a short .IP tag ("•") put before the next text line
        self.url: list[str] = []  # .UR/.MT targets open
        self.joining = False  # the last line ended in \c
        self.name = ""  # mdoc's .Nm
        self.el_stack: list[bool] = []
        self.skip_to = ""  # "..": in a macro definition or .ig; "depth": in a false condition's block
        self.depth = 0
        self.table: dict | None = None
        self.line_no = 0
        self.pending_heading = ""  # a .SH without its title: the next line is it
        self.skip_end = ""  # .EQ/.PS: the request that ends what is skipped
        self.translate: dict[int, str] = {}  # .tr
        self.hanging = ""  # a short tag waiting for its body's first line
        self.date = ""  # mdoc's .Dd
        self.nofill = False  # .nf, .EX, mdoc's literal displays: lines as they are
        self.section = ""  # the .SH/.Sh the reader is in
        self.macros: dict[str, bool] = {}  # the page's own (.de), and whether each prints its arguments
        self.defining: tuple[str, list[str]] | None = None  # a .de being read: its name and body
        self.fill_pad: str | None = None  # the indent of the line the next text may fill, if any
        # mdoc's `.Sm off`: no spaces between a macro line's words nor between such lines (ssh's
        # `-L [bind_address:]port:host:hostport` read "[bind_address:] port: host: hostport")
        self.spacing = True
        self.spaced_line = True  # the next macro line under `.Sm off` starts apart (the first after it)
        self.tag_open = False  # an `.It ... Xo` tag, its words going on to its `.Xc`
        # number registers the page sets (`.nr zZ 1`): bash's rbash.1 and builtins.7 set one and
        # `.so` bash.1, whose `.if \n(zZ=1 .ig zZ` leaves out all but the part they show
        self.registers: dict[str, int] = {}
        # the source of a page a `.so` in the page names (None where it is not there): man
        # reads it in at that line
        self.include: Callable[[str], str | None] | None = None
        self.includes = 0  # pages being read in, one in another
        # mdoc's lists open (`.Bl`): each its kind ("-enum", "-bullet", "-tag"...), its items
        # counted, and the indent and body state it opened in (a list in an item's body is
        # indented under it, and its `.El` goes back to that body)
        self.lists: list[dict] = []
        self.macro_bodies: dict[str, list[str]] = {}  # the lines of the page's own macros
        self.expanding = 0  # macros of the page's own being run, one in another
        self.function: tuple[str, list[str]] | None = None  # an mdoc `.Fo` open: its name and `.Fa`s

    # -- output
    def emit(self, text: str, *, tagged: bool = False, fill: bool = True) -> None:
        text = text.rstrip().replace(_LITERAL, "")
        if self.tag_open and not tagged and not self.joining and text.strip():
            # an `.It Xo` tag's words going on to its `.Xc` (dash's `.It Xo cd|chdir Op Fl LP` then
            # `.Op Ar directory`): on the tag's line, where each macro's words were a line of the
            # body ("cd|chdir [-LP]" / "    [directory]")
            if self.out and self.out[-1][0].strip() and not self.hanging:
                last, where = self.out[-1]
                self.out[-1] = (f"{last} {text.strip()}", where)
                return
            tagged = True  # (`.It Xo` alone: these words start the tag)
        if self.joining and self.out and not self.hanging:
            last, where = self.out[-1]
            self.out[-1] = (last + (" " if text[:1] == " " and last[-1:] != " " else "") + text.lstrip(), where)
            return
        if not text.strip():
            self.blank()
            return
        if self.pending_heading:  # `.SS` over `.B XftFontInfo` or a text line: the heading's words
            level, self.pending_heading = self.pending_heading, ""
            self.put_heading(f"{level} {text.strip()}")
            return
        if self.tag_next:  # a .TP's tag, whether a text line or a font macro's (`.B \-a`)
            self.tag_next, tagged = False, True
            self.body = False
        if self.translate:
            text = text.translate(self.translate)
        if tagged:
            self.flush_hanging()
            if len(text.strip()) <= _HANGING and not _LIKE_A_HEADING.match(text.strip()) and not self.tag_open:
                # a tag as short as "-S" opens its body's first line, as man shows it:
                # "-S  sort by file size" is one line, a fact read whole
                self.hanging, self.body = text.strip(), True
                return
        pad = "    " * self.indent + ("    " if self.body and not tagged else "")
        fill = fill and not tagged and not self.nofill
        if (fill and self.fill_pad == pad and not self.hanging and not self.prefix and text[:1] not in " \t"
                and self.out and len(self.out[-1][0]) < _FILL_WIDTH):
            # filled as man fills a paragraph: each macro's words (`.B dash`, `.Fl c`, `.Xr ls 1`) were
            # a line of their own. The line is cited by where it starts.
            last, where = self.out[-1]
            self.out[-1] = (f"{last} {text.strip()}", where)
            return
        next_pad = pad
        if self.hanging:
            pad, text = "    " * self.indent + self.hanging.ljust(_HANGING + 2), text.lstrip()
            self.hanging = ""
        if self.prefix:
            text, self.prefix = f"{self.prefix} {text.lstrip()}", ""
        if not pad and _LIKE_A_HEADING.match(text):
            # a shell comment or root prompt ("# mount /dev/sda1"), a tag "#": no heading of
            # the page, indented as a code sample is
            pad = next_pad = "    "
        self.out.append((pad + text, self.line_no))
        self.fill_pad = next_pad if fill else None
        if tagged:
            self.body = True

    def put_heading(self, line: str) -> None:
        self.flush_hanging()
        self.out.append((line, self.line_no))
        self.fill_pad = None

    def flush_hanging(self) -> None:
        """A short tag with no body line after it: a line of its own. So is a short `.IP`
        tag with none (dpkg-buildpackage's `.IP -si 4` / `.IP -sa 4` / `.IP -sd 4`, one body
        for the three, lost "-si -sa")."""
        if self.hanging:
            self.out.append(("    " * self.indent + self.hanging, self.line_no))
            self.hanging = ""
            self.fill_pad = None
        if self.prefix:
            self.out.append(("    " * self.indent + ("    " if self.body else "") + self.prefix, self.line_no))
            self.prefix = ""
            self.fill_pad = None

    def blank(self) -> None:
        self.flush_hanging()
        self.fill_pad = None
        if self.out and self.out[-1][0] != "":
            self.out.append(("", self.line_no))

    def text_line(self, raw: str) -> None:
        if raw.startswith("\\#"):
            # a comment line whose newline goes with it (top.1 opens with dozens): no line at all.
            # Read as an empty line that joins the next, it ran the title into the heading
            # ("# TOP(1)User Commands") and "## NAME" into "top".
            return
        line = unescape(raw, self.strings)
        self.emit(line.text)
        self.joining = line.joins
        if line.joins and line.text[-1:].isspace() and line.text.strip() and self.out and not self.hanging:
            last, where = self.out[-1]  # a space before the `\c` stays between the joined words
            self.out[-1] = (last + " ", where)

    def args(self, rest: str) -> list[str]:
        return [unescape(_copied(a), self.strings).text for a in split_args(rest)]

    # -- input
    def feed(self, raw: str) -> None:
        if self.skip_to == "..":
            if re.match(r"^[.']\s*\.\s*(?:\\\".*)?$", raw):
                self.skip_to = ""
                if self.defining:
                    name, body = self.defining
                    # a macro of the page's own that prints its arguments (`.ZN Name`, `.MTO mail name`):
                    # its words said, where they were lost; one that only indexes or logs (pod2man's
                    # `.IX`, `.tm`) prints nothing
                    # (nor one that spaces or indents by its argument: pod2man's `.Vb 4` says
                    # `.ne \\$1`, docutils' `.INDENT 0.0` `.RS \\$1`)
                    self.macros[name] = any("\\$" in line and not _SILENT_REQUEST.match(line) for line in body)
                    self.macro_bodies[name] = body
                    self.defining = None
            elif self.defining:
                self.defining[1].append(raw)
            return
        if self.skip_to == "depth":
            self.depth += raw.count("\\{") - raw.count("\\}")
            if self.depth <= 0:
                self.skip_to, self.depth = "", 0
            return
        if self.table is not None:
            self.table_line(raw)
            return
        if raw[:1] in ".'":
            self.request(raw)
        else:
            self.text_line(raw.replace("\\}", "") if "\\}" in raw else raw)

    def condition(self, rest: str) -> tuple[bool, str]:
        m = _CONDITION.match(rest)
        if m is None:
            return False, ""
        negate, test = m.group(1), m.group(2)
        if test not in ("n", "t", "o", "e", "\\n(.g", "\\n[.g]"):
            # a register the page set, compared (`\n(zZ=1`), or whether one is set (`!rzZ`);
            # any other expression or register: taken as false
            value = self.evaluate(test)
            return (value is not None and value != bool(negate)), rest[m.end() :]
        value = test in ("n", "o", "\\n(.g", "\\n[.g]")  # nroff, groff, an odd page
        return value != bool(negate), rest[m.end() :]

    def number(self, term: str) -> int | None:
        """A number or a register's value (`\\n(zZ`, `\\n[name]`, `\\nx`); None where the page
        set no such register (its value depends on the formatter: unknown)."""
        if term.isdigit():
            return int(term)
        name, _ = _name_at(term, 2)
        return 1 if name == ".g" else self.registers.get(name)

    def evaluate(self, test: str) -> bool | None:
        """A condition on registers: `rname` (set or not), a number or register alone, or two
        compared (`\\n(zZ=1`, `\\n(XX>2`); None for any other expression."""
        m = re.fullmatch(r"r\s*([^\s\\]+)", test)
        if m:
            return m.group(1) in self.registers
        m = _SIMPLE_EXPRESSION.fullmatch(test)
        if m is None:
            return None
        left = self.number(m.group(1))
        if m.group(2) is None:
            return None if left is None else left > 0
        right = self.number(m.group(3))
        if left is None or right is None:
            return None
        op = m.group(2)
        return {"=": left == right, "==": left == right, "<": left < right, ">": left > right,
                "<=": left <= right, ">=": left >= right}[op]

    def r_nr(self, rest: str) -> None:
        """`.nr zZ 1`, `.nr x +1`: a register the page's conditions may name."""
        parts = rest.split()
        if len(parts) < 2 or "\\" in parts[0]:
            return
        value = parts[1]
        sign = value[:1] if value[:1] in "+-" else ""
        number = self.number(value[len(sign):])
        if number is None:
            self.registers.pop(parts[0], None)  # (something this reader does not compute: unknown)
            return
        if sign and parts[0] in self.registers:
            number = self.registers[parts[0]] + (number if sign == "+" else -number)
        elif sign == "-":
            number = -number
        self.registers[parts[0]] = number

    def r_rr(self, rest: str) -> None:
        for name in rest.split():
            self.registers.pop(name, None)

    def body_of(self, value: bool, body: str) -> None:
        """A condition's body: run where `value`, else skipped (a `\\{` block to its `\\}`)."""
        body = body.lstrip()
        opens = body.count("\\{") - body.count("\\}")
        if not value:
            if opens > 0:
                self.skip_to, self.depth = "depth", opens
            return
        body = body.replace("\\{", "", 1).lstrip()
        if body.endswith("\\"):
            body = body[:-1]
        body = body.replace("\\}", "")
        if body.strip():
            self.feed(body)

    def request(self, raw: str) -> None:
        m = re.match(r"^[.']\s*(\S*)\s*(.*)$", raw)
        if m is None:
            return
        name, rest = m.group(1), m.group(2)
        if name.startswith(('\\"', "\\#")) or name == "":
            return
        if "\\}" in name:  # 'br\} closing a block that ran
            name = name.replace("\\}", "")
        handler = getattr(self, "r_" + name, None) if name.isalnum() and name.isascii() else None
        if name in ("PS", "EQ") and name in self.macros:  # the page's own (Xft's prototypes), not pic's or eqn's
            handler = None
        if name == "Sm":
            self.spacing = {"off": False, "on": True}.get(rest.strip().lower(), not self.spacing)
            self.spaced_line = True
            return
        if name == "Xc" and self.tag_open:  # the tag's end: its body starts a line of its own
            self.tag_open = False
            self.flush_hanging()
            self.fill_pad = None
            return
        if name in ("Xo", "Xc") and len(rest.split()) > 0:
            self.mdoc(name, rest)  # `.Xo ( Fl CC ) Xc` in a line of tmux.1: its words, "(-CC)"
            return
        if name in _MDOC_SILENT:
            return
        if name in ("ie", "if"):
            value, body = self.condition(rest)
            if name == "ie":
                self.el_stack.append(not value)
            self.body_of(value, body)
        elif name.startswith("el"):
            value = self.el_stack.pop() if self.el_stack else False
            self.body_of(value, (name[2:] + " " + rest) if len(name) > 2 else rest)
        elif name in ("de", "de1", "am", "ig", "dei", "ami", "am1"):
            self.skip_to = ".."
            defined = re.split(r'\\["#]', rest, maxsplit=1)[0].split()  # (`.de Vb \" Begin verbatim text`)
            # `.ig zZ` ends at `.zZ`, `.de X ZZ` at `.ZZ` (bash.1 leaves parts out so); else at `..`
            end = defined[0] if name == "ig" and defined else defined[1] if name != "ig" and len(defined) > 1 else ".."
            if end != ".." and "\\" not in end:
                self.skip_end = end
            elif name in ("de", "de1") and defined:
                self.defining = (defined[0], [])
        elif name in self.macros and handler is None:
            words = [a for a in self.args(rest) if a.strip()]
            body = self.macro_bodies.get(name)
            if self.macros[name] and body is not None and self.expanding < _MAX_EXPANSION \
                    and all(_EXPANDABLE.match(line) for line in body):
                self.expand(body, split_args(rest))
            elif self.macros[name] and words:
                said = words[0] + "".join(w if w in _PUNCTUATION else f" {w}" for w in words[1:])
                self.emit(f" {said}" if self.joining else said)
        elif name in ("ds", "ds1", "as", "as1"):
            key, _, value = rest.partition(" ")
            value = value.lstrip()
            value = self.define(value[1:] if value.startswith('"') else value)
            self.strings[key] = (self.strings.get(key, "") + value if name.startswith("as") else value)[:_MAX_STRING]
        elif handler is not None:
            handler(rest)
        elif name in _MDOC_PLAIN or name in _MDOC_ENCLOSE or name in _MDOC_OPEN or name in _MDOC_CLOSE \
                or name in ("Fl", "Xr", "Nm", "Pf", "Ns", "Fn", "In", "Ex", "Rv", "It", "Nd", "Lb", "Dl", "D1") \
                or name in _MDOC_NAMES or re.fullmatch(r"%[A-Z]", name):  # (`.Bx` alone: "BSD")
            self.mdoc(name, rest)
        # any other request (.nr, .ad, .ft, .in, .ne, .TS options ...) prints nothing

    def r_als(self, rest: str) -> None:
        """`.als MTO URL`: a name for a macro the page defined."""
        names = rest.split()
        if len(names) == 2 and names[1] in self.macros:
            self.macros[names[0]] = self.macros[names[1]]
            if names[1] in self.macro_bodies:
                self.macro_bodies[names[0]] = self.macro_bodies[names[1]]

    def expand(self, body: list[str], arguments: list[str]) -> None:
        """A page's own macro that prints its arguments, run as roff runs it: its lines with
        `\\$1`... put in (util-linux's `.MTO "kzak@redhat.com" "Karel Zak" ""`, whose body is
        `\\fI\\$2\\fP <\\$1>\\$3`, read "kzak@redhat.com Karel Zak": its words in the order
        given, the address before its name)."""
        def argument(m: re.Match) -> str:
            key = m.group(1).strip("([]")
            if key == "*":
                return " ".join(arguments)
            if key == "@":
                return " ".join(f'"{a}"' for a in arguments)
            return arguments[int(key) - 1] if 0 < int(key) <= len(arguments) else ""

        lines: list[str] = []
        for line in body:  # (copy mode: `\\` is `\`; a line ending in `\` goes on)
            line = _MACRO_ARGUMENT.sub(argument, line.replace("\\\\", "\\"))
            if lines and lines[-1].endswith("\\") and not lines[-1].endswith("\\\\"):
                lines[-1] = lines[-1][:-1] + line
            else:
                lines.append(line)
        saved = self.registers.get(".$")
        self.registers[".$"] = len(arguments)
        self.expanding += 1
        try:
            for line in lines:
                self.feed(line)
        finally:
            self.expanding -= 1
            if saved is None:
                self.registers.pop(".$", None)
            else:
                self.registers[".$"] = saved

    def define(self, value: str) -> str:
        """A string's value with the strings it names put in, as roff does when it is
        defined (copy mode), so that using it expands one level only."""
        return _STRING_USE.sub(lambda m: self.strings.get(m[1] or m[2] or m[3], ""), value)

    # -- man(7)
    def r_TH(self, rest: str) -> None:
        args = self.args(rest)
        if args:
            self.put_heading(f"# {args[0]}({args[1]})" if len(args) > 1 else f"# {args[0]}")
            manual = args[4] if len(args) > 4 and args[4].strip() else _MANUALS.get(args[1][:1] if len(args) > 1 else "", "")
            about = ", ".join(a for a in ([manual] + args[3:4] + args[2:3]) if a.strip())
            if about:
                self.emit(about, fill=False)

    def heading(self, level: str, title: str) -> None:
        self.flush_hanging()
        self.indent, self.body, self.tag_next, self.prefix = 0, False, False, ""
        if level == "##":
            self.section = title.strip().upper()
        self.blank()
        if title.strip():
            self.put_heading(f"{level} {title.strip()}")
        else:
            self.pending_heading = level

    def r_SH(self, rest: str) -> None:
        self.heading("##", " ".join(self.args(rest)))

    def r_SS(self, rest: str) -> None:
        self.heading("###", " ".join(self.args(rest)))

    def r_Sh(self, rest: str) -> None:
        self.heading("##", self.mdoc_text(rest))

    def r_Ss(self, rest: str) -> None:
        self.heading("###", self.mdoc_text(rest))

    def r_tr(self, rest: str) -> None:
        pairs = unescape(rest.strip(), self.strings).text
        for a, b in zip(pairs[0::2], pairs[1::2] + " "):
            self.translate[ord(a)] = b

    def paragraph(self, rest: str = "") -> None:
        self.flush_hanging()
        self.body, self.tag_next, self.prefix = False, False, ""
        self.blank()

    r_PP = r_P = r_LP = r_HP = paragraph

    def r_Pp(self, rest: str) -> None:
        """mdoc's paragraph: in a list item's body, a paragraph of that body (dash's echo
        lists its escapes so, under the item)."""
        if self.lists and self.body:
            self.tag_next, self.prefix = False, ""
            self.blank()
        else:
            self.paragraph(rest)

    r_Lp = r_Pp

    def r_sp(self, rest: str) -> None:
        self.blank()

    def r_TP(self, rest: str) -> None:
        self.paragraph()
        self.tag_next = True

    def r_TQ(self, rest: str) -> None:
        self.body = False
        self.tag_next = True

    def r_IP(self, rest: str) -> None:
        self.paragraph()
        args = self.args(rest)
        tag = args[0].strip() if args else ""
        if tag and len(tag) <= 4:
            self.prefix = tag  # "•", "1.", "-"
            self.body = True
        elif tag:
            self.emit(tag, tagged=True)
        else:
            self.body = True

    def r_RS(self, rest: str) -> None:
        self.indent += 1

    def r_RE(self, rest: str) -> None:
        self.indent = max(0, self.indent - 1)

    def font(self, rest: str, alternate: bool) -> None:
        args = self.args(rest)
        if not args:
            return  # applies to the next line, which prints as it is
        self.emit(("" if alternate else " ").join(args))

    def r_B(self, rest: str) -> None:
        self.font(rest, False)

    r_I = r_SM = r_SB = r_B

    def r_BR(self, rest: str) -> None:
        self.font(rest, True)

    r_BI = r_IB = r_RB = r_RI = r_IR = r_BR

    def r_UR(self, rest: str) -> None:
        self.url.append(" ".join(self.args(rest)))

    r_MT = r_UR

    def r_UE(self, rest: str) -> None:
        url = self.url.pop() if self.url else ""
        tail = "".join(self.args(rest))
        if self.out and url:
            last, where = self.out[-1]
            self.out[-1] = (f"{last} <{url}>{tail}" if last else f"<{url}>{tail}", where)

    r_ME = r_UE

    def r_SY(self, rest: str) -> None:
        self.blank()
        self.emit(" ".join(self.args(rest)))

    def r_OP(self, rest: str) -> None:
        self.emit(f"[{' '.join(self.args(rest))}]")

    def r_YS(self, rest: str) -> None:
        self.blank()

    def r_MR(self, rest: str) -> None:
        args = self.args(rest)
        if args:
            self.emit(f"{args[0]}({args[1] if len(args) > 1 else ''}){''.join(args[2:])}")

    def r_so(self, rest: str) -> None:
        """`.so man1/bash.1` inside a page (rbash.1, bash-builtins.7): that page's text read in
        here, as man does, its lines cited as the `.so` line; "See ..." where it is not there."""
        link = rest.strip().split()[0] if rest.strip() else ""
        source = self.include(link) if self.include and link and self.includes < _MAX_INCLUDES else None
        if source is None:
            self.emit(f"See {rest.strip()}.")
            return
        at = self.line_no
        self.includes += 1
        try:
            _read_lines(self, source.split("\n"), at)
        finally:
            self.includes -= 1
            self.line_no = at

    def r_nf(self, rest: str) -> None:
        self.nofill = True
        self.fill_pad = None

    r_EX = r_nf

    def r_fi(self, rest: str) -> None:
        self.nofill = False

    r_EE = r_fi

    def r_br(self, rest: str) -> None:
        self.fill_pad = None

    def r_TS(self, rest: str) -> None:
        self.blank()
        self.table = {"format": True, "tab": "\t", "cell": None, "row": []}

    def r_EQ(self, rest: str) -> None:
        self.skip_to, self.skip_end = "..", "EN"  # an equation (eqn), a picture (pic): nothing in words

    def r_PS(self, rest: str) -> None:
        self.skip_to, self.skip_end = "..", "PE"

    # -- tables (tbl)
    def table_line(self, raw: str) -> None:
        t = self.table
        assert t is not None
        if re.match(r"^[.']\s*TE\b", raw):
            self.table = None
            self.blank()
            return
        if t["cell"] is not None:  # inside T{ ... T}
            if raw.startswith("T}"):
                t["row"].append(" ".join(t["cell"]).strip())
                t["cell"] = None
                self.table_row(raw[2:].lstrip(t["tab"]), joined=True)
            elif raw[:1] in ".'":
                # a font macro's words are the cell's (ps.1's `.B ps`, `.BR cmd , \ command ).`
                # were lost from its format keywords' descriptions); other requests print nothing
                m = re.match(r"^[.']\s*(B|I|SM|SB|BR|BI|IB|RB|RI|IR)\s+(.*)$", raw)
                if m:
                    words = self.args(m.group(2))
                    alternating = m.group(1) in ("BR", "BI", "IB", "RB", "RI", "IR")
                    t["cell"].append(("" if alternating else " ").join(words).strip())
            else:
                t["cell"].append(unescape(raw, self.strings).text.strip())
            return
        if re.match(r"^[.']\s*T&", raw):
            t["format"] = True
            return
        if t["format"]:
            m = re.search(r"tab\s*\((.)\)", raw)
            if m:
                t["tab"] = m.group(1)
            if raw.rstrip().endswith("."):
                t["format"] = False
            return
        if raw[:1] in ".'":
            return
        self.table_row(raw)

    def table_row(self, raw: str, joined: bool = False) -> None:
        t = self.table
        assert t is not None
        cells = raw.split(t["tab"]) if raw else []
        if cells and cells[-1].endswith("T{"):
            cells[-1] = cells[-1][:-2]
            t["row"] += [unescape(c, self.strings).text.strip() for c in cells[:-1]] + (
                [] if not cells[-1].strip() else [unescape(cells[-1], self.strings).text.strip()])
            t["cell"] = []
            return
        if not joined and raw.strip() in ("_", "=", "") and not t["row"]:
            return
        row = t["row"] + [unescape(c, self.strings).text.strip() for c in cells if c.strip() not in ("_", "=")]
        t["row"] = []
        if any(row):
            self.emit(" | ".join(row), fill=False)

    # -- mdoc(7)
    def mdoc_text(self, rest: str) -> str:
        return self.mdoc_words(self.mdoc_args(rest))

    def mdoc_args(self, rest: str) -> list[str]:
        """An mdoc line's words; one with a `\\&` in it is marked literal (`!\\&`, `\\&Fl`:
        no punctuation to close up, no macro to call)."""
        return [(_LITERAL if "\\&" in raw else "") + unescape(_copied(raw), self.strings).text
                for raw in split_args(rest)]

    def mdoc_words(self, words: list[str]) -> str:
        """The words of an mdoc line, its callable macros done (`Fl a Ar file` -> "-a file")."""
        out: list[str] = []
        no_space = False
        i = 0

        def put(word: str) -> None:
            nonlocal no_space
            if out and (no_space or word in _PUNCTUATION or (len(word) == 1 and word in _PUNCTUATION)):
                out[-1] += word
            elif out and out[-1] and out[-1][-1] in "([" and len(out[-1]) == 1:
                out[-1] += word
            else:
                out.append(word)
            no_space = False

        while i < len(words):
            w = words[i]
            i += 1
            if w.startswith(_LITERAL):  # (ssh_config's `.Pq Sq !\&` read "('')!")
                if out and (no_space or (out[-1] and out[-1][-1] in "([" and len(out[-1]) == 1)):
                    out[-1] += w
                else:
                    out.append(w)
                no_space = False
                continue
            if w == "Fl":
                if i < len(words) and words[i] == "Fl":  # `Fl Fl apple`: "--apple" (read "- -apple")
                    put("-")
                    no_space = True
                elif i < len(words) and words[i] not in _PUNCTUATION and not _is_macro(words[i]):
                    put("-" + words[i])
                    i += 1
                else:
                    put("-")
            elif w == "Nm":
                if i < len(words) and not _is_macro(words[i]) and words[i] not in _PUNCTUATION:
                    self.name = self.name or words[i]
                    put(words[i])
                    i += 1
                else:
                    put(self.name)
            elif w == "Xr" and i < len(words):
                put(f"{words[i]}({words[i + 1]})" if i + 1 < len(words) else words[i])
                i += 2
            elif w in _MDOC_ENCLOSE:
                inner, tail = words[i:], []
                while inner and inner[-1] in _PUNCTUATION:
                    tail.insert(0, inner.pop())
                left, right = _MDOC_ENCLOSE[w]
                put(left + self.mdoc_words(inner) + right)
                for p in tail:
                    put(p)
                i = len(words)
            elif w in _MDOC_OPEN:
                put(_MDOC_OPEN[w])
                no_space = True
            elif w in _MDOC_CLOSE:
                if out:
                    out[-1] += _MDOC_CLOSE[w]
                else:
                    put(_MDOC_CLOSE[w])
            elif w == "Ns":
                no_space = True
            elif w == "Ta":  # a `.Bl -column` cell's end: tmux's `{last} Ta ! Ta ...` read "{last}! ..."
                out.append("|")
                if i < len(words):
                    out.append(self.mdoc_words(words[i:]))
                break
            elif w == "Pf" and i < len(words):
                put(words[i])
                no_space = True
                i += 1
            elif w in _MDOC_NAMES:
                put(_MDOC_NAMES[w])
            elif w == "St" and i < len(words):
                put(_MDOC_STANDARDS.get(words[i], words[i]))
                i += 1
            elif w == "Ar" and (i >= len(words) or _is_macro(words[i]) or words[i] in _PUNCTUATION):
                put("file ...")
            elif w in _MDOC_PLAIN:
                continue
            else:
                put(w)
        return (" " if self.spacing else "").join(out).replace(_LITERAL, "")

    def mdoc(self, name: str, rest: str) -> None:
        words = self.mdoc_args(rest)
        if self.function is not None and name == "Fa":  # an argument of the `.Fo` open
            self.function[1].append(self.mdoc_words(words))
            return
        if name == "It":
            self.tag_open = "Xo" in words
        if not self.spacing and name not in ("It", "Dl", "D1"):
            joined, self.joining = self.joining, not self.spaced_line
            self.spaced_line = False
            try:
                self.mdoc_spaced(name, words)
            finally:
                self.joining = joined
            return
        self.mdoc_spaced(name, words)

    def mdoc_spaced(self, name: str, words: list[str]) -> None:
        if name == "Nd":
            desc = "- " + self.mdoc_words(words)
            if self.out and self.out[-1][0].strip():
                last, where = self.out[-1]
                self.out[-1] = (f"{last} {desc}", where)
            else:
                self.emit(desc)
        elif name == "It":
            self.body = False
            self.blank()
            kind = self.lists[-1] if self.lists else None
            if kind is not None and kind["kind"] in _MDOC_MARKED:  # `.Bl -enum`: "1.", `-bullet`: "•"
                kind["n"] += 1
                self.prefix = f"{kind['n']}." if kind["kind"] == "-enum" else _MDOC_MARKED[kind["kind"]]
                self.body = True
                if words:
                    self.emit(self.mdoc_words(words))
                return
            self.emit(self.mdoc_words(words), tagged=True)
        elif name == "Ex":  # as mandoc words them
            names = [w for w in words if w != "-std"] or [self.name or "utility"]
            self.emit(f"The {' and '.join(names)} utilit{'ies exit' if len(names) > 1 else 'y exits'} 0 on success, "
                      "and >0 if an error occurs.")
        elif name == "Rv":
            names = [f"{w}()" for w in words if w != "-std"] or [f"{self.name}()" if self.name else "function"]
            self.emit(f"The {' and '.join(names)} function{'s return' if len(names) > 1 else ' returns'} the value 0 "
                      "if successful; otherwise the value -1 is returned and the global variable errno is set to "
                      "indicate the error.")
        elif name in ("Dl", "D1"):  # a display line: its own, indented
            self.blank()
            self.emit("    " + self.mdoc_words(words), fill=False)
            self.blank()
        elif name == "Nm" and self.section == "SYNOPSIS":  # each form of the command on a line of its own
            self.fill_pad = None
            self.emit(self.mdoc_words([name, *words]))
        elif name == "Lb" and words:
            lib = words[0]
            self.emit(f"library \"{lib}\" (-l{lib.removeprefix('lib')})")
        elif name.startswith("%"):  # a reference's author, title, journal... (.Rs ... .Re)
            self.emit(self.mdoc_words(words) + ",")
        elif name == "In" and words and self.section == "SYNOPSIS":  # a line of its own
            self.fill_pad = None
            self.emit(f"#include <{words[0]}>", fill=False)
        elif name == "In" and words:  # in the text, the header's name only (file.1's "defined in <elf.h>,")
            self.emit(f"<{words[0]}>" + "".join(w if w in _PUNCTUATION else f" {w}" for w in words[1:]))
        elif name == "An" and words and words[0] in ("-split", "-nosplit"):
            pass
        elif name == "Ft" and self.section == "SYNOPSIS":  # each prototype on a line of its own
            self.fill_pad = None
            self.emit(self.mdoc_words(words))
        elif name == "Fn" and words:
            tail = "".join(w for w in words[1:] if w in _PUNCTUATION)
            arguments = [w.replace(_LITERAL, "") for w in words[1:] if w not in _PUNCTUATION]
            self.prototype(words[0], arguments, tail)
        else:
            self.emit(self.mdoc_words([name, *words]))

    def mdoc_page(self) -> None:
        """An mdoc page (`.Dd`, `.Dt`): its predefined strings, under the page's own."""
        self.strings = {**_MDOC_STRINGS, **self.strings}

    def r_Dt(self, rest: str) -> None:
        self.mdoc_page()
        args = self.args(rest)
        if args:
            self.put_heading(f"# {args[0]}({args[1]})" if len(args) > 1 else f"# {args[0]}")
            about = ", ".join(a for a in (_MANUALS.get(args[1][:1] if len(args) > 1 else "", ""), self.date) if a)
            if about:
                self.emit(about, fill=False)

    def r_Dd(self, rest: str) -> None:
        self.mdoc_page()
        # the page's date, said under its title as `man` shows it in the footer ("$Mdocdate: March 1 2024 $")
        self.date = re.sub(r"\$Mdocdate:?", "", " ".join(self.args(rest))).strip(" $")

    def r_Fo(self, rest: str) -> None:
        """`.Fo crypt` / `.Fa "const char *phrase"` ... / `.Fc`: a function's name and
        arguments, said as "crypt(const char *phrase, ...)"; its name was lost."""
        words = self.mdoc_args(rest)
        self.function = (self.mdoc_words(words[:1]), []) if words else None

    def r_Fc(self, rest: str) -> None:
        if self.function is None:
            return
        (function, arguments), self.function = self.function, None
        tail = self.mdoc_text(rest)
        self.prototype(function, arguments, tail)

    def prototype(self, function: str, arguments: list[str], tail: str) -> None:
        """`crypt(const char *phrase, ...)`, `;` after it in a SYNOPSIS (`.Fn`, `.Fo`...`.Fc`)."""
        self.emit(f"{function}({', '.join(arguments)}){';' if self.section == 'SYNOPSIS' else ''}{tail}")

    def r_Rs(self, rest: str) -> None:
        self.blank()

    r_Re = r_Rs

    def r_Bl(self, rest: str) -> None:
        self.blank()
        kind = next((w for w in rest.split() if w in _MDOC_LIST_KINDS), "-tag")
        self.lists.append({"kind": kind, "n": 0, "indent": self.indent, "body": self.body})
        if len(self.lists) > 1 and self.body:  # a list in an item's body: under that item
            self.indent += 1
            self.body = False

    def r_El(self, rest: str) -> None:
        if self.lists:
            opened = self.lists.pop()
            self.indent, self.body = opened["indent"], opened["body"]
        else:
            self.body = False
        self.prefix = ""
        self.blank()

    def r_Bd(self, rest: str) -> None:
        self.blank()
        self.nofill = any(kind in rest for kind in ("-literal", "-unfilled"))

    def r_Ed(self, rest: str) -> None:
        self.blank()
        self.nofill = False


def _is_macro(word: str) -> bool:
    return (word in _MDOC_PLAIN or word in _MDOC_ENCLOSE or word in _MDOC_OPEN or word in _MDOC_CLOSE
            or word in ("Fl", "Xr", "Nm", "Ns", "Pf") or word in _MDOC_NAMES)


def _read_lines(reader: _Reader, lines: list[str], at: int | None = None) -> None:
    """`lines` fed to `reader`, each cited as its own line, or all as line `at` (a page
    read in by `.so`)."""
    k = 0
    while k < len(lines):
        raw = lines[k]
        k += 1
        # a line ending in a backslash goes on (a macro's argument, a condition's body)
        while raw.endswith("\\") and not raw.endswith("\\\\") and k < len(lines) and reader.skip_to == "":
            raw = raw[:-1] + lines[k]
            k += 1
        reader.line_no = k if at is None else at
        if reader.skip_end and reader.skip_to == "..":
            if re.match(rf"^[.']\s*{re.escape(reader.skip_end)}(?=\s|$)", raw):
                reader.skip_to, reader.skip_end = "", ""
            continue
        reader.feed(raw)


def roff_to_text(text: str, include: Callable[[str], str | None] | None = None) -> tuple[str, tuple[int, ...]]:
    """A man page's source as `man` shows it, and the source line (1-based) of each of its
    lines. `include`: the source of the page a `.so` names (`man1/bash.1`), None where there
    is none; without it a `.so` says "See man1/bash.1."."""
    reader = _Reader()
    reader.include = include
    _read_lines(reader, text.split("\n"))
    reader.flush_hanging()
    out = reader.out
    while out and not out[-1][0].strip():
        out.pop()
    while out and not out[0][0].strip():
        out.pop(0)
    return "\n".join(line for line, _ in out) + "\n", tuple(max(1, n) for _, n in out)
