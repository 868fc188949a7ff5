"""Transform's Beam reading and writing of tf.Examples, a batch of records per element.

Reading: one element per file; each is read by tf.data and decoded by tfx_bsl's C++ decoder into the RecordBatches
that tf.Transform takes. Writing: each bundle encodes its transformed batches with tfx_bsl's C++ encoder into a
temporary file of its own; once every bundle is done, the files that committed bundles wrote are renamed to the
artifact's shard names, so a retried bundle leaves nothing behind.
"""
from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator

import apache_beam as beam
import pyarrow as pa

from hpml.components import artifacts, files, publishing, tfrecords
from hpml.components.errors import InputDataError, op_error_message
from hpml.components.progress_log import Progress

log = logging.getLogger(__name__)

# Records per RecordBatch: tf.Transform runs its graph once per batch, so larger batches spend less per record
# on each call, up to where the batch stops fitting the CPU's caches.
BATCH_RECORDS = 8192


class _DecodeFile(beam.DoFn):
    def __init__(self, schema, records: int):
        self._schema, self._records = schema.SerializeToString(), records

    def setup(self):
        from tfx_bsl.coders import example_coder

        self._decoder = example_coder.ExamplesToRecordBatchDecoder(self._schema)

    def process(self, path: str) -> Iterator[pa.RecordBatch]:
        import tensorflow as tf

        done, in_batch = 0, 0
        progress = Progress(f"{path}: read", "records", component="Transform", logger=log)
        try:
            for records in tfrecords.read_batches(path, self._records):
                in_batch = len(records)
                yield self._decoder.DecodeBatch(records.tolist())
                done += in_batch
                progress(done)
        except tf.errors.DataLossError as err:
            raise InputDataError(f"{path}: corrupted TFRecord after about {done} records "
                                 f"({op_error_message(err)})", hint="run the component that wrote it again") from None
        except RuntimeError as err:  # the C++ decoder: not a tf.Example, or a feature of another kind than the schema's
            raise InputDataError(f"{path}: records {done + 1} to {done + in_batch}: {err}",
                                 hint="the examples do not match the schema; run ExampleGen again") from None


@beam.ptransform_fn
def ReadExampleBatches(pipeline, shards: list[str], schema, records: int = BATCH_RECORDS):
    """PCollection[pa.RecordBatch] of the tf.Examples in `shards`, decoded by `schema`, as tfxio's TFExampleRecord
    decodes them."""
    return (pipeline
            | "Shards" >> beam.Create(sorted(shards))
            | "Spread" >> beam.Reshuffle()
            | "Decode" >> beam.ParDo(_DecodeFile(schema, records)))


# Records per shard, at most: a reader opens several shards at once, and on s3:// fetches them ahead of itself, so a
# large split is better many files than one (about 10 MB of GZIP tf.Examples a shard at 10 features).
SHARD_RECORDS = 1 << 17


class _WriteBundle(beam.DoFn):
    """Encodes each RecordBatch to tf.Examples and writes them to temporary files of its bundle, a new one after
    `SHARD_RECORDS` records; yields each file's path. The names keep a bundle's files in order."""

    def __init__(self, temp_dir: str, shard_records: int = SHARD_RECORDS):
        self._temp_dir, self._shard_records = temp_dir, shard_records
        self._writer: tfrecords.Writer | None = None

    def _abandon(self) -> None:
        """Stops the writer of a bundle that failed (its file is never published), so its thread does not linger."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            with contextlib.suppress(OSError):
                writer.close()

    def start_bundle(self):
        self._abandon()
        self._path, self._bundle, self._files, self._in_file = None, uuid.uuid4().hex, 0, 0

    def process(self, batch: pa.RecordBatch) -> Iterator[str]:
        from tfx_bsl.coders import example_coder

        if self._writer is None:
            self._path = os.path.join(self._temp_dir,
                                      f"{self._bundle}-{self._files:06d}{artifacts.TFRECORD_GZ_SUFFIX}")
            self._writer, self._files, self._in_file = tfrecords.Writer(self._path), self._files + 1, 0
        self._writer.write(example_coder.RecordBatchToExamples(batch))
        self._in_file += batch.num_rows
        if self._in_file >= self._shard_records:
            self._writer.close()
            self._writer = None
            yield self._path

    def finish_bundle(self):
        from apache_beam.transforms import window
        from apache_beam.utils.windowed_value import WindowedValue

        if self._writer is not None:
            self._writer.close()
            yield WindowedValue(self._path, window.GlobalWindow().max_timestamp(), [window.GlobalWindow()])
            self._writer = None

    def teardown(self):
        self._abandon()


def _publish(written: list[str], prefix: str, fence: Callable[[], None]) -> list[str]:
    """Renames the committed bundles' files to `{prefix}-{i:05d}-of-{n:05d}.gz`; no file at all becomes one empty
    shard, so that every split has one. `fence` is called before each write: it raises once this attempt no
    longer owns the artifact."""
    written = sorted(written)
    fence()
    files.makedirs(os.path.dirname(prefix))
    if not written:
        path = artifacts.shard_name(prefix, 0, 1)
        tfrecords.Writer(path).close()
        return [path]
    names = []
    for index, path in enumerate(written):
        name = artifacts.shard_name(prefix, index, len(written))
        fence()
        files.rename(path, name)
        names.append(name)
    return names


@beam.ptransform_fn
def WriteExampleShards(batches, prefix: str, temp_dir: str, fence: Callable[[], None] = publishing.unfenced,
                       shard_records: int = SHARD_RECORDS):
    """Writes PCollection[pa.RecordBatch] as GZIP TFRecord shards `{prefix}-*-of-*.gz` of tf.Examples, at most about
    `shard_records` records each; files are first written under `temp_dir`, which the caller removes, and moved
    into place after `fence()` (see `publishing.writer_fence`). Yields the list of shard paths."""
    return (batches
            | "Encode" >> beam.ParDo(_WriteBundle(temp_dir, shard_records))
            | "Committed" >> beam.combiners.ToList()
            | "Publish" >> beam.Map(_publish, prefix, fence))
