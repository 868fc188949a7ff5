"""The serving export: a model of tf_keras's own layers is saved without the per-layer traces Keras's loader needs
only for classes it does not know, and loads back from its config; a model with a layer of its own keeps them."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
import tf_keras

from hpml.components import artifacts
from hpml.components.trainer.export import export_serving_model

PENGUIN_MODULE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "penguin", "module.py")


def _penguin():
    spec = importlib.util.spec_from_file_location("penguin_module_for_export", PENGUIN_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Doubled(tf_keras.layers.Layer):
    """A layer class Keras's loader does not know."""

    def call(self, x):
        return 2.0 * x


def _traced_layer_calls(serving: str) -> int:
    """How many of the SavedModel's functions are per-layer call traces (Keras's loader's, not a signature's)."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(serving, "saved_model.pb"), "rb") as handle:
        saved.ParseFromString(handle.read())
    return sum("call_and_return_conditional_losses" in name
               for name in saved.meta_graphs[0].object_graph_def.concrete_functions)


def _transformed(penguin, batch: int = 5) -> dict:
    features = {name: tf.random.stateless_normal([batch], seed=[1, i]) for i, name in
                enumerate(penguin.NUMERIC_FEATURES)}
    features.update({name: tf.constant([0, 1, 2, 1, 0][:batch], tf.int64) for name in penguin.CATEGORICAL_FEATURES})
    return features


def _loaded_elsewhere(serving: str, inputs: dict) -> np.ndarray:
    """The model loaded by tf_keras in a fresh process that has none of this test's classes, called on `inputs`."""
    script = textwrap.dedent("""
        import numpy as np, sys, tf_keras
        inputs = dict(np.load(sys.argv[2]))
        model = tf_keras.models.load_model(sys.argv[1], compile=False)
        np.save(sys.argv[3], model(inputs, training=False).numpy())
    """)
    folder = os.path.dirname(serving)
    np.savez(os.path.join(folder, "inputs.npz"), **{k: v.numpy() for k, v in inputs.items()})
    subprocess.run([sys.executable, "-c", script, serving, os.path.join(folder, "inputs.npz"),
                    os.path.join(folder, "out.npy")], check=True, capture_output=True,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    return np.load(os.path.join(folder, "out.npy"))


def test_a_model_of_keras_layers_is_exported_without_layer_traces_and_loads_from_its_config(penguin_outputs,
                                                                                            tmp_path):
    penguin = _penguin()
    tf_transform_output = tft.TFTransformOutput(penguin_outputs["Transform"]["transform_graph"])
    model = penguin.build_model(tf_transform_output, 0.01)
    inputs = _transformed(penguin)
    serving = artifacts.serving_model_path(str(tmp_path / "model"))
    export_serving_model(model, tf_transform_output, serving, penguin.LABEL_KEY, class_names=["a", "b", "c"])

    assert _traced_layer_calls(serving) == 0
    np.testing.assert_allclose(_loaded_elsewhere(serving, inputs), model(inputs, training=False).numpy(), rtol=1e-6)
    assert {"serving_default", "transform_features", "class_names"} <= set(tf.saved_model.load(serving).signatures)


def test_a_model_with_a_layer_of_its_own_keeps_the_traces_keras_loads_it_by(penguin_outputs, tmp_path):
    penguin = _penguin()
    tf_transform_output = tft.TFTransformOutput(penguin_outputs["Transform"]["transform_graph"])
    plain = penguin.build_model(tf_transform_output, 0.01)
    model = tf_keras.Model(plain.inputs, Doubled()(plain.outputs[0]))
    inputs = _transformed(penguin)
    serving = artifacts.serving_model_path(str(tmp_path / "model"))
    export_serving_model(model, tf_transform_output, serving, penguin.LABEL_KEY, class_names=["a", "b", "c"])

    assert _traced_layer_calls(serving) > 0
    np.testing.assert_allclose(_loaded_elsewhere(serving, inputs), model(inputs, training=False).numpy(), rtol=1e-6)
