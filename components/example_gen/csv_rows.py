"""CSV rows one at a time, in Python: the rules for what a cell holds and what makes a row bad, and the path that
names the file, line and column of every bad row. ExampleGen reads a chunk of rows this way only where the
column-at-a-time path (`csv_cells`) found a bad row in it, or where the file's encoding is not ASCII-compatible.
"""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Mapping, Sequence

from hpml.components.errors import InputDataError
from hpml.components.example_gen.csv_header import READ_ERRORS, file_not_decodable_hint, row_not_decodable_hint, \
    unreadable
from hpml.components.example_gen.inputs import undecodable
from hpml.components.example_gen.progress import SkippedRows
from hpml.components.example_gen.text_encoding import label

# Column kinds, ordered from narrowest to widest; a column takes the widest kind it needs.
NONE, INT, FLOAT, BYTES = 0, 1, 2, 3
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
FLOAT32_MAX = 3.4028234663852886e38  # a tf.Example's float_list holds 32-bit floats


def parse(text: str) -> tuple[int, int | float | None]:
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
        return (INT, number) if INT64_MIN <= number <= INT64_MAX else (BYTES, None)
    try:
        return FLOAT, float(text)
    except ValueError:
        return BYTES, None


def unstorable(number: float, text: str) -> str | None:
    """Why a float cell (`number`, read from `text`) cannot go into a tf.Example, or None: an infinity, or a
    finite number beyond the range of float32, which a tf.Example stores as an infinity."""
    if math.isinf(number):
        return f"must hold a finite number, got {text!r}"
    if abs(number) > FLOAT32_MAX:
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


def column_kind_of(text: str) -> int:
    """The kind a cell asks of its column. NaN and unstorable numbers ask for no float: NaN is a missing
    value and an unstorable number's row is refused, so neither may widen a column of integers to floats."""
    kind, number = parse(text)
    if isinstance(number, float) and (math.isnan(number) or unstorable(number, text)):  # kind FLOAT
        return INT
    return kind




class RowRules:
    """What makes a CSV row bad: a row of the wrong width, with bytes its encoding cannot decode, without a value
    in a required column, or with a non-number, an infinity or a number beyond float32 in a numeric column (the
    read rules); and, once the column kinds are known, an infinity or a number beyond float32 in any column read as
    numbers (the conversion rule)."""

    def __init__(self, header: Sequence[str], na_values: Sequence[str], required_columns: Sequence[str],
                 numeric_columns: Sequence[str], encoding: str):
        self._header = list(header)
        self.encoding = encoding
        self._na = set(na_values)
        self._required = list(required_columns)
        self._numeric = list(numeric_columns)
        self._numeric_names = set(numeric_columns)

    def _cells(self, fields: list[str]) -> tuple[dict, dict]:
        """The row's {column: text, or None where it is missing}, and {numeric column: its problem} (most
        rows: empty). Missing is one of na_values, or NaN in a numeric column: NaN is how pandas and numpy
        write a missing number, and kept as a value it would turn the column's mean (and every z-score
        computed from it) into NaN."""
        values: dict[str, str | None] = {}
        problems: dict[str, str] = {}
        for name, field in zip(self._header, fields):
            stripped = field.strip()
            text: str | None = stripped
            if stripped in self._na:
                text = None
            elif name in self._numeric_names:
                kind, number = parse(stripped)
                if kind == BYTES:
                    problems[name] = _not_a_number(stripped)
                elif isinstance(number, float):  # kind FLOAT
                    if math.isnan(number):
                        text = None
                    else:
                        problem = unstorable(number, stripped)
                        if problem:
                            problems[name] = problem
            values[name] = text
        return values, problems

    def _undecodable(self, values: dict) -> str | None:
        """The first cell holding bytes the encoding cannot decode, as a problem; None when there is none."""
        for name, value in values.items():
            bad_bytes = value is not None and undecodable(value)
            if bad_bytes:
                return f"column {name!r} is not {label(self.encoding)} text ({bad_bytes})"
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

    def _nul(self, fields: list[str]) -> str:
        """The first field holding a NUL character, as a problem: a NUL is never text, and most often the mark of
        a binary file or a file in another encoding read as this one."""
        number = next(i for i, text in enumerate(fields) if "\x00" in text)
        where = f"column {self._header[number]!r}" if number < len(self._header) else f"field {number + 1}"
        return f"{where} holds a NUL byte (\\x00)"

    def read(self, fields: list[str]) -> tuple[dict, str | None, str]:
        """The row's {column: text or None}, what is wrong with it by the read rules (or None), and how to fix
        that."""
        values, numeric_problems = self._cells(fields)
        joined = "".join(fields)
        bad_bytes = None if joined.isascii() else self._undecodable(values)  # ASCII: 0.13 µs
        if bad_bytes:
            return values, bad_bytes, row_not_decodable_hint(self.encoding)
        if "\x00" in joined:
            return values, self._nul(fields), "check the file: NUL bytes mean binary data, or text in an encoding " \
                "like UTF-16 read as another (set encoding)"
        return values, self._problem(fields, values, numeric_problems), "fix the row"

    @staticmethod
    def convert(values: Mapping[str, str | None], kinds: Mapping[str, int]) -> str | None:
        """What is wrong with a row whose kinds are known: an infinity, or a number beyond float32, in a column
        read as numbers. NaN there is a missing value, not a problem."""
        for name, text in values.items():
            if text is None or kinds[name] not in (INT, FLOAT):
                continue
            kind, number = parse(text)
            if isinstance(number, float) and not math.isnan(number):  # kind FLOAT
                problem = unstorable(number, text)
                if problem:
                    return f"column {name!r} {problem}"
        return None


def _unclosed_quote(lines: list[str], first: int, last: int) -> int | None:
    """The line (1-based, of `lines`) where a quote opens that the record on lines first..last never closes, or
    None when the record is not the text's last or its quotes close: the quote after which the count of quote
    characters stays odd."""
    if last != len(lines):
        return None
    opened, odd = None, False
    for number in range(first, last + 1):
        was_odd, odd = odd, odd ^ (lines[number - 1].count('"') % 2 == 1)
        if odd and not was_odd:
            opened = number
    return opened if odd else None


def checked_rows(text: str, path: str, lines_before: int, rules: RowRules, skip_bad_rows: bool,
                 skipped: SkippedRows | None, kinds: Mapping[str, int] | None = None) -> Iterator[tuple[int, dict]]:
    """(line, values) of each good row of a chunk of CSV text (whole records) whose first line is line
    `lines_before` + 1 of `path`. A bad row is an error naming file, line and problem, or is skipped, and
    counted and logged when `skipped` is given. With `kinds`, the conversion rule applies too. A quote that
    never closes is named at the line where it opened, not at the end of the file, where the reader stops."""
    reader = csv.reader(io.StringIO(text, newline=""))
    # An odd count of quotes: the text ends inside a quoted value. Its lines find where that value opened.
    lines = io.StringIO(text, newline="").readlines() if text.count('"') % 2 else None
    record_start = 1
    try:
        for fields in reader:
            first, record_start = record_start, reader.line_num + 1
            line = lines_before + reader.line_num
            if not fields:
                continue  # a blank line
            values, problem, fix = rules.read(fields)
            if problem is None and kinds is not None:
                problem = rules.convert(values, kinds)
            opened = _unclosed_quote(lines, first, reader.line_num) if lines else None
            if opened is not None:
                line, last = lines_before + opened, lines_before + reader.line_num
                problem = "a quoted value opened on this line is never closed" + \
                    (f", so lines {line}-{last} read as one row" if last > line else "")
                fix = 'close the quote (a quote inside a quoted value is written twice: "")'
            if problem is None:
                yield line, values
                continue
            if skip_bad_rows:
                if skipped is not None:
                    skipped.skip(f"{path}:{line}", problem)
                continue
            raise InputDataError(f"{path}:{line}: {problem}", hint=f"{fix}, or set skip_bad_rows=true")
    except READ_ERRORS as err:
        raise unreadable(path, lines_before + reader.line_num, err) from None
    except UnicodeError as err:  # a decoder that fails outright, e.g. UTF-16 cut short
        raise InputDataError(f"{path}: not {label(rules.encoding)} text after line {lines_before + reader.line_num} "
                             f"({err})", hint=file_not_decodable_hint(rules.encoding)) from None
