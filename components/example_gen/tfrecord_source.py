"""ExampleGen's TFRecord reading: (file, record index, serialized tf.Example) of each good record of a file."""
from __future__ import annotations

import math
from typing import Sequence

import apache_beam as beam

from hpml.components.errors import InputDataError, op_error_message
from hpml.components.example_gen.inputs import is_gzip, looks_like_tfrecord, open_binary
from hpml.components.example_gen.progress import Progress, SkippedRows
from hpml.components.zlib_streams import stream_problem


class ReadTFRecordExamples(beam.DoFn):
    """Yields (file, record index, serialized tf.Example) from plain or GZIP TFRecord files."""

    def __init__(self, skip_bad_rows: bool, required_features: Sequence[str] = (),
                 numeric_features: Sequence[str] = ()):
        self._skip = skip_bad_rows
        self._required = list(required_features)
        self._numeric = list(numeric_features)
        self._skipped = SkippedRows()

    def _problem(self, record: bytes) -> str | None:
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

    def process(self, path: str):
        import tensorflow as tf

        compression = "GZIP" if is_gzip(path) else ""
        index = 0
        progress = Progress(f"{path}: read", "records")
        try:
            for record in tf.data.TFRecordDataset(path, compression_type=compression).as_numpy_iterator():
                index += 1
                if index % 4096 == 0:
                    progress(index)
                problem = self._problem(record)
                if problem is not None:
                    if self._skip:
                        self._skipped.skip(f"{path}: record {index}", problem)
                        continue
                    raise InputDataError(
                        f"{path}: record {index}: {problem}", hint="fix the file, or set skip_bad_rows=true"
                    )
                yield path, index, record
        except tf.errors.DataLossError as err:
            if index == 0 and not looks_like_tfrecord(path):
                with open_binary(path) as handle:
                    start = handle.read(24).decode("utf-8", "replace")
                raise InputDataError(f"{path}: not a TFRecord file (it starts with {start!r})",
                                     hint="ExampleGen reads CSV files with input_format='csv'") from None
            raise InputDataError(f"{path}: corrupted TFRecord after record {index} ({op_error_message(err)})") from None
        if compression:
            # TF's GZIP reader stops at the last whole record and never reads the trailer, so a file cut in
            # its last bytes would pass for a complete one.
            problem = stream_problem(path, "GZIP")
            if problem is not None:
                raise InputDataError(f"{path}: corrupted GZIP data after record {index} ({problem})",
                                     hint="the file was probably cut short in a copy or upload; copy it again")
