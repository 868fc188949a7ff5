"""ServingExport saves the serving model from a twin during fit and writes only the trained weights after it: the
published SavedModel must serve exactly what `export_serving_model` of the same model serves."""
import glob
import logging
import os
import random
import textwrap
from random import Random

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
import tf_keras

from hpml.components import artifacts
from hpml.components.trainer import TRAINER
from hpml.components.trainer.callbacks import ServingExport
from hpml.components.trainer.export import export_serving_model
from test_export import Doubled, _penguin, _transformed
from tests.helpers import trainer_inputs

CLASSES = ["a", "b", "c"]


def _raw_examples(penguin_outputs, count: int = 32) -> tf.Tensor:
    """Serialized raw tf.Examples of the eval split, as a client sends them."""
    files = sorted(glob.glob(os.path.join(penguin_outputs["ExampleGen"]["examples"], "Split-eval", "*.gz")))
    return tf.stack(list(tf.data.TFRecordDataset(files, compression_type="GZIP").take(count)))


def _train(model, penguin, export: ServingExport) -> dict:
    """Three epochs of fit with `export` among the callbacks; what the export had begun by the end of fit."""
    features = _transformed(penguin, 5)
    features = {name: tf.tile(value, [40]) for name, value in features.items()}
    labels = tf.tile(tf.constant([0, 1, 2, 1, 0], tf.int64), [40])
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(20)
    seen = {}

    class Watch(tf_keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            seen["staging_started"] = export._thread is not None

    model.fit(data, epochs=3, callbacks=[export, Watch()], verbose=0)
    return seen


class _Records(logging.Handler):
    """The messages TensorFlow's logger passes on, as the Trainer's log would show them."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _served(serving: str, examples: tf.Tensor) -> dict:
    return {name: value.numpy() for name, value in
            tf.saved_model.load(serving).signatures["serving_default"](examples=examples).items()}


def _optimizer_keys(serving: str) -> list[str]:
    return [name for name, _ in tf.train.list_variables(os.path.join(serving, "variables", "variables"))
            if name.startswith("optimizer/")]


@pytest.mark.parametrize("strategy", ["default", "one_device"])
def test_the_model_staged_during_fit_serves_what_an_export_after_fit_serves(penguin_outputs, tmp_path, strategy):
    penguin = _penguin()
    tfo = tft.TFTransformOutput(penguin_outputs["Transform"]["transform_graph"])
    scope = tf.distribute.OneDeviceStrategy("/cpu:0") if strategy == "one_device" else tf.distribute.get_strategy()
    tf_keras.utils.set_random_seed(1)  # this thread's Keras seeds; Python's global random is seeded, then unused
    with scope.scope():
        model = penguin.build_model(tfo, 0.05)
    serving = artifacts.serving_model_path(str(tmp_path / "model"))
    export = ServingExport(tfo, serving, penguin.LABEL_KEY, class_names=CLASSES)
    logged = _Records()
    logging.getLogger("tensorflow").addHandler(logged)
    try:
        seen = _train(model, penguin, export)
        export.publish(model)
    finally:
        logging.getLogger("tensorflow").removeHandler(logged)
    assert random.random() == Random(1).random(), "the twin drew its initial values from the global random"
    assert not [line for line in logged.lines if "compiled metrics" in line], "Keras's warning for an uncompiled model"
    after_fit = str(tmp_path / "after_fit")
    export_serving_model(model, tfo, after_fit, penguin.LABEL_KEY, class_names=CLASSES)

    assert seen["staging_started"]
    assert not os.path.exists(artifacts.serving_staging_path(serving))
    # the staged twin (no optimizer state) was published, not an export made after fit
    assert _optimizer_keys(serving) == [] and _optimizer_keys(after_fit) != []
    loaded = tf_keras.models.load_model(serving, compile=False)
    for trained, published in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(trained, published)
    examples = _raw_examples(penguin_outputs)
    served, expected = _served(serving, examples), _served(after_fit, examples)
    assert set(served) == set(expected) == {"probabilities", "class_ids", "classes"}
    for name in expected:
        np.testing.assert_array_equal(served[name], expected[name])
    assert set(tf.saved_model.load(serving).signatures) == set(tf.saved_model.load(after_fit).signatures)


def _exported_whole_after_fit(model, penguin, tfo, tmp_path) -> str:
    """Fit with a ServingExport and publish; checks nothing was staged (the optimizer's state shows a whole export)."""
    serving = artifacts.serving_model_path(str(tmp_path / "model"))
    export = ServingExport(tfo, serving, penguin.LABEL_KEY, class_names=CLASSES)
    seen = _train(model, penguin, export)
    export.publish(model)
    assert not seen["staging_started"]
    assert _optimizer_keys(serving) != []
    return serving


def test_a_model_with_replicas_is_exported_after_fit(penguin_outputs, tmp_path):
    """Under MirroredStrategy a second thread's work could take collective keys fit's replicas need in step."""
    penguin = _penguin()
    tfo = tft.TFTransformOutput(penguin_outputs["Transform"]["transform_graph"])
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = penguin.build_model(tfo, 0.05)
    serving = _exported_whole_after_fit(model, penguin, tfo, tmp_path)
    loaded = tf_keras.models.load_model(serving, compile=False)
    for trained, published in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(trained, published)


def test_a_model_keras_cannot_rebuild_from_its_config_is_exported_after_fit(penguin_outputs, tmp_path):
    penguin = _penguin()
    tfo = tft.TFTransformOutput(penguin_outputs["Transform"]["transform_graph"])
    plain = penguin.build_model(tfo, 0.05)
    model = tf_keras.Model(plain.inputs, Doubled()(plain.outputs[0]))
    model.compile(optimizer=tf_keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy")
    serving = _exported_whole_after_fit(model, penguin, tfo, tmp_path)
    inputs = _transformed(penguin)
    loaded = tf_keras.models.load_model(serving, compile=False, custom_objects={"Doubled": Doubled})
    np.testing.assert_array_equal(loaded(inputs, training=False).numpy(), model(inputs, training=False).numpy())


UNPUBLISHED_MODULE = textwrap.dedent('''
    """A run_fn that lets ServingExport stage its model during fit, then saves its own and never publishes."""
    import tensorflow as tf
    import tensorflow_transform as tft
    import tf_keras
    from tfx_bsl.public import tfxio

    from hpml.v1 import ServingExport

    FEATURES = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]

    def run_fn(fn_args):
        tft_output = tft.TFTransformOutput(fn_args.transform_output)
        dataset = fn_args.data_accessor.tf_dataset_factory(
            fn_args.train_files, tfxio.TensorFlowDatasetOptions(batch_size=8, label_key="species"),
            tft_output.transformed_metadata.schema).repeat()
        inputs = {name: tf_keras.Input(shape=(), name=name) for name in FEATURES}
        stacked = tf_keras.layers.Concatenate()([tf_keras.layers.Reshape((1,))(inputs[n]) for n in FEATURES])
        model = tf_keras.Model(inputs, tf_keras.layers.Dense(3, activation="softmax")(stacked))
        model.compile("sgd", "sparse_categorical_crossentropy")
        export = ServingExport(tft_output, fn_args.serving_model_dir, "species", class_names=["a", "b", "c"])
        model.fit(dataset.map(lambda f, y: ({n: f[n] for n in FEATURES}, y)), steps_per_epoch=5, epochs=1,
                  callbacks=[export], verbose=0)
        export._thread.join()
        assert tf.io.gfile.exists(fn_args.serving_model_dir + ".staging/saved_model.pb"), "staged during fit"
        model.save(fn_args.serving_model_dir, save_format="tf")
''')


def test_the_trainer_removes_a_staged_model_its_run_fn_never_published(penguin_outputs, tmp_path):
    module = tmp_path / "unpublished.py"
    module.write_text(UNPUBLISHED_MODULE)
    outputs = {"model": str(tmp_path / "model"), "model_run": str(tmp_path / "model_run")}
    TRAINER.run(trainer_inputs(penguin_outputs), outputs, {"module": str(module)})

    assert sorted(os.listdir(outputs["model"])) == [artifacts.SERVING_MODEL_DIR]
