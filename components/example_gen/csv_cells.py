"""What CSV cells hold, column at a time in Arrow kernels: the fast path of ExampleGen's CSV reading.

The rules are those of `csv_rows` (the per-row path, which names the row and says what is wrong), written as
regular expressions over whole columns: a cell is an integer, a number, NaN, an infinity or text exactly where
`csv_rows.parse` says so. Where a chunk holds any bad row, the caller re-reads it through `csv_rows`.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hpml.components.example_gen.csv_rows import BYTES, FLOAT, FLOAT32_MAX, INT, INT64_MAX, INT64_MIN, NONE

# What Python's int() and float() read, less underscores and non-ASCII digits (which `csv_rows.parse` calls text).
_INT = r"^[+-]?[0-9]+$"
_DECIMAL = r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_NAN = r"^[+-]?(?i:nan)$"
_INFINITY = r"^[+-]?(?i:inf|infinity)$"
# Integers at least this large in magnitude are checked one by one against the 64-bit range (rare).
_NEAR_INT64_LIMIT = 9.2e18


def _mask(array: pa.Array) -> np.ndarray:
    """A boolean Arrow array as numpy, null as False."""
    return array.fill_null(False).to_numpy(zero_copy_only=False)


@dataclass
class Cells:
    """One column's cells (trimmed; missing ones null), classified. Every mask is a numpy bool array."""

    text: pa.Array
    present: np.ndarray
    integer: np.ndarray  # an integer within 64 bits
    decimal: np.ndarray  # a number that is not such an integer (a fraction, an exponent, or a long integer)
    nan: np.ndarray
    infinity: np.ndarray  # 'inf' or 'infinity', or a decimal beyond float64 ('1e400')
    beyond_float32: np.ndarray  # a finite decimal beyond ±3.4e38
    long_integer: np.ndarray  # integer digits beyond 64 bits: text, as TFX reads them
    numbers: np.ndarray  # float64 of every integer or decimal (0 elsewhere)

    @property
    def text_cell(self) -> np.ndarray:
        """Cells that hold no number: text, in a column read as numbers a bad row."""
        return self.present & ~(self.integer | self.decimal | self.nan | self.infinity) | self.long_integer

    @property
    def unstorable(self) -> np.ndarray:
        """Numbers that a tf.Example cannot hold: infinities and numbers beyond float32."""
        return self.infinity | self.beyond_float32

    def kind(self) -> int:
        """The narrowest kind that holds every cell, as `csv_rows.column_kind_of` decides it per cell."""
        if not self.present.any():
            return NONE
        if self.text_cell.any():
            return BYTES
        if (self.decimal & ~self.unstorable).any():
            return FLOAT
        return INT


_ASCII_STRIP_EXTRA = (b"\x1c", b"\x1d", b"\x1e", b"\x1f")  # str.strip() removes these ASCII separators too


def trimmed(text: pa.Array, na_values: Sequence[str], ascii_only: bool = False) -> pa.Array:
    """Cells without surrounding white space (as str.strip() removes it), missing ones (`na_values`) null.
    `ascii_only`: the caller knows the cells hold only ASCII without separator controls, so the cheaper ASCII trim
    is the same as str.strip()."""
    text = pc.ascii_trim_whitespace(text) if ascii_only else pc.utf8_trim_whitespace(text)
    missing = None
    for value in na_values:  # one comparison per value: a hash lookup costs more for the usual "" and "NA"
        equal = pc.equal(pc.binary_length(text), 0) if value == "" else pc.equal(text, value)
        missing = equal if missing is None else pc.or_(missing, equal)
    return text if missing is None else pc.if_else(missing, pa.scalar(None, pa.string()), text)


def ascii_without_separators(data: bytes) -> bool:
    """Whether a chunk's bytes are ASCII without the controls that str.strip() also strips."""
    return data.isascii() and not any(control in data for control in _ASCII_STRIP_EXTRA)


def classify(text: pa.Array) -> Cells:
    """Classifies trimmed cells (missing ones null) by what they hold."""
    present = _mask(text.is_valid())
    integer = _mask(pc.match_substring_regex(text, _INT))
    decimal = _mask(pc.match_substring_regex(text, _DECIMAL)) & ~integer
    numbers = np.zeros(len(text))
    numeric = integer | decimal
    if numeric.any():
        plain = pc.if_else(pa.array(numeric), text, pa.scalar("0"))
        numbers = pc.cast(plain, pa.float64()).to_numpy(zero_copy_only=False)
    long_integer = np.zeros(len(text), dtype=bool)
    near = integer & (np.abs(numbers) >= _NEAR_INT64_LIMIT)
    if near.any():  # error-path rarity: a handful of cells near 2**63, checked exactly
        for index in np.flatnonzero(near):
            value = int(text[int(index)].as_py())
            long_integer[index] = not INT64_MIN <= value <= INT64_MAX
        integer = integer & ~long_integer
    with np.errstate(invalid="ignore"):
        overflow = decimal & np.isinf(numbers)
        beyond = decimal & ~overflow & (np.abs(numbers) > FLOAT32_MAX)
    nan = _mask(pc.match_substring_regex(text, _NAN)) if (present & ~numeric).any() else np.zeros_like(present)
    infinity = (_mask(pc.match_substring_regex(text, _INFINITY)) if (present & ~numeric).any()
                else np.zeros_like(present)) | overflow
    return Cells(text, present, integer, decimal, nan, infinity, beyond, long_integer, numbers)


def values_of_kind(cells: Cells, kind: int) -> tuple[pa.Array, np.ndarray]:
    """The column as a tf.Example stores it for `kind` (nulls where the feature is left out), and the rows it
    makes bad: an infinity or a number beyond float32 in a column read as numbers. NaN there is missing."""
    if kind == BYTES:
        return cells.text.cast(pa.binary()), np.zeros(len(cells.present), dtype=bool)
    bad = cells.present & cells.unstorable
    if kind == INT:
        keep = cells.integer
        digits = pc.replace_substring_regex(cells.text, r"^\+", "")  # int() reads '+2'; Arrow's cast does not
        values = pc.cast(pc.if_else(pa.array(keep), digits, pa.scalar("0")), pa.int64())
    else:  # FLOAT: float64 first, then float32, as Python's float() and protobuf's float_list do
        keep = (cells.integer | cells.decimal) & ~cells.unstorable
        values = pa.array(cells.numbers.astype(np.float32))
    return pc.if_else(pa.array(keep), values, pa.scalar(None, values.type)), bad


_EXACT_IN_FLOAT64 = 2.0 ** 53


def convert(text: pa.Array, kind: int) -> tuple[pa.Array, np.ndarray] | None:
    """`values_of_kind` for a chunk whose read rules held, by a direct cast: every cell of a column read as numbers
    is a number, NaN or an infinity (any other cell would have made it text), so no pattern need be matched. None
    where the cast refuses a cell (a spelling of NaN or infinity Arrow does not read): `classify` then decides."""
    if kind == BYTES:
        return text.cast(pa.binary()), np.zeros(len(text), dtype=bool)
    try:
        numbers = pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        return None
    present = _mask(text.is_valid())
    with np.errstate(invalid="ignore"):
        nan = np.isnan(numbers) & present
        magnitude = np.abs(np.where(present & ~nan, numbers, 0.0))
    bad = present & ~nan & (magnitude > FLOAT32_MAX)  # infinities too
    keep = present & ~nan & ~bad
    if kind == FLOAT:
        values = pa.array(numbers.astype(np.float32), mask=~keep)
    elif (magnitude < _EXACT_IN_FLOAT64).all():  # integers below 2**53: the float64 is exact
        values = pa.array(np.where(keep, numbers, 0).astype(np.int64), mask=~keep)
    else:
        return None
    return values, bad


def widened_kind(text: pa.Array, so_far: int) -> int:
    """The kind of a column that was `so_far` before these trimmed cells: `classify(text).kind()` widened, with
    one pattern matched where the cells keep the kind (all integers of at most 18 digits, or all plain numbers)."""
    if so_far == BYTES:
        return BYTES
    present = _mask(text.is_valid())
    if not present.any():
        return so_far
    short = (pc.binary_length(text).to_numpy(zero_copy_only=False) <= 18)[present].all()
    if so_far <= INT and short and _mask(pc.match_substring_regex(text, _INT))[present].all():
        return INT
    if so_far == FLOAT and short and _mask(pc.match_substring_regex(text, _DECIMAL))[present].all():
        return FLOAT
    return max(so_far, classify(text).kind())
