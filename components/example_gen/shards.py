"""The split and the output shards: which split each serialized tf.Example goes to, and one GZIP TFRecord file per
work item and split.

The split hashes each record (or its partition feature's values) with FarmHash Fingerprint64 in one TF op over a
whole batch (`tf.strings.to_hash_bucket_fast`). TFX's ExampleGen hashes with SHA-256, one record at a time in
Python, so the two put a given record in the same split only by chance; the ratios are the same. Shards are named
`data_tfrecord-{item}-of-{items}.gz` by work item, so a retried item rewrites its own files and nothing else.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hpml.components import artifacts, tfrecords


def bucket_bounds(buckets: Sequence[int]) -> np.ndarray:
    """Cumulative hash buckets: split i takes the hashes in [bounds[i-1], bounds[i])."""
    return np.cumsum(np.asarray(buckets, dtype=np.int64))


def split_indices(keys: pa.Array, bounds: np.ndarray) -> np.ndarray:
    """The split index of each key (binary), by Fingerprint64(key) mod the total number of buckets."""
    import tensorflow as tf

    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    values = np.asarray(keys.to_numpy(zero_copy_only=False), dtype=object)
    buckets = tf.strings.to_hash_bucket_fast(values, int(bounds[-1])).numpy()
    return np.searchsorted(bounds, buckets, side="right")


def partition_keys(values: pa.Array) -> pa.Array:
    """A feature's values in each row as the bytes the split hashes: its values as text, joined by commas. Null
    where the row holds no value."""
    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        as_text = values.cast(pa.list_(pa.string()))
        joined = pc.binary_join(as_text, ",")
        return pc.if_else(pc.greater(pc.list_value_length(values), 0), joined, pa.scalar(None, pa.string())) \
            .cast(pa.binary())
    return values.cast(pa.string()).cast(pa.binary())


def shard_path(examples_dir: str, split: str, item: int, items: int) -> str:
    return os.path.join(artifacts.split_dir(examples_dir, split),
                        artifacts.shard_name(artifacts.EXAMPLES_FILE_PREFIX, item, items))


class ShardWriters:
    """One GZIP TFRecord writer per split for one work item; `write` takes a batch of records and their splits.
    A context manager: leaving it closes the shards and adds the item's counts to the `examples_<split>` counters
    (Beam commits them only for a bundle that succeeds)."""

    def __init__(self, examples_dir: str, splits: Sequence[str], item: int, items: int):
        self._writers = [tfrecords.Writer(shard_path(examples_dir, split, item, items)) for split in splits]
        self._splits = list(splits)
        self.counts = [0] * len(splits)

    def write(self, records: pa.Array, split_of: np.ndarray) -> None:
        for index, writer in enumerate(self._writers):
            chosen = records.filter(pa.array(split_of == index)) if len(self._writers) > 1 else records
            self.counts[index] += len(chosen)
            writer.write(chosen.to_pylist())

    def __enter__(self) -> ShardWriters:
        return self

    def __exit__(self, *exc) -> None:
        import apache_beam as beam

        from hpml.components.example_gen.progress import NAMESPACE

        for writer in self._writers:
            writer.close()
        for split, count in zip(self._splits, self.counts):
            beam.metrics.Metrics.counter(NAMESPACE, f"examples_{split}").inc(count)
