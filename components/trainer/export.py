"""Export a Keras model as a SavedModel whose serving signature takes serialized raw tf.Examples.

The transform graph runs inside the exported model, so clients send raw features exactly as
ExampleGen wrote them, and TFX's Evaluator and Pusher can use the Model artifact. With class
names, a second signature returns them in column order.
"""
from __future__ import annotations

import tensorflow as tf

from components.artifacts import CLASS_NAMES_SIGNATURE


def export_serving_model(model, tf_transform_output, serving_model_dir: str, label_key: str,
                         class_names: list[str] | None = None) -> None:
    model.tft_layer = tf_transform_output.transform_features_layer()
    raw_spec = tf_transform_output.raw_feature_spec()
    raw_spec.pop(label_key, None)
    names = tf.constant(class_names or [], dtype=tf.string)

    @tf.function(input_signature=[tf.TensorSpec(shape=[None], dtype=tf.string, name="examples")])
    def serve_tf_examples(serialized):
        parsed = tf.io.parse_example(serialized, raw_spec)
        transformed = model.tft_layer(parsed)
        transformed.pop(label_key, None)
        probabilities = model(transformed, training=False)
        outputs = {"probabilities": probabilities, "class_ids": tf.argmax(probabilities, axis=-1)}
        if class_names:
            outputs["classes"] = tf.gather(names, outputs["class_ids"])
        return outputs

    signatures = {"serving_default": serve_tf_examples}
    if class_names:
        @tf.function(input_signature=[])
        def class_names_by_column():
            """Every probability column's class name, so a consumer needs no examples to learn them."""
            return {"class_names": names}

        signatures[CLASS_NAMES_SIGNATURE] = class_names_by_column
    model.save(serving_model_dir, save_format="tf", signatures=signatures)
