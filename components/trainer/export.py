"""Export a Keras model as a SavedModel whose serving signature takes serialized raw tf.Examples.

The transform graph runs inside the exported model, so clients send raw features exactly as
ExampleGen wrote them, and TFX's Evaluator and Pusher can use the Model artifact. A
`transform_features` signature returns the transformed features, label included, so TFX's
Evaluator (TFMA) can read a transformed label through `preprocessing_function_names`. With class
names, another signature returns them in column order. Where every raw feature holds one value per example (a CSV
column), `serving_raw` takes raw features as one 1-D tensor each, for clients that send values, not tf.Examples (a
missing value is NaN, or "" for text; whole numbers that may be missing come as float64).
"""
from __future__ import annotations

import json
import os

import tensorflow as tf

from hpml.components import files
from hpml.components.artifacts import (CLASS_NAMES_SIGNATURE, EVAL_METRICS_FILE, RAW_FEATURES_SIGNATURE,
                                      TRANSFORM_FEATURES_SIGNATURE)


def write_eval_metrics(model_run_dir: str, metrics: dict) -> None:
    """Leave the eval split's metrics ({name: value}, e.g. model.evaluate(..., return_dict=True)) in the ModelRun,
    where the Trainer records them in the run record and the report shows them."""
    files.makedirs(model_run_dir)
    files.write_text(os.path.join(model_run_dir, EVAL_METRICS_FILE),
                     json.dumps({name: float(value) for name, value in metrics.items()}))


def export_serving_model(model, tf_transform_output, serving_model_dir: str, label_key: str,
                         class_names: list[str] | None = None, regression: bool = False) -> None:
    """Save `model` with the transform graph in front: a classifier's signature returns probabilities, class ids
    and (with `class_names`) classes; a regressor's (`regression=True`) returns predictions."""
    save_serving_model(model, tf_transform_output, serving_model_dir, label_key, class_names, regression)


def save_serving_model(model, tf_transform_output, serving_model_dir: str, label_key: str,
                       class_names: list[str] | None = None, regression: bool = False,
                       include_optimizer: bool = True) -> None:
    """What `export_serving_model` does, with the optimizer's state left out where `include_optimizer` is False."""
    model.tft_layer = tf_transform_output.transform_features_layer()
    model.save(serving_model_dir, save_format="tf", save_traces=not rebuilt_from_config(model),
               include_optimizer=include_optimizer,
               signatures=_signatures(model, tf_transform_output, label_key, class_names, regression))


def rebuilt_from_config(model) -> bool:
    """Whether Keras can load `model` back from its config alone: a Functional or Sequential model of tf_keras's own
    layers. Then the export skips tracing every layer's call for Keras's loader (about 40% of the export's time);
    a model with a layer or model class of its own keeps the traces, which is how Keras loads those without the
    class (a distillation teacher, the Evaluator). The serving signatures are traced either way."""
    import tf_keras

    transform = getattr(model, "tft_layer", None)  # tracked as an attribute, not a layer of the graph

    def built_in(layer) -> bool:
        return layer is transform or type(layer).__module__.startswith("tf_keras.") and (
            not isinstance(layer, tf_keras.Model) or all(built_in(inner) for inner in layer.layers))

    return built_in(model)


def _signatures(model, tf_transform_output, label_key: str, class_names: list[str] | None, regression: bool) -> dict:
    """The serving signatures, traced without AutoGraph: converting the transform graph's and the model's code
    took half the export's time, and Keras's save traces every layer without it anyway, so a model it saves
    needs none."""
    raw_spec = tf_transform_output.raw_feature_spec()
    raw_spec.pop(label_key, None)
    names = tf.constant(class_names or [], dtype=tf.string)
    examples = tf.TensorSpec(shape=[None], dtype=tf.string, name="examples")

    # One trace of the transform graph and the model, which both serving signatures call: they differ only in how
    # they get to parsed raw features (each traces its own where a feature is of a kind without a fixed spec).
    parsed_specs = {name: _parsed_spec(feature) for name, feature in raw_spec.items()}

    @tf.function(autograph=False, input_signature=[parsed_specs] if None not in parsed_specs.values() else None)
    def predict(parsed):
        transformed = model.tft_layer(parsed)
        transformed.pop(label_key, None)
        if regression:
            return {"predictions": tf.reshape(model(transformed, training=False), [-1])}
        probabilities = model(transformed, training=False)
        outputs = {"probabilities": probabilities, "class_ids": tf.argmax(probabilities, axis=-1)}
        if class_names:
            outputs["classes"] = tf.gather(names, outputs["class_ids"])
        return outputs

    @tf.function(autograph=False)
    def serve_tf_examples(serialized):
        return predict(tf.io.parse_example(serialized, raw_spec))

    @tf.function(autograph=False)
    def serve_raw_features(**features):
        return predict({name: _as_parsed(features[name], feature) for name, feature in raw_spec.items()})

    full_spec = tf_transform_output.raw_feature_spec()

    @tf.function(autograph=False)
    def transform_features(serialized):
        """The transformed features of labelled raw examples, as the Trainer saw them."""
        return model.tft_layer(tf.io.parse_example(serialized, full_spec))

    signatures = {"serving_default": serve_tf_examples.get_concrete_function(examples),
                  TRANSFORM_FEATURES_SIGNATURE: transform_features.get_concrete_function(examples)}
    if all(_one_value(feature) for feature in raw_spec.values()):
        signatures[RAW_FEATURES_SIGNATURE] = serve_raw_features.get_concrete_function(
            **{name: tf.TensorSpec([None], raw_input_dtype(feature), name=name) for name, feature in raw_spec.items()})
    if class_names:
        @tf.function(input_signature=[], autograph=False)
        def class_names_by_column():
            """Every probability column's class name, so a consumer needs no examples to learn them."""
            return {"class_names": names}

        signatures[CLASS_NAMES_SIGNATURE] = class_names_by_column.get_concrete_function()
    return signatures


def _parsed_spec(feature):
    """What tf.io.parse_example gives for a raw feature, and `_as_parsed` too: dense for a fixed-length feature, sparse
    for a variable-length one; None for other kinds."""
    if isinstance(feature, tf.io.FixedLenFeature):
        return tf.TensorSpec([None, *feature.shape], feature.dtype)
    if isinstance(feature, tf.io.VarLenFeature):
        return tf.SparseTensorSpec([None, None], feature.dtype)
    return None


def _one_value(feature) -> bool:
    """A feature with at most one value per example (a CSV column), which one 1-D tensor can carry."""
    if isinstance(feature, tf.io.FixedLenFeature):
        return list(feature.shape) in ([], [1])
    return isinstance(feature, tf.io.VarLenFeature)


def raw_input_dtype(feature):
    """What `serving_raw` takes for a raw feature: its own dtype, except float64 for an integer feature that may be
    missing, so that NaN can say so (exact for whole numbers up to 2**53)."""
    if isinstance(feature, tf.io.VarLenFeature) and feature.dtype.is_integer:
        return tf.float64
    return feature.dtype


def _as_parsed(values, feature):
    """One raw feature's 1-D tensor as tf.io.parse_example would give it: dense for a fixed-length feature; sparse
    for a variable-length one, without the values a client marks missing (NaN, or "" for strings)."""
    if isinstance(feature, tf.io.FixedLenFeature):
        return tf.reshape(values, [-1, *feature.shape])
    if values.dtype == tf.string:
        present = tf.not_equal(values, "")
    else:
        present = tf.logical_not(tf.math.is_nan(values))
    rows = tf.where(present)[:, 0]
    return tf.SparseTensor(tf.stack([rows, tf.zeros_like(rows)], axis=1),
                           tf.cast(tf.boolean_mask(values, present), feature.dtype),
                           dense_shape=tf.stack([tf.shape(values, out_type=tf.int64)[0], 1]))
