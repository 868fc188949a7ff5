"""Export a Keras model as a SavedModel whose serving signature takes serialized raw tf.Examples.

The transform graph runs inside the exported model, so clients send raw features exactly as
ExampleGen wrote them, and TFX's Evaluator and Pusher can use the Model artifact. A
`transform_features` signature returns the transformed features, label included, so TFX's
Evaluator (TFMA) can read a transformed label through `preprocessing_function_names`. With class
names, another signature returns them in column order.
"""
from __future__ import annotations

import json
import os

import tensorflow as tf

from hpml.components import files
from hpml.components.artifacts import CLASS_NAMES_SIGNATURE, EVAL_METRICS_FILE, TRANSFORM_FEATURES_SIGNATURE


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
    model.tft_layer = tf_transform_output.transform_features_layer()
    raw_spec = tf_transform_output.raw_feature_spec()
    raw_spec.pop(label_key, None)
    names = tf.constant(class_names or [], dtype=tf.string)

    @tf.function(input_signature=[tf.TensorSpec(shape=[None], dtype=tf.string, name="examples")])
    def serve_tf_examples(serialized):
        parsed = tf.io.parse_example(serialized, raw_spec)
        transformed = model.tft_layer(parsed)
        transformed.pop(label_key, None)
        if regression:
            return {"predictions": tf.reshape(model(transformed, training=False), [-1])}
        probabilities = model(transformed, training=False)
        outputs = {"probabilities": probabilities, "class_ids": tf.argmax(probabilities, axis=-1)}
        if class_names:
            outputs["classes"] = tf.gather(names, outputs["class_ids"])
        return outputs

    full_spec = tf_transform_output.raw_feature_spec()

    @tf.function(input_signature=[tf.TensorSpec(shape=[None], dtype=tf.string, name="examples")])
    def transform_features(serialized):
        """The transformed features of labelled raw examples, as the Trainer saw them."""
        return model.tft_layer(tf.io.parse_example(serialized, full_spec))

    signatures = {"serving_default": serve_tf_examples, TRANSFORM_FEATURES_SIGNATURE: transform_features}
    if class_names:
        @tf.function(input_signature=[])
        def class_names_by_column():
            """Every probability column's class name, so a consumer needs no examples to learn them."""
            return {"class_names": names}

        signatures[CLASS_NAMES_SIGNATURE] = class_names_by_column
    model.save(serving_model_dir, save_format="tf", signatures=signatures)
