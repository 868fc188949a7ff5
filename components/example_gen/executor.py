"""ExampleGen executor: one Beam pipeline from raw files to split tf.Examples and a schema.

CSV input is planned into work items (pieces of large files, groups of small ones) that workers read side by side in
two passes, each holding one chunk of rows at a time: column kinds, then the typed examples, written by each item to
its own shard of every split (`csv_source`). TFRecord input is read a batch of records at a time
(`tfrecord_source`), each work item a group of whole files."""
from __future__ import annotations

import os
from typing import Any
from collections.abc import Mapping

import apache_beam as beam

from hpml.components import artifacts, publishing, schema_file
from hpml.components import files as file_system
from hpml.components.beam_utils import counter_value, make_pipeline, run_pipeline
from hpml.components.errors import InputDataError
from hpml.components.example_gen import csv_chunks, csv_header, csv_source, schema_inference, tfrecord_source
from hpml.components.example_gen import inputs as input_files
from hpml.components.example_gen.progress import NAMESPACE, log
from hpml.components.example_gen.record import run_record
from hpml.components.results import RECORD_KEY


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
        schema = schema_file.read_schema(expected_path)
        schema_inference.check_against(schema, inferred, source)
        schema_inference.add_empty_columns(schema, empty)  # those it does not name; it refused any it names
    schema_file.write_schema(schema, artifacts.schema_path(schema_dir))


def _renamed(header: list[str], renames: Mapping[str, str], path: str) -> list[str]:
    """The header's names as feature names: each CSV column that `renames` names takes its new name."""
    unknown = [column for column in renames if column not in header]
    if unknown:
        raise InputDataError(f"{path}:1: rename_columns names column(s) {', '.join(map(repr, unknown))} that the "
                             "header does not hold", hint=csv_header.describe_header(header))
    features = [renames.get(name, name) for name in header]
    clashes = sorted({name for name in features if features.count(name) > 1})
    if clashes:
        raise InputDataError(f"{path}:1: after rename_columns, feature name(s) {', '.join(map(repr, clashes))} "
                             "name more than one column", hint="give each column a feature name of its own")
    return features


def run(inputs: Mapping[str, str], outputs: Mapping[str, str], params: Mapping[str, Any]) -> dict:
    files = input_files.expand_inputs(params["input_path"])
    source = params["input_path"]
    required = list(params["required_columns"])
    numeric = list(params["numeric_columns"])
    split_names = list(params["splits"])
    buckets = [params["splits"][name] for name in split_names]

    if params["input_format"] == "csv":
        header = _checked_csv_header(files, source, params, [*required, *numeric], required)
    elif params["rename_columns"]:
        raise InputDataError(f"{source}: rename_columns applies to CSV input; TFRecord input keeps its feature names",
                             hint="leave rename_columns out with input_format='tfrecord'")
    elif not any(input_files.has_any_record(f) for f in files):
        raise InputDataError(f"{source}: the TFRecord input holds no records")

    with publishing.publish(outputs["examples"]) as examples_dir, publishing.publish(outputs["schema"]) as schema_dir:
        pipeline = make_pipeline(params["beam_pipeline_args"], sum(file_system.size(path) for path in files))
        if params["input_format"] == "csv":
            stats = _write_csv_examples(pipeline, files, header, params, examples_dir, split_names, buckets)
        else:
            stats = _write_tfrecord_examples(pipeline, files, params, examples_dir, split_names, buckets)
        _ = (
            stats
            | "WriteSchema" >> beam.Map(
                _finish_schema, schema_dir, params["schema_path"], required, source,
                header if params["input_format"] == "csv" else None)
        )
        result = run_pipeline(pipeline)

        counts, bad_rows = _checked_counts(result, source, split_names)
        artifacts.record_split_examples(examples_dir, counts)
        artifacts.record_shard_sizes(examples_dir)
    empty_columns = [f.name for f in schema_file.read_schema(artifacts.schema_path(outputs["schema"])).feature
                     if schema_file.is_empty_column(f)]
    if empty_columns:
        log.warning("ExampleGen: column(s) %s hold no value in any row; the schema names them as DISABLED "
                    "features, which tf.Transform and TFX's readers skip", ", ".join(empty_columns))
    if bad_rows:
        log.warning("ExampleGen skipped %d bad row(s) of %d (skip_bad_rows=true); the log above names the "
                    "first", bad_rows, bad_rows + sum(counts.values()))
    result = {"split_counts": counts, "bad_rows": bad_rows, "input_files": len(files),
              "empty_columns": empty_columns}
    return {**result, RECORD_KEY: run_record(result).to_json()}


def _checked_csv_header(files: list[str], source: str, params: Mapping[str, Any], columns: list[str],
                        required: list[str]) -> list[str]:
    """The CSV files' one header, renamed as asked; files whose headers differ, or a missing required or numeric
    column, are refused with the file and line."""
    header = csv_header.read_csv_header(files[0], params["encoding"])
    for other in files[1:]:
        other_header = csv_header.read_csv_header(other, params["encoding"])
        if other_header != header:
            glob_hint = f"; a glob such as {os.path.join(source, '*.csv')} picks the parts alone" \
                if file_system.isdir(source) else ""
            raise InputDataError(
                f"{other}: header differs from {files[0]}: {csv_header.header_difference(other_header, header)}",
                hint=f"every input file must hold the same columns in the same order{glob_hint}")
    header = _renamed(header, params["rename_columns"], files[0])
    for name in columns:
        if name not in header:
            kind = "required" if name in required else "numeric"
            raise InputDataError(f"{files[0]}:1: {kind} column {name!r} is missing",
                                 hint=csv_header.describe_header(header))
    return header


def _checked_counts(result, source: str, split_names: list[str]) -> tuple[dict[str, int], int]:
    """Examples per split and bad rows skipped, from the pipeline's counters; no example, or a split left empty,
    is an error."""
    counts = {name: counter_value(result, NAMESPACE, f"examples_{name}") for name in split_names}
    bad_rows = counter_value(result, NAMESPACE, "bad_rows")
    if sum(counts.values()) == 0:
        raise InputDataError(f"{source}: no usable rows ({bad_rows} bad rows skipped)")
    empty = [name for name, count in counts.items() if count == 0]
    if empty:
        raise InputDataError(
            f"{source}: split(s) {', '.join(empty)} got no examples from {sum(counts.values())} rows",
            hint="use more data or change the split buckets",
        )
    return counts, bad_rows


def _spread(pipeline, items):
    """The work items, numbered, spread over the runner's workers (Create alone would keep them on one)."""
    return pipeline | "PlanWork" >> beam.Create(list(enumerate(items))) | "Spread" >> beam.Reshuffle()


def _write_csv_examples(pipeline, files, header, params, examples_dir, split_names, buckets):
    """The CSV passes; returns the PCollection of the schema's feature statistics."""
    items = csv_chunks.plan_work(files, params["encoding"], params["num_shards"])
    settings = csv_source.CsvSettings(header, params["na_values"], params["skip_bad_rows"],
                                      params["required_columns"], params["numeric_columns"], params["encoding"])
    work = _spread(pipeline, items)
    kinds = (work
             | "InferColumnKinds" >> beam.ParDo(csv_source.ColumnKinds(settings))
             | "CollectKinds" >> beam.combiners.ToList()
             | "MergeKinds" >> beam.Map(csv_source.merge_kinds, list(header)))
    return (work
            | "WriteExamples" >> beam.ParDo(
                csv_source.WriteCsvExamples(settings, examples_dir, split_names, buckets, len(items),
                                            params["partition_feature"]),
                pass1=beam.pvalue.AsSingleton(kinds))
            | "FeatureStats" >> beam.CombineGlobally(schema_inference.MergedFeatureStats()))


def _write_tfrecord_examples(pipeline, files, params, examples_dir, split_names, buckets):
    """TFRecord input, whole files as work items; returns the PCollection of the schema's feature statistics."""
    items = csv_chunks.group_pieces([csv_chunks.Piece(path) for path in files], params["num_shards"])
    return (_spread(pipeline, items)
            | "WriteExamples" >> beam.ParDo(tfrecord_source.WriteTFRecordExamples(
                params["skip_bad_rows"], params["required_columns"], params["numeric_columns"], examples_dir,
                split_names, buckets, len(items), params["partition_feature"]))
            | "FeatureStats" >> beam.CombineGlobally(schema_inference.MergedFeatureStats()))
