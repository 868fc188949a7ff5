"""TFRecord files a batch of records at a time: read by tf.data, written by TF's C++ writer at a fast GZIP level.

Beam's own TFRecord IO frames, checksums and (de)compresses each record in Python, which costs more than
everything else Transform does per record; here the per-record work is native.
"""
from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable, Iterator

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
    """A GZIP TFRecord file at GZIP_LEVEL; `write` takes any iterable of serialized records.

    Records are compressed and written on a thread of the writer's own: TF's writer releases the GIL, so one
    batch's compression overlaps with the making of the next (measured: two threads write 1.75x as fast as one).
    At most QUEUED batches wait, so memory stays bounded. An error in the thread is raised by the next `write` or by
    `close`, which always stops the thread."""

    QUEUED = 2

    def __init__(self, path: str):
        import tensorflow as tf

        tf.io.gfile.makedirs(os.path.dirname(path))
        options = tf.io.TFRecordOptions(compression_type="GZIP", compression_level=GZIP_LEVEL)
        self._writer = tf.io.TFRecordWriter(path, options)
        self._path = path
        self._batches: queue.Queue = queue.Queue(maxsize=self.QUEUED)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name=f"write {os.path.basename(path)}", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        write = self._writer.write
        while (records := self._batches.get()) is not None:
            if self._error is not None:
                continue  # keep taking batches, so that `write` never blocks on a dead thread
            try:
                for record in records:  # each write is one C++ call: framing, CRC32C and zlib
                    write(record)
            except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
                self._error = error

    def _raise(self) -> None:
        if self._error is not None:
            raise OSError(f"writing {self._path}: {self._error}") from self._error

    def write(self, records: Iterable[bytes]) -> None:
        self._raise()
        self._batches.put(records if isinstance(records, list) else list(records))

    def close(self) -> None:
        if self._thread.is_alive():
            self._batches.put(None)
            self._thread.join()
            self._writer.close()
        self._raise()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
