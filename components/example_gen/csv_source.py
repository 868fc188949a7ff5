"""ExampleGen's CSV reading as two Beam passes over work items (pieces of files), neither holding more than a chunk:

1. `ColumnKinds`: the narrowest kind (int, float or bytes) of each column, over the good rows;
2. `WriteCsvExamples`: each good row as a typed tf.Example, written to its split's shard.

Each chunk is parsed by Arrow's CSV reader and checked column at a time (`csv_cells`). A chunk that Arrow cannot
parse (a row of the wrong width, bytes its encoding cannot decode) or that holds a bad row is read again by the
per-row path (`csv_rows`), which names the file, line and column, and skips and counts the row or stops.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa

from hpml.components.example_gen import csv_cells, csv_chunks, example_encoder, shards
from hpml.components.example_gen.csv_rows import BYTES, FLOAT, INT, NONE, RowRules, checked_rows
from hpml.components.example_gen.progress import SkippedRows, log
from hpml.components.progress_log import Progress
from hpml.components.example_gen.text_encoding import is_utf8, python_codec

_LIST_KIND = {INT: "int64_list", FLOAT: "float_list", BYTES: "bytes_list"}


@dataclass(frozen=True)
class CsvSettings:
    header: Sequence[str]
    na_values: Sequence[str]
    skip_bad_rows: bool
    required: Sequence[str] = ()
    numeric: Sequence[str] = ()
    encoding: str = "utf-8"
    rules: RowRules = field(init=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "rules", RowRules(self.header, self.na_values, self.required, self.numeric,
                                                   self.encoding))


def _arrow_table(data: bytes, settings: CsvSettings) -> pa.Table | None:
    """The chunk's cells as strings, or None where Arrow cannot read it as whole, well-formed, decodable rows."""
    import pyarrow.csv as pcsv

    if not is_utf8(settings.encoding):
        try:
            data = data.decode(python_codec(settings.encoding)).encode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        return pcsv.read_csv(
            pa.py_buffer(data),
            read_options=pcsv.ReadOptions(column_names=list(settings.header), use_threads=False,
                                          block_size=max(len(data), 1 << 20)),
            parse_options=pcsv.ParseOptions(newlines_in_values=True),
            convert_options=pcsv.ConvertOptions(column_types={name: pa.string() for name in settings.header},
                                                null_values=[], strings_can_be_null=False,
                                                quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


def _read_rule_violations(columns: dict[str, pa.Array], settings: CsvSettings) -> \
        tuple[np.ndarray, dict[str, csv_cells.Cells]]:
    """The rows the read rules make bad (required and numeric columns), and the declared numeric columns' cells,
    where NaN is a missing value."""
    rows = len(next(iter(columns.values()))) if columns else 0
    bad = np.zeros(rows, dtype=bool)
    numeric = {}
    for name in settings.numeric:
        cells = numeric[name] = csv_cells.classify(columns[name])
        bad |= cells.present & (cells.text_cell | cells.unstorable)
        cells.present = cells.present & ~cells.nan
    for name in settings.required:
        present = numeric[name].present if name in numeric else \
            columns[name].is_valid().to_numpy(zero_copy_only=False)
        bad |= ~present
    return bad, numeric


def suspect(data: bytes) -> bool:
    """Whether a chunk holds what Arrow reads without complaint but the per-row path refuses: a NUL byte, or an odd
    count of quotes (a quoted value that never closes). Both are memchr-speed scans."""
    return b"\x00" in data or data.count(b'"') % 2 == 1


class _ChunkReader:
    """A work item's chunks as columns of trimmed cells (missing ones null), by Arrow where it can; a chunk that
    Arrow cannot parse, or that holds a bad row, by the per-row path, which names, skips or refuses its bad rows."""

    def __init__(self, settings: CsvSettings, skipped: SkippedRows | None):
        self._settings, self._skipped = settings, skipped

    def fast(self, chunk: csv_chunks.Chunk) -> dict[str, pa.Array] | None:
        """The chunk's columns, or None where Arrow cannot read it as whole, well-formed, decodable rows."""
        if not isinstance(chunk.data, bytes) or suspect(chunk.data):
            return None
        table = _arrow_table(chunk.data, self._settings)
        if table is None:
            return None
        ascii_only = csv_cells.ascii_without_separators(chunk.data)
        return {name: csv_cells.trimmed(table.column(name).combine_chunks(), self._settings.na_values, ascii_only)
                for name in self._settings.header}

    def slow(self, piece: csv_chunks.Piece, chunk: csv_chunks.Chunk,
             kinds: dict[str, int] | None = None) -> dict[str, pa.Array] | None:
        """The chunk's good rows' columns (None where it has none); with `kinds`, by the conversion rule too."""
        settings = self._settings
        text = chunk.data if isinstance(chunk.data, str) else \
            chunk.data.decode(python_codec(settings.encoding), "surrogateescape")
        rows = [values for _, values in checked_rows(text, piece.path, chunk.lines_before(), settings.rules,
                                                     settings.skip_bad_rows, self._skipped, kinds)]
        if not rows:
            return None
        return {name: pa.array([row[name] for row in rows], pa.string()) for name in settings.header}


class ColumnKinds(beam.DoFn):
    """Pass 1: yields (item index, [kind of each header column] over the item's good rows, [(piece, chunk) numbers
    of the chunks that hold a bad row]). Skipped rows are counted in pass 2, which reads those chunks row by row
    again."""

    def __init__(self, settings: CsvSettings):
        self._settings = settings

    def process(self, indexed_item) -> Iterator[tuple[int, list[int], list[tuple[int, int]]]]:
        index, item = indexed_item
        settings = self._settings
        reader = _ChunkReader(settings, skipped=None)
        kinds = {name: NONE for name in settings.header}
        bad_chunks = []
        progress = Progress(f"{csv_chunks.item_name(item)}: column kinds", "rows", component="ExampleGen", logger=log)
        rows = 0
        numeric: dict[str, csv_cells.Cells]
        for number, piece in enumerate(item):
            for chunk_number, chunk in enumerate(csv_chunks.read_chunks(piece, settings.encoding)):
                columns, numeric = reader.fast(chunk), {}
                if columns is not None:
                    bad, numeric = _read_rule_violations(columns, settings)
                    if bad.any():
                        columns = None
                if columns is None:
                    bad_chunks.append((number, chunk_number))
                    columns, numeric = reader.slow(piece, chunk), {}
                    if columns is None:
                        continue
                for name, text in columns.items():
                    cells = numeric.get(name)
                    kinds[name] = max(kinds[name], cells.kind()) if cells else \
                        csv_cells.widened_kind(text, kinds[name])
                rows += len(columns[settings.header[0]])
                progress(rows)
        yield index, [kinds[name] for name in settings.header], bad_chunks


def merge_kinds(results: Sequence[tuple[int, list[int], list]], header: Sequence[str]) -> dict:
    """Pass 1's results as {"kinds": {column: kind}, "bad_chunks": {item index: [(piece, chunk)]}}."""
    merged = [NONE] * len(header)
    for _, kinds, _ in results:
        merged = [max(a, b) for a, b in zip(merged, kinds)]
    return {"kinds": dict(zip(header, merged)),
            "bad_chunks": {index: [tuple(chunk) for chunk in bad] for index, _, bad in results if bad}}


class WriteCsvExamples(beam.DoFn):
    """Pass 2: writes one work item's good rows as tf.Examples, one shard per split, and yields the item's feature
    statistics for the schema (`schema_inference.FeatureStats`' accumulator)."""

    def __init__(self, settings: CsvSettings, examples_dir: str, splits: Sequence[str], buckets: Sequence[int],
                 items: int, partition_feature: str | None):
        self._settings, self._dir, self._splits = settings, examples_dir, list(splits)
        self._bounds, self._items, self._partition = shards.bucket_bounds(buckets), items, partition_feature

    def setup(self):
        self._skipped = SkippedRows()

    def process(self, indexed_item, pass1: dict) -> Iterator[dict]:
        index, item = indexed_item
        kinds, bad_chunks = pass1["kinds"], set(pass1["bad_chunks"].get(index, ()))
        reader = _ChunkReader(self._settings, self._skipped)
        writers = shards.ShardWriters(self._dir, self._splits, index, self._items)
        stats: dict = {"_n": 0}
        share = [0.0]
        progress = Progress(f"{csv_chunks.item_name(item)}: written", "rows", lambda: share[0], component="ExampleGen",
                            logger=log)
        with writers:
            for number, piece in enumerate(item):
                for chunk_number, chunk in enumerate(csv_chunks.read_chunks(piece, self._settings.encoding)):
                    share[0] = (number + chunk.share) / len(item)
                    values = None
                    if (number, chunk_number) not in bad_chunks:
                        values = self._converted(reader.fast(chunk), kinds)
                    if values is None:
                        columns = reader.slow(piece, chunk, kinds)
                        if columns is None:
                            continue
                        values = self._converted(columns, kinds)
                    self._write(values, kinds, writers, stats, (piece.path, chunk.lines_before() + 1))
                    progress(stats["_n"])
        yield stats

    @staticmethod
    def _converted(columns: dict[str, pa.Array] | None, kinds: dict[str, int]) -> dict[str, pa.Array] | None:
        """Each column's values as the examples store them; None where a row breaks the conversion rule (an
        infinity, or a number beyond float32, in a column read as numbers)."""
        if columns is None:
            return None
        values = {}
        for name, text in columns.items():
            kind = kinds[name]
            if kind == NONE:
                continue
            converted = csv_cells.convert(text, kind) or csv_cells.values_of_kind(csv_cells.classify(text), kind)
            if converted[1].any():
                return None
            values[name] = converted[0]
        return values

    def _write(self, columns, kinds, writers, stats, where) -> None:
        for name, values in columns.items():
            present = len(values) - values.null_count
            if present:
                entry = stats.setdefault(name, {}).setdefault(_LIST_KIND[kinds[name]], [0, 1, 1, where])
                entry[0] += present
        rows = len(next(iter(columns.values()))) if columns else 0
        stats["_n"] += rows
        records = example_encoder.encode(columns, rows)
        if self._partition is not None:
            keys = _csv_partition_keys(columns, self._partition, where)
        else:
            keys = records
        writers.write(records, shards.split_indices(keys, self._bounds))


def _csv_partition_keys(columns, name, where) -> pa.Array:
    from hpml.components.errors import InputDataError

    values = columns.get(name)
    if values is None or values.null_count:
        row = 0 if values is None else int(np.flatnonzero(~values.is_valid().to_numpy(zero_copy_only=False))[0])
        raise InputDataError(f"{where[0]}: row {row + 1} of the chunk from line {where[1]}: partition feature "
                             f"{name!r} is missing", hint="choose a column that every row holds a value in")
    return shards.partition_keys(values)
