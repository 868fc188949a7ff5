"""A CSV file's header row, checked before any Beam work so that an empty or unreadable file fails fast, and the
errors that name what is wrong with one."""
from __future__ import annotations

import csv
import gzip
import zlib
from collections.abc import Sequence

from hpml.components.errors import InputDataError
from hpml.components.example_gen.inputs import looks_like_tfrecord, open_csv, undecodable
from hpml.components.example_gen.text_encoding import DEFAULT_ENCODING, is_utf8, label


# What reading a CSV file can raise besides our own errors: bad quoting, or a truncated or corrupted GZIP
# stream.
READ_ERRORS = (csv.Error, EOFError, gzip.BadGzipFile, zlib.error)


def file_not_decodable_hint(encoding: str) -> str:
    """For a whole file (its header) in another encoding: name the parameter that reads it as it is."""
    other = " (often latin-1 or cp1252, from older spreadsheets)" if is_utf8(encoding) else ""
    return f"set encoding to the file's own{other}, or save the file as UTF-8 CSV"


def row_not_decodable_hint(encoding: str) -> str:
    """For a row: the whole file may be in another encoding under an ASCII header, or it mixes encodings."""
    if is_utf8(encoding):
        return "set encoding if the whole file is in another one (often latin-1 or cp1252), or save it as UTF-8 CSV"
    return f"check that the whole file is {encoding} text"


def unreadable(path: str, line: int, err: Exception) -> InputDataError:
    """One clear error, naming the file (and line where it means something), for any of READ_ERRORS."""
    if isinstance(err, csv.Error):
        return InputDataError(f"{path}:{line}: malformed CSV ({err})")
    return InputDataError(f"{path}: corrupted GZIP data after line {line} ({err})")


def read_csv_header(path: str, encoding: str = DEFAULT_ENCODING) -> list[str]:
    """The header row, checked before any Beam work so an empty or unreadable file fails fast."""
    if looks_like_tfrecord(path):
        raise InputDataError(f"{path}: a TFRecord file, not CSV",
                             hint="ExampleGen reads TFRecord files with input_format='tfrecord'")
    with open_csv(path, encoding) as handle:
        reader = csv.reader(handle)
        try:
            return _check_header(path, reader, encoding)
        except READ_ERRORS as err:
            raise unreadable(path, reader.line_num, err) from None
        except UnicodeError as err:  # a decoder that fails outright, e.g. UTF-16 without a byte-order mark
            raise InputDataError(f"{path}: not {label(encoding)} text ({err})",
                                 hint=file_not_decodable_hint(encoding)) from None


def _check_header(path: str, reader, encoding: str) -> list[str]:
    header = next(reader, None)
    if not header or not any(h.strip() for h in header):
        raise InputDataError(f"{path}: the file is empty (no header row)")
    bad_bytes = undecodable(",".join(header))
    if bad_bytes:  # the whole file, most likely: UTF-16 ("Unicode text") or Latin-1
        raise InputDataError(f"{path}:{reader.line_num}: the header is not {label(encoding)} text ({bad_bytes})",
                             hint=file_not_decodable_hint(encoding))
    names = [h.strip() for h in header]
    unnamed = [i + 1 for i, n in enumerate(names) if not n]
    if unnamed:
        raise InputDataError(f"{path}:1: {_unnamed_columns(unnamed)}", hint=_unnamed_hint(unnamed, len(names)))
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InputDataError(f"{path}:1: duplicate column name(s) {', '.join(duplicates)}")
    if next(reader, None) is None:
        raise InputDataError(f"{path}: the file has a header but no data rows")
    return names


def _unnamed_columns(positions: list[int]) -> str:
    if len(positions) == 1:
        return f"column {positions[0]} has no name"
    return f"columns {', '.join(map(str, positions[:-1]))} and {positions[-1]} have no name"


def _unnamed_hint(positions: list[int], width: int) -> str:
    """The usual causes: pandas' to_csv() writes its index as an unnamed first column, and a spreadsheet
    export can end every row with a comma."""
    causes = []
    if positions[0] == 1:
        causes.append("a first column without a name is how pandas writes its index: write the file with "
                      "to_csv(index=False)")
    if positions[-1] == width:
        causes.append("a last column without a name comes from a comma at the end of the header row")
    return "; ".join(causes) or "name every column in the header row"


def describe_header(header: Sequence[str]) -> str:
    """The columns a header names, for an error's hint; a lone column holding a `;`, tab or `|` is a file
    written with another separator (European Excel writes `;`), which ExampleGen reads as one column."""
    text = f"the columns are: {', '.join(header)}"
    if len(header) == 1:
        separator = next((s for s in (";", "\t", "|") if s in header[0]), None)
        if separator:
            text += f"; the file looks {separator!r}-separated, and ExampleGen reads comma-separated CSV"
    return text


def header_difference(header: Sequence[str], reference: Sequence[str]) -> str:
    """How `header` differs from `reference`: the first column that differs, or the column counts."""
    if len(header) != len(reference):
        return f"it has {len(header)} column(s), not {len(reference)} ({', '.join(reference)})"
    index = next(i for i, (a, b) in enumerate(zip(header, reference)) if a != b)
    return f"column {index + 1} is {header[index]!r}, not {reference[index]!r}"


