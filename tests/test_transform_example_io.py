"""Transform's batch reading and writing of tf.Examples: decoded as tfxio decodes, written whole and once."""
import gzip
import os
import re

import apache_beam as beam
import pyarrow as pa
import pytest
import tensorflow as tf

from hpml.components import artifacts
from hpml.components.beam_utils import make_pipeline, run_pipeline
from hpml.components.errors import InputDataError
from hpml.components.schema_file import read_schema
from hpml.components.transform import example_io

TWO_PROCESSES = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def _penguin_examples(penguin_outputs):
    examples = penguin_outputs["ExampleGen"]["examples"]
    schema = read_schema(artifacts.schema_path(penguin_outputs["ExampleGen"]["schema"]))
    return examples, schema, artifacts.require_files(artifacts.examples_file_pattern(examples, "train"), "train")


def _collect(pcoll, path):
    """Writes the pipeline's RecordBatches to one Arrow IPC file per element, so the test reads them back."""
    def save(batch):
        import uuid

        with pa.OSFile(os.path.join(path, uuid.uuid4().hex), "wb") as sink, \
                pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
    return pcoll | f"Save to {os.path.basename(path)}" >> beam.Map(save)


def _table(path):
    batches = [pa.ipc.open_file(pa.memory_map(os.path.join(path, name))).read_all() for name in os.listdir(path)]
    return pa.concat_tables(batches, promote_options="default")


def _sorted(table: pa.Table) -> list:
    return sorted(table.to_pylist(), key=repr)


def test_batches_hold_what_tfxio_decodes(penguin_outputs, tmp_path):
    from tfx_bsl.public import tfxio

    _, schema, shards = _penguin_examples(penguin_outputs)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    pipeline = make_pipeline([])
    _collect(pipeline | "Ours" >> example_io.ReadExampleBatches(shards, schema, records=50), str(ours))
    source = tfxio.TFExampleRecord(file_pattern=shards, schema=schema)
    _collect(pipeline | "Theirs" >> source.BeamSource(), str(theirs))
    run_pipeline(pipeline)
    mine, reference = _table(ours), _table(theirs)
    assert mine.schema == reference.schema
    assert mine.num_rows == reference.num_rows > 200
    assert _sorted(mine) == _sorted(reference)
    assert len(os.listdir(ours)) == -(-mine.num_rows // 50), "one batch per 50 records"


@pytest.mark.parametrize("args", [[], TWO_PROCESSES], ids=["in_process", "two_processes"])
def test_shards_hold_every_record_once_and_nothing_a_failed_bundle_left(penguin_outputs, tmp_path, args):
    from tfx_bsl.coders import example_coder

    _, schema, shards = _penguin_examples(penguin_outputs)
    temp = tmp_path / "temp"
    temp.mkdir()
    (temp / "left-by-a-failed-bundle.gz").write_bytes(b"half a file")
    prefix = str(tmp_path / "out" / "Split-train" / "transformed_examples")
    pipeline = make_pipeline(args)
    _ = (pipeline | example_io.ReadExampleBatches(shards * 3, schema, records=40)
         | example_io.WriteExampleShards(prefix, str(temp)))
    run_pipeline(pipeline)
    written = sorted(os.listdir(tmp_path / "out" / "Split-train"))
    count = len(written)
    assert written == [f"transformed_examples-{i:05d}-of-{count:05d}.gz" for i in range(count)]
    if args:
        assert count >= 2, "each worker's bundles write files of their own"
    records = [r for name in written for r in tf.data.TFRecordDataset(
        str(tmp_path / "out" / "Split-train" / name), compression_type="GZIP").as_numpy_iterator()]
    original = [r for path in shards for r in tf.data.TFRecordDataset(path, compression_type="GZIP")
                .as_numpy_iterator()]
    decoded = example_coder.ExamplesToRecordBatchDecoder(schema.SerializeToString())
    assert _sorted(pa.Table.from_batches([decoded.DecodeBatch(records)])) == \
        _sorted(pa.Table.from_batches([decoded.DecodeBatch(original * 3)]))
    assert os.listdir(temp) == ["left-by-a-failed-bundle.gz"], "only committed bundles' files are published"


def test_a_large_split_is_written_as_shards_of_at_most_about_shard_records(penguin_outputs, tmp_path):
    _, schema, shards = _penguin_examples(penguin_outputs)
    prefix = str(tmp_path / "out" / "Split-train" / "transformed_examples")
    pipeline = make_pipeline([])
    _ = (pipeline | example_io.ReadExampleBatches(shards * 3, schema, records=40)
         | example_io.WriteExampleShards(prefix, str(tmp_path / "temp"), shard_records=100))
    run_pipeline(pipeline)
    written = sorted((tmp_path / "out" / "Split-train").iterdir())
    counts = [sum(1 for _ in tf.data.TFRecordDataset(str(path), compression_type="GZIP")) for path in written]
    original = sum(1 for path in shards for _ in tf.data.TFRecordDataset(path, compression_type="GZIP"))
    assert sum(counts) == original * 3
    assert len(counts) >= -(-original * 3 // 139) >= 2, counts
    assert max(counts) < 100 + 40, "a new file once 100 records are in one (batches of at most 40)"


def test_a_split_with_no_records_gets_one_empty_shard(tmp_path):
    prefix = str(tmp_path / "Split-eval" / "transformed_examples")
    pipeline = make_pipeline([])
    _ = (pipeline | beam.Create([], reshuffle=False).with_output_types(pa.RecordBatch)
         | example_io.WriteExampleShards(prefix, str(tmp_path / "temp")))
    run_pipeline(pipeline)
    assert os.listdir(tmp_path / "Split-eval") == ["transformed_examples-00000-of-00001.gz"]
    assert list(tf.data.TFRecordDataset(prefix + "-00000-of-00001.gz", compression_type="GZIP")) == []


def test_a_corrupted_shard_is_named(penguin_outputs, tmp_path):
    _, schema, shards = _penguin_examples(penguin_outputs)
    raw = bytearray(gzip.decompress(open(shards[0], "rb").read()))
    raw[200] ^= 0xFF  # inside the first records: their CRC no longer matches
    broken = tmp_path / "data_tfrecord-00000-of-00001.gz"
    broken.write_bytes(gzip.compress(bytes(raw)))
    pipeline = make_pipeline([])
    _ = pipeline | example_io.ReadExampleBatches([str(broken)], schema)
    with pytest.raises(InputDataError, match=rf"{broken}: corrupted TFRecord after about 0 records"):
        run_pipeline(pipeline)


def test_records_that_do_not_match_the_schema_are_named(penguin_outputs, tmp_path):
    _, schema, shards = _penguin_examples(penguin_outputs)
    example = tf.train.Example()
    example.features.feature["body_mass_g"].bytes_list.value.append(b"heavy")
    other = tmp_path / "other.gz"
    with tf.io.TFRecordWriter(str(other), "GZIP") as writer:
        writer.write(example.SerializeToString())
    pipeline = make_pipeline([])
    _ = pipeline | example_io.ReadExampleBatches([str(other)], schema)
    with pytest.raises(InputDataError, match=rf"{other}: records 1 to 1: .*body_mass_g"):
        run_pipeline(pipeline)


def test_a_long_read_logs_its_progress(penguin_outputs, caplog, monkeypatch):
    from hpml.components import progress_log as progress

    _, schema, shards = _penguin_examples(penguin_outputs)
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.0)
    pipeline = make_pipeline([])
    _ = pipeline | example_io.ReadExampleBatches(shards, schema, records=50)
    with caplog.at_level("INFO", logger=example_io.log.name):
        run_pipeline(pipeline)
    line = rf"Transform: {re.escape(shards[0])}: read: (\d+) records in \d+ s, [\d,]+ records/s"
    counts = [int(m.group(1)) for r in caplog.records if (m := re.fullmatch(line, r.getMessage()))]
    assert counts == list(range(50, counts[-1], 50)) + [counts[-1]] and counts[-1] > 200, caplog.text


def test_the_writer_of_a_failed_bundle_stops_when_the_next_bundle_starts(tmp_path):
    """A bundle that fails never reaches finish_bundle; its writer's thread must not outlive it."""
    write = example_io._WriteBundle(str(tmp_path))
    batch = pa.RecordBatch.from_pydict({"x": pa.array([[1.0], [2.0]], pa.list_(pa.float32()))})
    write.start_bundle()
    assert list(write.process(batch)) == [], "a file is yielded once it holds SHARD_RECORDS records, or at the end"
    thread = write._writer._thread
    assert thread.is_alive()
    write.start_bundle()  # the retry, on the same DoFn instance
    assert not thread.is_alive() and write._writer is None
    assert list(write.process(batch)) == []
    paths = list(write.finish_bundle())
    write.teardown()
    assert len(paths) == 1 and len(list(tf.data.TFRecordDataset(paths[0].value, compression_type="GZIP"))) == 2
