"""ExampleGen's TFRecord reading: work items of whole files, read a batch of records at a time.

tfx_bsl's C++ decoder turns each batch into Arrow columns, on which the record rules are checked and the schema's
statistics counted column at a time. A batch it cannot decode (a record that is not a tf.Example, a feature of two
kinds) or that holds a bad record is checked again record by record, which names the file and record. Records are
written as they were read, to the work item's shard of their split.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hpml.components import tfrecords
from hpml.components.files import tf_readable
from hpml.components.errors import InputDataError, op_error_message
from hpml.components.example_gen import shards
from hpml.components.example_gen.csv_chunks import item_name
from hpml.components.example_gen.inputs import is_gzip, looks_like_tfrecord, open_binary
from hpml.components.example_gen.progress import SkippedRows, log
from hpml.components.progress_log import Progress
from hpml.components.example_gen.schema_inference import FeatureStats
from hpml.components.zlib_streams import stream_problem

# Records decoded and checked at a time.
BATCH_RECORDS = 8192
_KINDS = (("float_list", pa.types.is_floating), ("int64_list", pa.types.is_integer),
          ("bytes_list", lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t)))


def _list_kind(column: pa.Array) -> str | None:
    """'float_list', 'int64_list' or 'bytes_list'; None for a feature no record of the batch gives a kind (Arrow's
    null type)."""
    if not hasattr(column.type, "value_type"):
        return None
    return next((name for name, test in _KINDS if test(column.type.value_type)), None)


def _rows(indices: pa.Array, rows: int) -> np.ndarray:
    """A row mask from the row indices of flattened list values."""
    mask = np.zeros(rows, dtype=bool)
    mask[np.asarray(indices.to_numpy(zero_copy_only=False), dtype=np.int64)] = True
    return mask


class _RecordRules:
    """What makes a record bad: not a tf.Example, no value in a required feature, bytes in a declared numeric one,
    or NaN or an infinity in any float feature (declared or not, as in CSV)."""

    def __init__(self, required: Sequence[str], numeric: Sequence[str]):
        self._required = list(required)
        self._numeric = list(numeric)

    def problem(self, record: bytes) -> str | None:
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

    def bad_rows(self, batch: pa.RecordBatch) -> np.ndarray:
        """The rows of a decoded batch that `problem` would refuse, found column at a time."""
        bad = np.zeros(batch.num_rows, dtype=bool)
        names = set(batch.schema.names)
        for name in self._required:
            if name not in names or _list_kind(batch.column(name)) is None:
                return ~bad
            lengths = pc.list_value_length(batch.column(name)).fill_null(0).to_numpy(zero_copy_only=False)
            bad |= lengths == 0
        for name in self._numeric:
            if name in names and _list_kind(batch.column(name)) == "bytes_list":
                bad |= batch.column(name).is_valid().to_numpy(zero_copy_only=False)
        for name in batch.schema.names:
            column = batch.column(name)
            if _list_kind(column) == "float_list":
                finite = pc.is_finite(pc.list_flatten(column)).to_numpy(zero_copy_only=False)
                if not finite.all():
                    bad |= _rows(pc.list_parent_indices(column).filter(pa.array(~finite)), batch.num_rows)
        return bad


def batch_stats(batch: pa.RecordBatch, path: str, indices: np.ndarray) -> dict:
    """`FeatureStats`' accumulator for a decoded batch whose records are records `indices` of `path`."""
    stats: dict = {"_n": batch.num_rows}
    for name, column in zip(batch.schema.names, batch.columns):
        kind = _list_kind(column)
        if kind is None:
            continue
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        if not valid.any():
            continue
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)[valid]
        first = int(indices[int(np.argmax(valid))])
        stats[name] = {kind: [int(valid.sum()), int(lengths.min()),
                                                             int(lengths.max()), (path, first)]}
    return stats


class WriteTFRecordExamples(beam.DoFn):
    """Writes one work item's good records, one shard per split, and yields the item's feature statistics."""

    def __init__(self, skip_bad_rows: bool, required: Sequence[str], numeric: Sequence[str], examples_dir: str,
                 splits: Sequence[str], buckets: Sequence[int], items: int, partition_feature: str | None):
        self._skip, self._rules = skip_bad_rows, _RecordRules(required, numeric)
        self._dir, self._splits, self._bounds = examples_dir, list(splits), shards.bucket_bounds(buckets)
        self._items, self._partition = items, partition_feature

    def setup(self):
        self._skipped = SkippedRows()

    def process(self, indexed_item) -> Iterator[dict]:
        index, item = indexed_item
        writers = shards.ShardWriters(self._dir, self._splits, index, self._items)
        stats: dict = {"_n": 0}
        progress = Progress(f"{item_name(item)}: written", "records", component="ExampleGen", logger=log)
        with writers:
            for piece in item:
                for records, batch, indices in self._batches(piece.path):
                    if batch is None:
                        batch_stat = FeatureStats().create_accumulator()
                        for index, record in zip(indices.tolist(), records.to_pylist()):
                            batch_stat = FeatureStats().add_input(batch_stat, (piece.path, index, record))
                    else:
                        batch_stat = batch_stats(batch, piece.path, indices)
                    stats = FeatureStats().merge_accumulators([stats, batch_stat])
                    keys = records if self._partition is None else \
                        self._partition_keys(records, batch, piece.path, indices)
                    writers.write(records, shards.split_indices(keys, self._bounds))
                    progress(stats["_n"])
        yield stats

    def _batches(self, path: str) -> Iterator[tuple[pa.Array, pa.RecordBatch | None, np.ndarray]]:
        """(good records, their decoded batch or None where they were checked record by record, their indices in
        the file, from 1) for each batch of the file."""
        import tensorflow as tf
        from tfx_bsl.coders import example_coder

        decoder = example_coder.ExamplesToRecordBatchDecoder()
        source = tf_readable(path)
        compression = "GZIP" if is_gzip(source) else ""
        done = 0
        try:
            for records in tfrecords.read_batches(source, BATCH_RECORDS, compression):
                batch = None
                try:
                    batch = decoder.DecodeBatch(records.tolist())
                except RuntimeError:  # a record that is not a tf.Example, or a feature of two kinds
                    pass
                if batch is not None and not self._rules.bad_rows(batch).any():
                    yield pa.array(records.tolist(), pa.binary()), batch, np.arange(done + 1, done + 1 + len(records))
                else:
                    good = self._checked(path, records, done)
                    if good:
                        yield (pa.array([record for _, record in good], pa.binary()), None,
                               np.array([index for index, _ in good]))
                done += len(records)
        except tf.errors.DataLossError as err:
            done = self._records_before_loss(source, compression, done)
            if done == 0 and not looks_like_tfrecord(source):
                with open_binary(source) as handle:
                    start = handle.read(24).decode("utf-8", "replace")
                raise InputDataError(f"{path}: not a TFRecord file (it starts with {start!r})",
                                     hint="ExampleGen reads CSV files with input_format='csv'") from None
            raise InputDataError(f"{path}: corrupted TFRecord after record {done} ({op_error_message(err)})") from None
        if compression:
            # TF's GZIP reader stops at the last whole record and never reads the trailer, so a file cut in
            # its last bytes would pass for a complete one.
            problem = stream_problem(source, "GZIP")
            if problem is not None:
                raise InputDataError(f"{path}: corrupted GZIP data after record {done} ({problem})",
                                     hint="the file was probably cut short in a copy or upload; copy it again")

    @staticmethod
    def _records_before_loss(path: str, compression: str, done: int) -> int:
        """How many whole records precede the corruption: the batch that met it is counted one record at a time."""
        import tensorflow as tf

        try:
            for _ in tf.data.TFRecordDataset(path, compression_type=compression).skip(done).as_numpy_iterator():
                done += 1
        except tf.errors.DataLossError:
            pass
        return done

    def _checked(self, path: str, records: np.ndarray, done: int) -> list[tuple[int, bytes]]:
        """(index, record) of the batch's good records, checked one by one; a bad one is an error or skipped."""
        good = []
        for offset, record in enumerate(records.tolist()):
            index = done + offset + 1
            problem = self._rules.problem(record)
            if problem is None:
                good.append((index, record))
            elif self._skip:
                self._skipped.skip(f"{path}: record {index}", problem)
            else:
                raise InputDataError(f"{path}: record {index}: {problem}",
                                     hint="fix the file, or set skip_bad_rows=true")
        return good

    def _partition_keys(self, records: pa.Array, batch: pa.RecordBatch | None, path: str,
                        indices: np.ndarray) -> pa.Array:
        """The partition feature's values of each record, as the split hashes them; a record without one is an
        error naming it."""
        from tfx_bsl.coders import example_coder

        if batch is None:
            try:
                batch = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch(records.to_pylist())
            except RuntimeError as err:
                raise InputDataError(f"{path}: records {indices[0]} to {indices[-1]}: {err}",
                                     hint="store each feature as the same kind of list in every record") from None
        if self._partition not in batch.schema.names:
            raise InputDataError(f"{path}: record {indices[0]}: partition feature {self._partition!r} is missing")
        keys = shards.partition_keys(batch.column(self._partition))
        if keys.null_count:
            row = int(np.argmax(~keys.is_valid().to_numpy(zero_copy_only=False)))
            raise InputDataError(f"{path}: record {indices[row]}: partition feature {self._partition!r} is missing")
        return keys
