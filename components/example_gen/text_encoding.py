"""The CSV text encoding parameter: its default, its check, and the codec Python reads it with. Kept apart
from the Beam readers so that the spec (imported when a DAG file is parsed) stays light."""
from __future__ import annotations

import codecs

# CSV text is UTF-8 unless the `encoding` parameter says otherwise (Latin-1 and Windows-1252 exports are common).
DEFAULT_ENCODING = "utf-8"

_EXAMPLES = "e.g. utf-8, latin-1, cp1252, utf-16"


def check_encoding(encoding: str) -> str | None:
    """Why `encoding` cannot decode CSV text, or None: an unknown name, or a codec that is not text."""
    try:
        info = codecs.lookup(encoding)
    except LookupError:
        return f"unknown text encoding {encoding!r} ({_EXAMPLES})"
    if not getattr(info, "_is_text_encoding", True):
        return f"{encoding!r} is not a text encoding ({_EXAMPLES})"
    return None


def is_utf8(encoding: str) -> bool:
    return codecs.lookup(encoding).name == "utf-8"


def label(encoding: str) -> str:
    """The name an error message shows: UTF-8 as people write it, any other as the user gave it."""
    return "UTF-8" if is_utf8(encoding) else encoding


def python_codec(encoding: str) -> str:
    """UTF-8 is read with or without the byte-order mark that spreadsheets (Excel's "CSV UTF-8") write first:
    read as plain UTF-8 it would stick to the first column's name, which then looks right but matches nothing."""
    return "utf-8-sig" if is_utf8(encoding) else encoding
