"""Text of a PDF, page by page, with pypdf."""

from __future__ import annotations

import io
import logging
import warnings
from contextlib import contextmanager
from typing import Iterator

from pypdf import PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, PyPdfError

from ktcli.ingest.errors import RejectedInput
from ktcli.ingest.normalize import normalize_text


@contextmanager
def _quiet_pypdf() -> Iterator[None]:
    """pypdf logs and warns about every repairable defect; our stderr is for the user."""
    logger = logging.getLogger("pypdf")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def extract_pages(data: bytes, display: str) -> list[str]:
    """Normalised text of every page (trailing newlines stripped), in page order.

    Raises RejectedInput for a corrupt PDF, one that needs a password, and one with no
    text on any page (scanned), each with what the user can do about it."""
    with _quiet_pypdf():
        try:
            reader = PdfReader(io.BytesIO(data), strict=False)
            _unlock(reader, display)
            pages = list(reader.pages)
        except RejectedInput:
            raise
        except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError, OSError) as e:
            raise RejectedInput(display, f"corrupt or unreadable PDF ({_short(e)})") from None
        texts: list[str] = []
        failures = 0
        for page in pages:
            try:
                raw = page.extract_text() or ""
            except DependencyError as e:
                raise RejectedInput(display, f"cannot read this PDF: {_short(e)}") from None
            except Exception:  # noqa: BLE001 - pypdf raises anything on broken content streams
                failures += 1
                raw = ""
            texts.append(normalize_text(raw).rstrip("\n"))
    if not pages:
        raise RejectedInput(display, "corrupt PDF (no pages)")
    if not any(t.strip() for t in texts):
        if failures == len(pages):
            raise RejectedInput(display, f"corrupt PDF (no page could be read, {len(pages)} tried)")
        return _no_text(display, len(pages))
    return texts


def _unlock(reader: PdfReader, display: str) -> None:
    """Many PDFs are encrypted with an empty user password (only printing/copying is
    restricted); those open. Only a real password requirement is an error."""
    if not reader.is_encrypted:
        return
    try:
        opened = reader.decrypt("")
    except DependencyError as e:
        raise RejectedInput(
            display, "encrypted PDF", f"reading it needs an extra package: {_short(e)}"
        ) from None
    except (FileNotDecryptedError, PyPdfError, ValueError, NotImplementedError) as e:
        raise RejectedInput(display, f"encrypted PDF that cannot be opened ({_short(e)})") from None
    if not opened:
        raise RejectedInput(
            display,
            "encrypted PDF that needs a password",
            "decrypt it first, e.g. `qpdf --password=PASSWORD --decrypt in.pdf out.pdf`",
        )


def _no_text(display: str, n_pages: int) -> list[str]:
    pages = "its page" if n_pages == 1 else f"any of its {n_pages} pages"
    raise RejectedInput(
        display,
        f"no text layer on {pages} (a scanned or image-only PDF?)",
        "run OCR first, e.g. `ocrmypdf in.pdf out.pdf`",
    )


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:160] if text else type(error).__name__
