"""ExampleGen's input files: which files a path names, how to open them (plain or GZIP, local or gs://), and what
kind of file each one is."""
from __future__ import annotations

import gzip
import io
import os
import zlib

from hpml.components import files as file_system
from hpml.components.errors import InputDataError
from hpml.components.example_gen.text_encoding import DEFAULT_ENCODING, python_codec


def expand_inputs(pattern: str) -> list[str]:
    """The input files for a path, directory or glob; a clear error when there are none. A directory's
    hidden and `_`-prefixed files (`.DS_Store`, Spark's `_SUCCESS`, `.crc` checksums) are not data, as in
    Hadoop's input formats; a glob is taken as written."""
    if file_system.isdir(pattern):
        files = [p for p in file_system.glob(os.path.join(pattern, "*"))
                 if file_system.isfile(p) and not os.path.basename(p).startswith("_")]
    else:
        files = file_system.glob(pattern)
        folders = [p for p in files if file_system.isdir(p)]
        if folders:  # a Spark output such as data.csv/ is a directory: open() would fail on it, unexplained
            raise InputDataError(f"{folders[0]}: a directory, matched by {pattern}",
                                 hint="give the directory itself as the input path to read its files, or a glob "
                                      "that matches files only")
    if not files:
        raise InputDataError(f"no input files match {pattern}", hint="check the data path")
    return files


def open_csv(path: str, encoding: str = DEFAULT_ENCODING):
    """A CSV file as text, GZIP-compressed (Spark's `.csv.gz` parts) or not: the magic bytes decide. Bytes
    the encoding cannot decode come through as lone surrogates (see `undecodable`), so the row holding them can
    be named and, like any bad row, skipped: a strict decoder fails a whole 8 KB block, at no particular line."""
    return io.TextIOWrapper(open_binary(path), newline="", encoding=python_codec(encoding),
                            errors="surrogateescape")


def open_binary(path: str):
    """The file's bytes, decompressed where it is GZIP; local, or on an object store (gs://)."""
    if not file_system.is_url(path):
        return (gzip.open if is_gzip(path) else open)(path, "rb")
    stream = file_system.open_stream(path)
    return gzip.GzipFile(fileobj=stream) if is_gzip(path) else stream


def undecodable(text: str) -> str | None:
    """Where `text` (read by `open_csv`) holds a byte its encoding could not decode, that byte and what precedes
    it, e.g. "byte 0xe9 after 'Dr'"; None for proper text. ASCII, by far the common case, costs one C-level
    check."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        byte = ord(text[err.start]) - 0xDC00
        return f"byte 0x{byte:02x} after {text[:err.start][-20:]!r}" if err.start else f"byte 0x{byte:02x}"
    return None


def is_gzip(path: str) -> bool:
    with file_system.open_stream(path) as handle:
        return handle.read(2) == b"\x1f\x8b"


def looks_like_tfrecord(path: str) -> bool:
    """Whether the file (GZIP or not) opens with TFRecord framing: an 8-byte little-endian length and a 4-byte
    CRC, that many bytes and a 4-byte CRC, then either the end or the next record's length. Text never
    passes: with no zero byte in its first 8, they read as a length of at least 2**56."""
    try:
        with open_binary(path) as handle:
            head = handle.read(12)
            if len(head) < 12:
                return False
            length = int.from_bytes(head[:8], "little")
            if not 0 < length < 1 << 31:
                return False
            body = handle.read(length + 4)
            after = handle.read(8)
    except (OSError, EOFError, zlib.error):
        return False
    return len(body) == length + 4 and len(after) in (0, 8)


def has_any_record(path: str) -> bool:
    with open_binary(path) as handle:
        return bool(handle.read(1))
