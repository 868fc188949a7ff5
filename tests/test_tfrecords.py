"""components/tfrecords.py: the writer that compresses on a thread of its own keeps every record, in order, and
reports a failed write to its caller."""
import gzip

import pytest
import tensorflow as tf

from hpml.components import tfrecords


def _read(path: str) -> list[bytes]:
    return [record.numpy() for record in tf.data.TFRecordDataset(path, compression_type="GZIP")]


def test_records_of_many_batches_are_written_in_order(tmp_path):
    path = str(tmp_path / "nested" / "data.gz")
    batches = [[f"{batch}-{index}".encode() * (index % 7 + 1) for index in range(1000 + batch)] for batch in range(9)]
    with tfrecords.Writer(path) as writer:
        for batch in batches:
            writer.write(iter(batch) if len(batch) % 2 else batch)  # any iterable
    assert _read(path) == [record for batch in batches for record in batch]
    assert gzip.open(path).read(12), "a plain GZIP file, which any reader takes"


def test_a_record_the_writer_refuses_is_raised_in_the_caller_with_the_file(tmp_path):
    path = str(tmp_path / "data.gz")
    writer = tfrecords.Writer(path)
    writer.write([b"good", 17])  # the thread fails on 17
    with pytest.raises(OSError, match="data.gz") as raised:
        for _ in range(50):  # raised by a later write once the thread has failed, or else by close
            writer.write([b"more"])
        writer.close()
    assert isinstance(raised.value.__cause__, TypeError)
    with pytest.raises(OSError, match="data.gz"):
        writer.close()  # stops the thread, and still says the file is bad
    assert not writer._thread.is_alive()
