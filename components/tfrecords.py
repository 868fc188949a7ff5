"""TFRecord files a batch of records at a time: read by tf.data, written by TF's C++ writer at a fast GZIP level.

Beam's own TFRecord IO frames, checksums and (de)compresses each record in Python, which costs more than
everything else Transform does per record; here the per-record work is native.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator

import numpy as np

# zlib level 1: about 4x the speed of the default 6 on tf.Examples, whose repeated keys compress well at any level
# (benchmarks/results/scale.md measures both); readers accept any level.
GZIP_LEVEL = 1


def compression_of(path: str) -> str:
    """TF's compression name for a TFRecord file, from its name: GZIP for `.gz`, none otherwise."""
    return "GZIP" if path.endswith(".gz") else ""


def read_batches(path: str, records: int, compression: str | None = None) -> Iterator[np.ndarray]:
    """The file's serialized records, `records` at a time, as object arrays of bytes."""
    import tensorflow as tf

    compression = compression_of(path) if compression is None else compression
    dataset = tf.data.TFRecordDataset(path, compression_type=compression).batch(records)
    yield from dataset.as_numpy_iterator()


class Writer:
    """A GZIP TFRecord file at GZIP_LEVEL; `write` takes any iterable of serialized records."""

    def __init__(self, path: str):
        import tensorflow as tf

        tf.io.gfile.makedirs(os.path.dirname(path))
        options = tf.io.TFRecordOptions(compression_type="GZIP", compression_level=GZIP_LEVEL)
        self._writer = tf.io.TFRecordWriter(path, options)

    def write(self, records: Iterable[bytes]) -> None:
        write = self._writer.write
        for record in records:  # each write is one C++ call: framing, CRC32C and zlib
            write(record)

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
