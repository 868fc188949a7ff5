"""SoftTargets executor: every split of the transformed examples gets a `soft_targets` float feature
holding the teachers' averaged softened probabilities, so a student trains on them without ever
running a teacher again. Same TFX layout as the input; `soft_targets.json` records T and classes."""
from __future__ import annotations

import json
import os
from typing import Any
from collections.abc import Mapping

import apache_beam as beam

from hpml.components import artifacts, files, publishing
from hpml.components.beam_utils import make_pipeline, run_pipeline
from hpml.components.errors import SpecError
from hpml.components.trainer.distill.mode import CACHE_FILE, SOFT_TARGETS_FEATURE, teacher_serving_dir
from hpml.components.results import RECORD_KEY, RunRecord


def _teacher_inputs(teacher, features: dict) -> dict:
    """The features a teacher's Keras model declares (all of them when it does not say)."""
    names = getattr(teacher, "input_names", None)
    return {k: v for k, v in features.items() if k in names} if names else features


class AddSoftTargets(beam.DoFn):
    """Batches of serialized transformed examples in, the same examples plus soft targets out."""

    def __init__(self, teacher_dirs, feature_spec, label_key, temperature):
        self._teacher_dirs, self._feature_spec = list(teacher_dirs), feature_spec
        self._label_key, self._temperature = label_key, temperature

    def setup(self):
        import tf_keras

        self._teachers = [tf_keras.models.load_model(path, compile=False) for path in self._teacher_dirs]

    def process(self, batch):
        import tensorflow as tf

        from hpml.components.trainer.distill.loss import ensemble_soft_targets

        features = tf.io.parse_example(tf.constant(batch), self._feature_spec)
        features.pop(self._label_key, None)
        probabilities = [t(_teacher_inputs(t, features), training=False) for t in self._teachers]
        targets = ensemble_soft_targets(probabilities, self._temperature).numpy()
        for serialized, row in zip(batch, targets):
            example = tf.train.Example.FromString(serialized)
            example.features.feature[SOFT_TARGETS_FEATURE].float_list.value.extend(row.tolist())
            yield example.SerializeToString(deterministic=True)


def _class_counts(teacher_dirs, feature_spec, label_key, sample_file) -> int:
    """Every teacher must predict the same number of classes; refused before the Beam pass otherwise."""
    import tensorflow as tf
    import tf_keras

    records = [r.numpy() for r in tf.data.TFRecordDataset(sample_file, compression_type="GZIP").take(4)]
    features = tf.io.parse_example(tf.constant(records), feature_spec)
    features.pop(label_key, None)
    counts = {}
    for path in teacher_dirs:
        teacher = tf_keras.models.load_model(path, compile=False)
        counts[path] = int(teacher(_teacher_inputs(teacher, features), training=False).shape[-1])
    if len(set(counts.values())) > 1:
        raise SpecError("SoftTargets: the teachers predict different numbers of classes: "
                        + ", ".join(f"{path}: {n}" for path, n in counts.items()))
    return next(iter(counts.values()))


def run(inputs: Mapping[str, str], outputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict:
    import tensorflow_transform as tft

    if not inputs["teachers"]:
        raise SpecError("SoftTargets: needs at least one teacher Model artifact")
    teacher_dirs = [teacher_serving_dir(uri) for uri in inputs["teachers"]]
    feature_spec = tft.TFTransformOutput(inputs["transform_graph"]).transformed_feature_spec()
    if params["label_key"] not in feature_spec:
        raise SpecError(f"SoftTargets: label_key {params['label_key']!r} is not a transformed feature",
                        hint=f"transformed features: {', '.join(sorted(feature_spec))}")
    splits = artifacts.list_splits(inputs["examples"])
    shards = {s: artifacts.require_files(artifacts.transformed_examples_file_pattern(inputs["examples"], s),
                                        f"SoftTargets examples split {s}") for s in splits}
    num_classes = _class_counts(teacher_dirs, feature_spec, params["label_key"], shards[splits[0]][0])
    temperature = float(params["temperature"])
    with publishing.publish(outputs["examples"]) as out_dir:
        pipeline = make_pipeline(params["beam_pipeline_args"])
        for split in splits:
            _ = (
                pipeline
                | f"Read[{split}]" >> beam.io.ReadFromTFRecord(
                    artifacts.transformed_examples_file_pattern(inputs["examples"], split))
                | f"Batch[{split}]" >> beam.BatchElements(min_batch_size=params["batch_size"],
                                                          max_batch_size=params["batch_size"])
                | f"Teach[{split}]" >> beam.ParDo(AddSoftTargets(teacher_dirs, feature_spec, params["label_key"],
                                                                 temperature))
                | f"Write[{split}]" >> beam.io.WriteToTFRecord(
                    os.path.join(artifacts.split_dir(out_dir, split), artifacts.TRANSFORMED_EXAMPLES_FILE_PREFIX),
                    file_name_suffix=artifacts.TFRECORD_GZ_SUFFIX)
            )
        run_pipeline(pipeline)
        artifacts.record_shard_sizes(out_dir)
        record = {"temperature": temperature, "num_classes": num_classes, "teachers": list(inputs["teachers"]),
                  "splits": splits, "label_key": params["label_key"]}
        files.write_text(os.path.join(out_dir, CACHE_FILE), json.dumps(record, indent=2))
    return {"soft_targets": record,
            RECORD_KEY: RunRecord(files={"examples": (artifacts.SOFT_TARGETS_FILE,)}).to_json()}
