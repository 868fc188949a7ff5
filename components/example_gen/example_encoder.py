"""Typed Arrow columns -> serialized tf.Examples, built in native code (Arrow kernels and numpy), no per-row Python.

Each column holds at most one value a row (a CSV cell). The bytes are those of protobuf's deterministic
serialization of a `tf.train.Example` whose missing values are left out: features in the order protobuf sorts its
map keys (which puts 'f10' before 'f1': not plain byte order, so protobuf itself is asked), single values in packed
lists. tfx_bsl's `RecordBatchToExamples` is not used because it writes a null
as an empty feature, which changes what readers see; this writes what ExampleGen has always written.

Wire format (field numbers from example.proto and feature.proto):
    Example   := 0x0A len Features
    Features  := (0x0A len MapEntry)*            map<string, Feature> feature = 1
    MapEntry  := 0x0A len key  0x12 len Feature
    Feature   := 0x0A len BytesList | 0x12 len FloatList | 0x1A len Int64List
    XList     := 0x0A len payload                 bytes: the value; float: 4 bytes LE; int64: a varint
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_MAX_VARINT = 10


def varint(value: int) -> bytes:
    """One non-negative integer as a protobuf varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    """How many bytes each uint64 takes as a varint (1 to 10)."""
    lengths = np.ones(len(values), dtype=np.int64)
    for k in range(1, _MAX_VARINT):
        lengths += values >= np.uint64(1 << (7 * k))
    return lengths


def varints(values: np.ndarray) -> pa.Array:
    """uint64 values -> a binary array of their varints."""
    values = values.astype(np.uint64, copy=False)
    lengths = _varint_lengths(values)
    width = int(lengths.max()) if len(values) else 1
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    groups = ((values[:, None] >> shifts[None, :]) & np.uint64(0x7F)).astype(np.uint8)
    position = np.arange(width)[None, :]
    groups |= np.where(position < (lengths[:, None] - 1), 0x80, 0).astype(np.uint8)
    data = groups[position < lengths[:, None]]  # row-major: each row's bytes, rows in order
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _lengths(array: pa.Array) -> np.ndarray:
    return pc.binary_length(array).to_numpy(zero_copy_only=False).astype(np.int64)


def _join(*parts) -> pa.Array:
    return pc.binary_join_element_wise(*parts, b"")


def _key_prefix(name: str) -> bytes:
    key = name.encode("utf-8")
    return b"\x0a" + varint(len(key)) + key


def _float_entries(name: str, values: pa.Array) -> pa.Array:
    """float32 values (nulls kept as nulls) -> map entries, all of one length."""
    feature = b"\x12\x06\x0a\x04"  # float_list, 6 bytes: packed field 1 of 4 bytes
    entry = _key_prefix(name) + b"\x12" + varint(len(feature) + 4) + feature
    prefix = b"\x0a" + varint(len(entry) + 4) + entry
    raw = np.ascontiguousarray(values.fill_null(0).to_numpy(zero_copy_only=False), dtype="<f4").view(np.uint8)
    fixed = pa.Array.from_buffers(pa.binary(4), len(values), [None, pa.py_buffer(raw)])
    return _join(pa.scalar(prefix, pa.binary()), fixed.cast(pa.binary()))


def _int_entries(name: str, values: pa.Array) -> pa.Array:
    """int64 values -> map entries; a varint's length (1 to 10 bytes) decides each entry's prefix."""
    numbers = values.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
    payload = varints(numbers)
    key = _key_prefix(name)
    prefixes = []
    for length in range(1, _MAX_VARINT + 1):
        int_list = 1 + 1 + length  # 0x0A, its length, the varint
        feature = b"\x1a" + varint(int_list) + b"\x0a" + varint(length)
        entry_len = len(key) + 1 + len(varint(len(feature) + length)) + len(feature) + length
        prefixes.append(b"\x0a" + varint(entry_len) + key + b"\x12" + varint(len(feature) + length) + feature)
    chosen = pa.array(prefixes, pa.binary()).take(pa.array(_varint_lengths(numbers) - 1))
    return _join(chosen, payload)


def _bytes_entries(name: str, values: pa.Array) -> pa.Array:
    """binary values -> map entries, whose lengths follow each value's."""
    values = values.fill_null(b"")
    size = _lengths(values)
    bytes_list = 1 + _varint_lengths(size.astype(np.uint64)) + size
    feature = 1 + _varint_lengths(bytes_list.astype(np.uint64)) + bytes_list
    key = _key_prefix(name)
    entry = len(key) + 1 + _varint_lengths(feature.astype(np.uint64)) + feature
    tag = pa.scalar(b"\x0a", pa.binary())
    return _join(tag, varints(entry), pa.scalar(key + b"\x12", pa.binary()), varints(feature), tag,
                 varints(bytes_list), tag, varints(size), values)


# A column whose first rows repeat this much (distinct values / rows) is encoded once per distinct value and
# then taken: categorical text and small integers, the common case, cost a hash and a take per row.
_REPEATING = 0.25
_SAMPLE = 4096


def _repeats(values: pa.Array) -> bool:
    return len(values) > _SAMPLE and pc.count_distinct(values.slice(0, _SAMPLE)).as_py() <= _REPEATING * _SAMPLE


def _entries_of(name: str, values: pa.Array) -> pa.Array:
    """Map entries for every row, nulls encoded as if they held a zero value (`_entries` blanks them)."""
    if pa.types.is_floating(values.type):
        return _float_entries(name, values.cast(pa.float32()))
    if pa.types.is_integer(values.type):
        return _int_entries(name, values.cast(pa.int64()))
    if pa.types.is_binary(values.type) or pa.types.is_string(values.type):
        return _bytes_entries(name, values.cast(pa.binary()))
    raise TypeError(f"column {name!r}: no tf.Example list holds {values.type}")


def _entries(name: str, values: pa.Array) -> pa.Array:
    if values.null_count == len(values):
        return pa.array([b""] * len(values), pa.binary())
    if not pa.types.is_floating(values.type) and _repeats(values):
        encoded = pc.dictionary_encode(values)
        entries = _entries_of(name, encoded.dictionary).take(encoded.indices.fill_null(0))
    else:
        entries = _entries_of(name, values)
    if values.null_count:  # an empty entry, not a null: Arrow 25's join with null_handling="skip" loses rows
        entries = pc.if_else(values.is_valid(), entries, pa.scalar(b"", pa.binary()))
    return entries


@functools.lru_cache(maxsize=64)
def _map_order(names: tuple[str, ...]) -> tuple[str, ...]:
    """The feature names in the order protobuf's deterministic serialization writes a Features map's entries."""
    from tensorflow.core.example import feature_pb2

    features = feature_pb2.Features()
    for name in names:
        features.feature[name].int64_list.value.append(0)
    data, order, at = features.SerializeToString(deterministic=True), [], 0
    while at < len(data):  # entries: 0x0A len (0x0A len key ...)
        size, at = _read_varint(data, at + 1)
        key_size, key_at = _read_varint(data, at + 1)
        order.append(data[key_at:key_at + key_size].decode("utf-8"))
        at += size
    return tuple(order)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        value, shift, at = value | (byte & 0x7F) << shift, shift + 7, at + 1
        if not byte & 0x80:
            return value, at


def encode(columns: Mapping[str, pa.Array], num_rows: int) -> pa.Array:
    """Serialized tf.Examples, one per row, as a binary array. A null leaves its feature out; a row with no value
    at all is an empty Example (no bytes), as protobuf writes one."""
    names = _map_order(tuple(sorted(columns)))
    if not names:
        return pa.array([b""] * num_rows, pa.binary())
    entries = [_entries(name, columns[name]) for name in names]
    body = _join(*entries) if len(entries) > 1 else entries[0]
    size = _lengths(body)
    example = _join(pa.scalar(b"\x0a", pa.binary()), varints(size.astype(np.uint64)), body)
    if (size == 0).any():
        example = pc.if_else(pa.array(size == 0), pa.scalar(b"", pa.binary()), example)
    return example
