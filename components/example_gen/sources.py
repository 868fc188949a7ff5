"""Readers that keep each record's file and row, so every bad-input error can name them."""
from __future__ import annotations

import csv
import gzip
import io
import logging
import math
import os
import time
import zlib
from typing import Callable, Iterator, Sequence

import apache_beam as beam

from hpml.components import files as file_system
from hpml.components.errors import InputDataError, op_error_message
from hpml.components.example_gen.text_encoding import DEFAULT_ENCODING, is_utf8, label, python_codec
from hpml.components.zlib_streams import stream_problem

NAMESPACE = "hpml.example_gen"
log = logging.getLogger(NAMESPACE)

# How many skipped rows each reader names in the log; the rest are counted only.
LOGGED_BAD_ROWS = 5


# Column kinds, ordered from narrowest to widest; a column takes the widest kind it needs.
NONE, INT, FLOAT, BYTES = 0, 1, 2, 3
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_FLOAT32_MAX = 3.4028234663852886e38  # a tf.Example's float_list holds 32-bit floats


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
    return io.TextIOWrapper(_open_binary(path), newline="", encoding=python_codec(encoding),
                            errors="surrogateescape")


def _open_binary(path: str):
    """The file's bytes, decompressed where it is GZIP; local, or on an object store (gs://)."""
    if not file_system.is_url(path):
        return (gzip.open if _is_gzip(path) else open)(path, "rb")
    stream = file_system.open_stream(path)
    return gzip.GzipFile(fileobj=stream) if _is_gzip(path) else stream


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


# What reading a CSV file can raise besides our own errors: bad quoting, or a truncated or corrupted GZIP
# stream.
_READ_ERRORS = (csv.Error, EOFError, gzip.BadGzipFile, zlib.error)


def _file_not_decodable_hint(encoding: str) -> str:
    """For a whole file (its header) in another encoding: name the parameter that reads it as it is."""
    other = " (often latin-1 or cp1252, from older spreadsheets)" if is_utf8(encoding) else ""
    return f"set encoding to the file's own{other}, or save the file as UTF-8 CSV"


def _row_not_decodable_hint(encoding: str) -> str:
    """For a row: the whole file may be in another encoding under an ASCII header, or it mixes encodings."""
    if is_utf8(encoding):
        return "set encoding if the whole file is in another one (often latin-1 or cp1252), or save it as UTF-8 CSV"
    return f"check that the whole file is {encoding} text"


def _unreadable(path: str, line: int, err: Exception) -> InputDataError:
    """One clear error, naming the file (and line where it means something), for any of _READ_ERRORS."""
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
        except _READ_ERRORS as err:
            raise _unreadable(path, reader.line_num, err) from None
        except UnicodeError as err:  # a decoder that fails outright, e.g. UTF-16 without a byte-order mark
            raise InputDataError(f"{path}: not {label(encoding)} text ({err})",
                                 hint=_file_not_decodable_hint(encoding)) from None


def _check_header(path: str, reader, encoding: str) -> list[str]:
    header = next(reader, None)
    if not header or not any(h.strip() for h in header):
        raise InputDataError(f"{path}: the file is empty (no header row)")
    bad_bytes = undecodable(",".join(header))
    if bad_bytes:  # the whole file, most likely: UTF-16 ("Unicode text") or Latin-1
        raise InputDataError(f"{path}:{reader.line_num}: the header is not {label(encoding)} text ({bad_bytes})",
                             hint=_file_not_decodable_hint(encoding))
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


# Seconds between two progress lines of one stage; a stage done sooner logs none.
PROGRESS_EVERY_S = 15.0
_PROGRESS_CHECK_ROWS = 2048  # rows between two looks at the clock


class _Progress:
    """Logs how far a long ExampleGen stage is, at most every PROGRESS_EVERY_S: what it has done so far, its
    rate and, where `share` can tell, the share of the whole. A large input otherwise runs for minutes with no
    line in the task log."""

    def __init__(self, what: str, unit: str, share: Callable[[int], float] | None = None):
        self._what, self._unit, self._share = what, unit, share
        self._start = self._last = time.monotonic()

    def __call__(self, done: int) -> None:
        """Called with the count so far; cheap, so call it for every row."""
        if done % _PROGRESS_CHECK_ROWS:
            return
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        try:
            share = f" ({100 * min(self._share(done), 1.0):.0f}%)" if self._share else ""
        except (OSError, ValueError):  # a pipe has no position: the line goes without it
            share = ""
        seconds = now - self._start
        log.info("ExampleGen: %s: %s %s%s in %.0f s, %s %s/s", self._what, f"{done:,}", self._unit, share,
                 seconds, f"{done / seconds:,.0f}", self._unit)


def _share_of_file(path: str, text_handle) -> Callable[[int], float]:
    """How far through the file on disk a text handle from `open_csv` is: its bytes read (compressed, for a
    GZIP file, whose stream reads from `fileobj`) against the file's size."""
    binary = text_handle.buffer
    raw, size = getattr(binary, "fileobj", binary), file_system.size(path)
    return lambda _rows: raw.tell() / size if size else 1.0


class _SkippedRows:
    """Counts the rows skip_bad_rows drops, and logs the first LOGGED_BAD_ROWS with where and why: a count
    alone leaves the user to turn skipping off again to find them."""

    def __init__(self):
        self._counter = beam.metrics.Metrics.counter(NAMESPACE, "bad_rows")
        self._logged = 0

    def skip(self, where: str, problem: str) -> None:
        self._counter.inc()
        if self._logged < LOGGED_BAD_ROWS:
            self._logged += 1
            log.warning("skipped bad row %s: %s", where, problem)


def _parse(text: str) -> tuple[int, int | float | None]:
    """The narrowest kind that holds `text`, with its value: (INT, int), (FLOAT, float) or (BYTES, None). int()
    and float() also read '2023_01' as 202301 and non-ASCII digits as numbers; a CSV cell like that is text.
    Each stage parses a cell once with this: a number's kind and value come from the same parse."""
    if "_" in text or not text.isascii():
        return BYTES, None
    try:
        number = int(text)
    except ValueError:
        pass
    else:
        # An integer beyond 64 bits is text, as TFX's CSV decoder reads it: more often an id than a quantity.
        return (INT, number) if _INT64_MIN <= number <= _INT64_MAX else (BYTES, None)
    try:
        return FLOAT, float(text)
    except ValueError:
        return BYTES, None


def _unstorable(number: float, text: str) -> str | None:
    """Why a float cell (`number`, read from `text`) cannot go into a tf.Example, or None: an infinity, or a
    finite number beyond the range of float32, which a tf.Example stores as an infinity."""
    if math.isinf(number):
        return f"must hold a finite number, got {text!r}"
    if abs(number) > _FLOAT32_MAX:
        return f"holds {text!r}, beyond the ±3.4e38 range of the 32-bit floats a tf.Example stores"
    return None


def _not_a_number(text: str) -> str:
    """The problem with a text cell in a declared numeric column. A long integer reads as text (_parse)."""
    detail = ""
    if text.isascii() and "_" not in text:
        try:
            int(text)
            detail = " (an integer beyond 64 bits)"
        except ValueError:
            pass
    return f"must hold a number, got {text!r}{detail}"


def _column_kind_of(text: str) -> int:
    """The kind a cell asks of its column. NaN and unstorable numbers ask for no float: NaN is a missing
    value and an unstorable number's row is refused, so neither may widen a column of integers to floats."""
    kind, number = _parse(text)
    if kind == FLOAT and (math.isnan(number) or _unstorable(number, text)):
        return INT
    return kind


class ReadCsvRows(beam.DoFn):
    """Yields (file, line, {column: text or None}); a row of the wrong width, with bytes its encoding cannot
    decode, without a value in a required column, or with a non-number, an infinity or a number beyond float32
    in a numeric column, is an error or is skipped and counted."""

    def __init__(self, header: Sequence[str], na_values: Sequence[str], skip_bad_rows: bool,
                 required_columns: Sequence[str] = (), numeric_columns: Sequence[str] = (),
                 encoding: str = DEFAULT_ENCODING):
        self._header = list(header)
        self._encoding = encoding
        self._na = set(na_values)
        self._skip = skip_bad_rows
        self._required = list(required_columns)
        self._numeric = list(numeric_columns)
        self._numeric_names = set(numeric_columns)
        self._skipped = _SkippedRows()

    def _cells(self, fields: list[str]) -> tuple[dict, dict]:
        """The row's {column: text, or None where it is missing}, and {numeric column: its problem} (most
        rows: empty). Missing is one of na_values, or NaN in a numeric column: NaN is how pandas and numpy
        write a missing number, and kept as a value it would turn the column's mean (and every z-score
        computed from it) into NaN."""
        values, problems = {}, {}
        for name, text in zip(self._header, fields):
            text = text.strip()
            if text in self._na:
                text = None
            elif name in self._numeric_names:
                kind, number = _parse(text)
                if kind == BYTES:
                    problems[name] = _not_a_number(text)
                elif kind == FLOAT:
                    if math.isnan(number):
                        text = None
                    else:
                        problem = _unstorable(number, text)
                        if problem:
                            problems[name] = problem
            values[name] = text
        return values, problems

    def _undecodable(self, values: dict) -> str | None:
        """The first cell holding bytes the encoding cannot decode, as a problem; None when there is none."""
        for name, value in values.items():
            bad_bytes = value is not None and undecodable(value)
            if bad_bytes:
                return f"column {name!r} is not {label(self._encoding)} text ({bad_bytes})"
        return None

    def _problem(self, fields: list[str], values: dict, numeric_problems: dict) -> str | None:
        """What is wrong with a row, or None."""
        if len(fields) != len(self._header):
            return f"expected {len(self._header)} fields, got {len(fields)}"
        for name in self._required:
            if values[name] is None:
                return f"required column {name!r} has no value"
        if numeric_problems:
            name = next(n for n in self._numeric if n in numeric_problems)  # the first declared
            return f"column {name!r} {numeric_problems[name]}"
        return None

    def process(self, path: str) -> Iterator[tuple[str, int, dict]]:
        with open_csv(path, self._encoding) as handle:
            reader = csv.reader(handle)
            progress = _Progress(f"{path}: read", "rows", _share_of_file(path, handle))
            try:
                next(reader)  # header, validated up front
                for rows, fields in enumerate(reader, start=1):
                    progress(rows)
                    line = reader.line_num
                    if not fields:
                        continue  # a blank line
                    values, numeric_problems = self._cells(fields)
                    bad_bytes = None if "".join(fields).isascii() else self._undecodable(values)  # ASCII: 0.13 µs
                    problem = bad_bytes or self._problem(fields, values, numeric_problems)
                    if problem is not None:
                        if self._skip:
                            self._skipped.skip(f"{path}:{line}", problem)
                            continue
                        fix = _row_not_decodable_hint(self._encoding) if bad_bytes else "fix the row"
                        raise InputDataError(f"{path}:{line}: {problem}", hint=f"{fix}, or set skip_bad_rows=true")
                    yield path, line, values
            except _READ_ERRORS as err:
                raise _unreadable(path, reader.line_num, err) from None
            except UnicodeError as err:  # a decoder that fails outright, e.g. UTF-16 cut short
                raise InputDataError(
                    f"{path}: not {label(self._encoding)} text after line {reader.line_num} ({err})",
                    hint=_file_not_decodable_hint(self._encoding)) from None


class ColumnKinds(beam.CombineFn):
    """The narrowest kind (int, float or bytes) that holds every non-missing, finite value of each column."""

    def __init__(self, header: Sequence[str]):
        self._header = list(header)

    def create_accumulator(self):
        return [NONE] * len(self._header)

    def add_input(self, acc, row):
        _, _, values = row
        for i, name in enumerate(self._header):
            value = values[name]
            if value is not None and acc[i] != BYTES:
                acc[i] = max(acc[i], _column_kind_of(value))
        return acc

    def merge_accumulators(self, accs):
        merged = self.create_accumulator()
        for acc in accs:
            merged = [max(a, b) for a, b in zip(merged, acc)]
        return merged

    def extract_output(self, acc):
        return dict(zip(self._header, acc))


class CsvRowsToExamples(beam.DoFn):
    """A typed tf.Example per row; a missing value leaves its feature out, as TFX's CSV decoder does.

    In a column read as numbers, NaN is missing too, declared numeric or not: pandas writes a missing
    number as NaN, and one NaN value turns tf.Transform's mean of the column, and every z-score from it,
    into NaN. An infinity there does the same, as does a number beyond float32, which a tf.Example stores as
    one; neither is a missing value: its row is bad, an error or skipped and counted. ReadCsvRows already
    refused it in a declared numeric column; the others are only known to hold numbers once every row has
    been read, so it is checked here.
    """

    def __init__(self, skip_bad_rows: bool):
        self._skip = skip_bad_rows
        self._skipped = _SkippedRows()
        self._progress, self._done = None, 0

    def process(self, row, kinds: dict, total_rows: int) -> Iterator[tuple[str, int, bytes]]:
        import tensorflow as tf

        if self._progress is None:  # one per DoFn instance: the rows this worker converts
            self._progress = _Progress("converted to tf.Examples", "rows", lambda done: done / total_rows)
        self._done += 1
        self._progress(self._done)
        path, line, values = row
        example = tf.train.Example()
        for name, text in values.items():
            if text is None:
                continue
            kind = kinds[name]
            if kind == BYTES:
                example.features.feature[name].bytes_list.value.append(text.encode("utf-8"))
                continue
            if kind == INT:
                try:
                    integer = int(text)
                except ValueError:  # a column of integers also holds NaN, and floats too large to store
                    integer = None
                if integer is not None:  # looked up only now: the lookup alone adds the feature
                    example.features.feature[name].int64_list.value.append(integer)
                    continue
            number = float(text)
            if math.isnan(number):
                continue
            problem = _unstorable(number, text)
            if problem:
                problem = f"column {name!r} {problem}"
                if self._skip:
                    self._skipped.skip(f"{path}:{line}", problem)
                    return
                raise InputDataError(f"{path}:{line}: {problem}", hint="fix the row, or set skip_bad_rows=true")
            example.features.feature[name].float_list.value.append(number)
        # Deterministic: map order would otherwise vary per process, and the hash split with it.
        yield path, line, example.SerializeToString(deterministic=True)


class ReadTFRecordExamples(beam.DoFn):
    """Yields (file, record index, serialized tf.Example) from plain or GZIP TFRecord files."""

    def __init__(self, skip_bad_rows: bool, required_features: Sequence[str] = (),
                 numeric_features: Sequence[str] = ()):
        self._skip = skip_bad_rows
        self._required = list(required_features)
        self._numeric = list(numeric_features)
        self._skipped = _SkippedRows()

    def _problem(self, record: bytes) -> str | None:
        """What is wrong with a record, or None: not a tf.Example, no value in a required feature, bytes in
        a declared numeric one, or NaN or an infinity in any float feature (declared or not, as in CSV)."""
        import tensorflow as tf

        try:
            example = tf.train.Example.FromString(record)
        except Exception:  # noqa: BLE001 - any decode failure is the same bad record
            return "not a tf.Example"
        for name in self._required:
            feature = example.features.feature.get(name)
            kind = feature.WhichOneof("kind") if feature is not None else None
            if kind is None or not getattr(feature, kind).value:
                return f"required feature {name!r} has no value"
        for name in self._numeric:
            feature = example.features.feature.get(name)
            if feature is not None and feature.WhichOneof("kind") == "bytes_list":
                return f"feature {name!r} must hold numbers, got bytes_list {list(feature.bytes_list.value)[:3]!r}"
        for name, feature in sorted(example.features.feature.items()):
            if not all(math.isfinite(v) for v in feature.float_list.value):
                # A NaN turns the feature's mean, and every z-score from it, into NaN; a tf.Example says
                # "missing" by leaving the feature out.
                return (f"feature {name!r} must hold finite numbers, got {list(feature.float_list.value)[:3]!r} "
                        "(leave the feature out where its value is missing)")
        return None

    def process(self, path: str):
        import tensorflow as tf

        compression = "GZIP" if _is_gzip(path) else ""
        index = 0
        progress = _Progress(f"{path}: read", "records")
        try:
            for record in tf.data.TFRecordDataset(path, compression_type=compression).as_numpy_iterator():
                index += 1
                progress(index)
                problem = self._problem(record)
                if problem is not None:
                    if self._skip:
                        self._skipped.skip(f"{path}: record {index}", problem)
                        continue
                    raise InputDataError(
                        f"{path}: record {index}: {problem}", hint="fix the file, or set skip_bad_rows=true"
                    )
                yield path, index, record
        except tf.errors.DataLossError as err:
            if index == 0 and not looks_like_tfrecord(path):
                with _open_binary(path) as handle:
                    start = handle.read(24).decode("utf-8", "replace")
                raise InputDataError(f"{path}: not a TFRecord file (it starts with {start!r})",
                                     hint="ExampleGen reads CSV files with input_format='csv'") from None
            raise InputDataError(f"{path}: corrupted TFRecord after record {index} ({op_error_message(err)})") from None
        if compression:
            # TF's GZIP reader stops at the last whole record and never reads the trailer, so a file cut in
            # its last bytes would pass for a complete one.
            problem = stream_problem(path, "GZIP")
            if problem is not None:
                raise InputDataError(f"{path}: corrupted GZIP data after record {index} ({problem})",
                                     hint="the file was probably cut short in a copy or upload; copy it again")


def _is_gzip(path: str) -> bool:
    with file_system.open_stream(path) as handle:
        return handle.read(2) == b"\x1f\x8b"


def looks_like_tfrecord(path: str) -> bool:
    """Whether the file (GZIP or not) opens with TFRecord framing: an 8-byte little-endian length and a 4-byte
    CRC, that many bytes and a 4-byte CRC, then either the end or the next record's length. Text never
    passes: with no zero byte in its first 8, they read as a length of at least 2**56."""
    try:
        with _open_binary(path) as handle:
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
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rb") as handle:
        return bool(handle.read(1))
