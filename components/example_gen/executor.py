"""ExampleGen executor: one Beam pipeline from raw files to split tf.Examples and a schema."""
from __future__ import annotations

import hashlib
import os
from typing import Any, Mapping

import apache_beam as beam

from hpml.components import artifacts
from hpml.components import files as file_system
from hpml.components.beam_utils import counter_value, make_pipeline, run_pipeline
from hpml.components.errors import InputDataError
from hpml.components.example_gen import schema_inference, sources


def _bucket(key: bytes, total: int) -> int:
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % total


def _partition_key(serialized: bytes, feature_name: str | None, where: str) -> bytes:
    if feature_name is None:
        return serialized
    import tensorflow as tf

    feature = tf.train.Example.FromString(serialized).features.feature.get(feature_name)
    kind = feature.WhichOneof("kind") if feature is not None else None
    if kind is None:
        raise InputDataError(f"{where}: partition feature {feature_name!r} is missing")
    return repr(list(getattr(feature, kind).value)).encode()


class _SplitByHash:
    """Beam partition function: hash bucket -> split index, by cumulative bucket counts."""

    def __init__(self, buckets: list[int], feature_name: str | None):
        self._bounds = [sum(buckets[: i + 1]) for i in range(len(buckets))]
        self._feature = feature_name

    def __call__(self, record, num_partitions):
        path, row, serialized = record
        bucket = _bucket(_partition_key(serialized, self._feature, f"{path}:{row}"), self._bounds[-1])
        return next(i for i, bound in enumerate(self._bounds) if bucket < bound)


def _finish_schema(stats, schema_dir: str, expected_path: str | None, required: list[str], source: str,
                   columns: list[str] | None):
    if stats["_n"] == 0:
        return
    inferred = schema_inference.schema_from_stats(stats)
    present = {f.name for f in inferred.feature}
    empty = schema_inference.add_empty_columns(inferred, columns) if columns is not None else []
    for name in required:
        if name not in present:
            raise InputDataError(
                f"{source}: required column {name!r} is missing",
                hint=f"the data has: {', '.join(sorted(present))}",
            )
    schema = inferred
    if expected_path:
        schema = schema_inference.read_schema(expected_path)
        schema_inference.check_against(schema, inferred, source)
        schema_inference.add_empty_columns(schema, empty)  # those it does not name; it refused any it names
    schema_inference.write_schema(schema, artifacts.schema_path(schema_dir))


def run(inputs: Mapping[str, str], outputs: Mapping[str, str], params: Mapping[str, Any]) -> dict:
    files = sources.expand_inputs(params["input_path"])
    source = params["input_path"]
    required = list(params["required_columns"])
    numeric = list(params["numeric_columns"])
    split_names = list(params["splits"])
    buckets = [params["splits"][name] for name in split_names]

    if params["input_format"] == "csv":
        header = sources.read_csv_header(files[0], params["encoding"])
        for other in files[1:]:
            other_header = sources.read_csv_header(other, params["encoding"])
            if other_header != header:
                glob_hint = f"; a glob such as {os.path.join(source, '*.csv')} picks the parts alone" \
                    if file_system.isdir(source) else ""
                raise InputDataError(
                    f"{other}: header differs from {files[0]}: {sources.header_difference(other_header, header)}",
                    hint=f"every input file must hold the same columns in the same order{glob_hint}")
        for name in [*required, *numeric]:
            if name not in header:
                kind = "required" if name in required else "numeric"
                raise InputDataError(f"{files[0]}:1: {kind} column {name!r} is missing",
                                     hint=sources.describe_header(header))
    elif not any(sources.has_any_record(f) for f in files):
        raise InputDataError(f"{source}: the TFRecord input holds no records")

    with artifacts.publish(outputs["examples"]) as examples_dir, artifacts.publish(outputs["schema"]) as schema_dir:
        pipeline = make_pipeline(params["beam_pipeline_args"])
        file_list = pipeline | "ListFiles" >> beam.Create(files)
        if params["input_format"] == "csv":
            rows = file_list | "ReadCsv" >> beam.ParDo(
                sources.ReadCsvRows(header, params["na_values"], params["skip_bad_rows"], required, numeric,
                                    params["encoding"])
            )
            kinds = rows | "InferColumnKinds" >> beam.CombineGlobally(sources.ColumnKinds(header))
            total = rows | "CountRows" >> beam.combiners.Count.Globally()  # for ToExample's progress lines
            records = rows | "ToExample" >> beam.ParDo(sources.CsvRowsToExamples(params["skip_bad_rows"]),
                                                       kinds=beam.pvalue.AsSingleton(kinds),
                                                       total_rows=beam.pvalue.AsSingleton(total))
        else:
            records = file_list | "ReadTFRecord" >> beam.ParDo(
                sources.ReadTFRecordExamples(params["skip_bad_rows"], required, numeric)
            )

        _ = (
            records
            | "FeatureStats" >> beam.CombineGlobally(schema_inference.FeatureStats())
            | "WriteSchema" >> beam.Map(
                _finish_schema, schema_dir, params["schema_path"], required, source,
                header if params["input_format"] == "csv" else None)
        )
        parts = records | "SplitByHash" >> beam.Partition(
            _SplitByHash(buckets, params["partition_feature"]), len(split_names)
        )
        for index, name in enumerate(split_names):
            counter = beam.metrics.Metrics.counter(sources.NAMESPACE, f"examples_{name}")

            def _count(record, counter=counter):
                counter.inc()
                return record[2]

            _ = (
                parts[index]
                | f"Count[{name}]" >> beam.Map(_count)
                | f"Write[{name}]" >> beam.io.WriteToTFRecord(
                    os.path.join(artifacts.split_dir(examples_dir, name), artifacts.EXAMPLES_FILE_PREFIX),
                    file_name_suffix=artifacts.TFRECORD_GZ_SUFFIX,
                    num_shards=params["num_shards"],
                )
            )
        result = run_pipeline(pipeline)

        counts = {name: counter_value(result, sources.NAMESPACE, f"examples_{name}") for name in split_names}
        bad_rows = counter_value(result, sources.NAMESPACE, "bad_rows")
        if sum(counts.values()) == 0:
            raise InputDataError(f"{source}: no usable rows ({bad_rows} bad rows skipped)")
        empty = [name for name, count in counts.items() if count == 0]
        if empty:
            raise InputDataError(
                f"{source}: split(s) {', '.join(empty)} got no examples from {sum(counts.values())} rows",
                hint="use more data or change the split buckets",
            )
        artifacts.record_shard_sizes(examples_dir)
    empty_columns = [f.name for f in schema_inference.read_schema(artifacts.schema_path(outputs["schema"])).feature
                     if schema_inference.is_empty_column(f)]
    if empty_columns:
        sources.log.warning("ExampleGen: column(s) %s hold no value in any row; the schema names them as DISABLED "
                            "features, which tf.Transform and TFX's readers skip", ", ".join(empty_columns))
    if bad_rows:
        sources.log.warning("ExampleGen skipped %d bad row(s) of %d (skip_bad_rows=true); the log above names the "
                            "first", bad_rows, bad_rows + sum(counts.values()))
    return {"split_counts": counts, "bad_rows": bad_rows, "input_files": len(files),
            "empty_columns": empty_columns}
