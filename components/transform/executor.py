"""Transform executor: analyze the train split with tf.Transform, transform every split.

Writes the TransformGraph in TFX layout (transform_fn/, transformed_metadata/, metadata/),
GZIP transformed examples per split, and the InputPipeline spec. Examples are read, decoded, encoded and written
a batch at a time in native code (example_io), so that Beam handles thousands of elements, not millions.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any
from collections.abc import Mapping

import apache_beam as beam
from tensorflow_metadata.proto.v0 import schema_pb2

from hpml.components import artifacts, beam_utils, files, publishing
from hpml.components.beam_utils import make_pipeline, run_pipeline, ship_by_value
from hpml.components.errors import InputDataError, SpecError
from hpml.components.schema_file import is_empty_column, read_schema
from hpml.components.transform import example_io, tuning
from hpml.components.user_module import failing_line, load_function
from hpml.components.results import RECORD_KEY
from hpml.components.transform.record import run_record

log = logging.getLogger(__name__)


def _check_required_features(schema, required: list[str], where: str) -> None:
    names = {f.name for f in schema.feature if not is_empty_column(f)}
    empty = {f.name for f in schema.feature if is_empty_column(f)}
    for name in required:
        if name in empty:
            raise InputDataError(f"{where}: feature {name!r} is a column with no value in any row of the input",
                                 hint="check the export that wrote the data; ExampleGen's log names every such "
                                      "column")
        if name not in names:
            raise InputDataError(
                f"{where}: feature {name!r} is not in the schema",
                hint=f"the schema has: {', '.join(sorted(names))}",
            )


_TYPE_NAMES = {schema_pb2.INT: "int", schema_pb2.FLOAT: "float", schema_pb2.BYTES: "string"}


def _guarded(preprocessing_fn, schema):
    """`preprocessing_fn`, with a mistake in it (a feature the data lacks, an analyzer given the wrong type)
    reported as a SpecError naming the line of the user's file and listing the raw features. tf.Transform
    traces the function while the Beam pipeline is built, so the error would otherwise surface bare."""
    features = ", ".join(f"{f.name} ({_TYPE_NAMES.get(f.type, 'unknown')})" for f in schema.feature
                         if not is_empty_column(f))
    hint = f"the raw features are: {features}"

    @functools.wraps(preprocessing_fn)
    def checked(inputs):
        try:
            outputs = preprocessing_fn(inputs)
        except Exception as err:
            if publishing.names_scratch(str(err)):
                raise  # the store failed tf.Transform's own temporary files: not the user's mistake, and retryable
            where = failing_line(err, preprocessing_fn)
            if isinstance(err, KeyError) and err.args and isinstance(err.args[0], str) and err.args[0] not in inputs:
                raise SpecError(f"Transform: preprocessing_fn reads feature {err.args[0]!r}, which the raw "
                                f"examples do not have ({where})", hint=hint) from err
            raise SpecError(f"Transform: preprocessing_fn failed at {where}: {type(err).__name__}: {err}",
                            hint=hint) from err
        _check_output_shapes(outputs, preprocessing_fn)
        return outputs

    return checked


def _check_output_shapes(outputs, preprocessing_fn) -> None:
    """A dense output needs a known size in every dimension but the batch one. tf.Transform finds out only
    when it writes its SavedModel, after the analysis, as a bare ValueError deep in a Beam stack trace."""
    import tensorflow as tf

    if not isinstance(outputs, Mapping):
        return  # tf.Transform's own error says what it expects
    for name, value in outputs.items():
        if not isinstance(value, tf.Tensor) or (value.shape.rank is not None and None not in value.shape[1:]):
            continue
        code = getattr(preprocessing_fn, "__code__", None)
        where = f" ({preprocessing_fn.__name__}, {code.co_filename}:{code.co_firstlineno})" if code else ""
        shape = "unknown" if value.shape.rank is None else str(tuple(value.shape.as_list()))
        raise SpecError(
            f"Transform: preprocessing_fn's output {name!r} has shape {shape}{where}: apart from the batch "
            "dimension, every dimension must have a known size",
            hint="give it one: tft.sparse_tensor_to_dense_with_shape(x, [None, 1]) for a sparse input, or "
                 "tf.reshape(x, [-1, n]); return a tf.SparseTensor or tf.RaggedTensor for a varying length")


def _numeric_ranges(record_batch) -> dict:
    """{feature: [min, max, finite values, non-finite values]} over one batch of transformed examples' numeric
    features; min and max are of the finite values (None where there are none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ranges = {}
    for name, column in zip(record_batch.schema.names, record_batch.columns):
        values = column.flatten() if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) else column
        if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
            continue
        non_finite = 0
        if pa.types.is_floating(values.type):
            finite = pc.is_finite(values)
            non_finite = pc.sum(pc.invert(finite)).as_py() or 0
            values = values.filter(finite)
        extremes = pc.min_max(values)
        count = len(values) - values.null_count
        if count or non_finite:
            ranges[name] = [extremes["min"].as_py(), extremes["max"].as_py(), count, non_finite]
    return ranges


def _merge_range(mine: list | None, other: list) -> list:
    if mine is None:
        return list(other)
    low = [v for v in (mine[0], other[0]) if v is not None]
    high = [v for v in (mine[1], other[1]) if v is not None]
    return [min(low) if low else None, max(high) if high else None, mine[2] + other[2], mine[3] + other[3]]


class _FeatureRanges(beam.CombineFn):
    """Per split, each numeric feature's smallest and largest finite value, and how many finite and non-finite
    values it has: {split: {feature: [min, max, finite, non-finite]}}."""

    def create_accumulator(self):
        return {}

    def add_input(self, acc, ranges):
        return self.merge_accumulators([acc, ranges])

    def merge_accumulators(self, accs):
        merged = {}
        for acc in accs:
            for split, features in acc.items():
                mine = merged.setdefault(split, {})
                for name, found in features.items():
                    mine[name] = _merge_range(mine.get(name), found)
        return merged

    def extract_output(self, acc):
        return acc


def _write_json(value, path: str) -> None:
    files.write_text(path, json.dumps(value))


def _constant_features(ranges: Mapping[str, Mapping[str, list]], splits) -> list[str]:
    """The numeric features that hold one value in every example of `splits` that has them: the model can
    learn nothing from them."""
    merged: dict[str, list] = {}
    for split in splits:
        for name, found in ranges.get(split, {}).items():
            merged[name] = _merge_range(merged.get(name), found)
    return sorted(name for name, (low, high, count, _) in merged.items() if count > 1 and low == high)


def _check_finite(ranges: Mapping[str, Mapping[str, list]], splits) -> None:
    """Refuses transformed features holding NaN or an infinity: the raw examples hold none (ExampleGen refuses
    them), so the preprocessing_fn made them, and training on them diverges at its first step."""
    problems = []
    for name in sorted({name for features in ranges.values() for name, found in features.items() if found[3]}):
        counts = [f"{found[3]} of {found[2] + found[3]} {split} values"
                  for split in splits if (found := ranges.get(split, {}).get(name)) and found[3]]
        problems.append(f"feature {name!r} NaN or infinite in {' and '.join(counts)}")
    if not problems:
        return
    raise InputDataError(
        "Transform: preprocessing_fn made " + "; ".join(problems),
        hint="look for a log of zero or of a negative number, a division by zero or a square root of a negative "
             "number in preprocessing_fn (tf.math.log1p, tf.math.divide_no_nan or clipping guard against them)")


def run(inputs: Mapping[str, str], outputs: Mapping[str, str], params: Mapping[str, Any]) -> dict:
    import tensorflow_transform as tft
    from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io
    from tfx_bsl.public import tfxio

    schema_file = artifacts.schema_path(inputs["schema"])
    schema = read_schema(schema_file)
    _check_required_features(schema, list(params["required_features"]), schema_file)
    user_fn = load_function(params["module"], params["preprocessing_fn"])
    ship_by_value(user_fn)
    preprocessing_fn = _guarded(user_fn, schema)

    splits = artifacts.list_splits(inputs["examples"])
    for name in params["analyze_splits"]:
        if name not in splits:
            raise SpecError(f"Transform: analyze split {name!r} is not in the examples ({', '.join(splits)})")

    # every shard there, and whole, before any work
    shards = {split: artifacts.require_files(artifacts.examples_file_pattern(inputs["examples"], split),
                                             f"Examples split {split}") for split in splits}
    tensor_adapter_config = tfxio.TFExampleRecord(
        file_pattern=shards[splits[0]], schema=schema, telemetry_descriptors=["hpml"]).TensorAdapterConfig()

    # When this attempt began (from the component's `publishing.attempt`) orders it against its retry.
    with publishing.publish(outputs["transform_graph"]) as graph_dir, \
            publishing.publish(outputs["transformed_examples"]) as examples_dir, \
            publishing.publish(outputs["input_pipeline"]) as pipeline_dir, \
            publishing.scratch_space(outputs["transform_graph"]) as scratch:
        metadata_io.write_metadata(
            dataset_metadata.DatasetMetadata(schema), os.path.join(graph_dir, tft.TFTransformOutput.RAW_METADATA_DIR)
        )
        pipeline = make_pipeline(params["beam_pipeline_args"], sum(files.size(path) for split in splits
                                                                  for path in shards[split]),
                                 parallel_from=beam_utils.TRANSFORM_PARALLEL_BYTES)
        ranges, counts = _analyze_and_transform(pipeline, shards, schema, tensor_adapter_config, preprocessing_fn,
                                                params["analyze_splits"], graph_dir, examples_dir, scratch)
        artifacts.record_split_examples(examples_dir, {split: counts.get(split, 0) for split in splits})
        artifacts.record_shard_sizes(examples_dir)
        constant = _checked_ranges(ranges, list(params["analyze_splits"]), splits)
        transformed_schema = tft.TFTransformOutput(graph_dir).transformed_metadata.schema
        tuned = tuning.write_input_pipeline(
            artifacts.transformed_examples_file_pattern(examples_dir, params["analyze_splits"][0]), transformed_schema,
            pipeline_dir, params)
    result = {"splits": splits, "transformed_features": sorted(f.name for f in transformed_schema.feature),
              "input_pipeline": tuned, "constant_features": constant}
    return {**result, RECORD_KEY: run_record(result).to_json()}


def _analyze_and_transform(pipeline, shards: dict, schema, tensor_adapter_config, preprocessing_fn,
                           analyze_splits: list[str], graph_dir: str, examples_dir: str,
                           scratch: str) -> tuple[dict, dict]:
    """tf.Transform's full pass as one Beam pipeline: analyze the analyze splits, write the transform graph, and
    transform and write every split. Returns each feature's value range over the transformed splits, and each
    split's examples."""
    import tensorflow_transform.beam as tft_beam

    with tft_beam.Context(temp_dir=scratch):
        analyze_data = [
            pipeline | f"Read[{s}]ForAnalysis" >> example_io.ReadExampleBatches(shards[s], schema)
            for s in analyze_splits
        ] | "FlattenAnalysis" >> beam.Flatten()
        transform_fn = (
            (analyze_data, tensor_adapter_config) | "Analyze" >> tft_beam.AnalyzeDataset(preprocessing_fn))
        _ = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(graph_dir)
        ranges, counts = [], []
        for split in shards:
            raw = pipeline | f"Read[{split}]" >> example_io.ReadExampleBatches(shards[split], schema)
            transformed, _ = (
                ((raw, tensor_adapter_config), transform_fn)
                | f"Transform[{split}]" >> tft_beam.TransformDataset(output_record_batches=True))
            batches = transformed | f"Batches[{split}]" >> beam.Map(lambda batch: batch[0])
            ranges.append(batches | f"Ranges[{split}]" >> beam.Map(
                lambda batch, split=split: {split: _numeric_ranges(batch)}))
            counts.append(batches | f"Count[{split}]" >> beam.Map(lambda batch, split=split: (split, batch.num_rows)))
            prefix = os.path.join(artifacts.split_dir(examples_dir, split), artifacts.TRANSFORMED_EXAMPLES_FILE_PREFIX)
            _ = batches | f"Write[{split}]" >> example_io.WriteExampleShards(
                prefix, os.path.join(scratch, "written", split), fence=publishing.writer_fence(examples_dir))
        ranges_path = os.path.join(scratch, "feature_ranges.json")
        _ = (ranges | "FlattenRanges" >> beam.Flatten() | "FeatureRanges" >> beam.CombineGlobally(_FeatureRanges())
             | "WriteRanges" >> beam.Map(_write_json, ranges_path))
        counts_path = os.path.join(scratch, "split_examples.json")
        _ = (counts | "FlattenCounts" >> beam.Flatten() | "SplitExamples" >> beam.CombinePerKey(sum)
             | "CountsAsDict" >> beam.combiners.ToDict() | "WriteCounts" >> beam.Map(_write_json, counts_path))
        run_pipeline(pipeline)
    return json.loads(files.read_text(ranges_path)), json.loads(files.read_text(counts_path))


def _checked_ranges(ranges: dict, analyzed: list[str], splits: list[str]) -> list[str]:
    """Refuse non-finite transformed values; return the features constant over the analyzed splits, with a
    warning that says why a feature may be."""
    _check_finite(ranges, analyzed + [split for split in splits if split not in analyzed])
    constant = _constant_features(ranges, analyzed)
    if constant:
        log.warning(
            "Transform: feature(s) %s hold one value in every transformed %s example, so the model can learn "
            "nothing from them. Either the raw column is constant, or it holds a value so extreme that the "
            "column's statistics overflowed (a z-score then divides by an infinite deviation): look at its "
            "largest values", ", ".join(constant), "+".join(analyzed))
    return constant
