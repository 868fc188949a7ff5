"""The Trainer's TensorBoard callback writes the epoch summaries and the train graph, and no per-step work."""
import glob
import os
import types

import numpy as np
import tensorflow as tf
import tf_keras

from hpml.components.trainer.callbacks import standard_callbacks

EPOCHS = 3


def _events(directory: str) -> tuple[int, dict]:
    """How many train graphs, and how many values per tag, the event files under `directory` hold."""
    graphs, tags = 0, {}
    for path in glob.glob(os.path.join(directory, "**", "events.out.tfevents.*"), recursive=True):
        for event in tf.compat.v1.train.summary_iterator(path):
            graphs += event.HasField("graph_def")
            for value in event.summary.value:
                tags[value.tag] = tags.get(value.tag, 0) + 1
    return graphs, tags


def test_epoch_summaries_and_graph_are_written_and_no_step_writes_a_summary(tmp_path):
    """tf_keras's TensorBoard skips batch hooks when it writes per epoch, unless another callback has them,
    as ours do: then each step called tf.summary.scalar for every log (a fifth of a small model's step; see
    benchmarks/callbacks.py), and those calls wrote into whatever summary writer the caller had open."""
    x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2)])
    model.compile("sgd", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    fn_args = types.SimpleNamespace(working_dir=str(tmp_path / "work"), model_run_dir=str(tmp_path / "run"))
    callbacks = standard_callbacks(fn_args, "one_device", batch_size=8, epochs=EPOCHS)
    assert any(cb._implements_train_batch_hooks() for cb in callbacks), "the case this test is about"

    caller_writer = tf.summary.create_file_writer(str(tmp_path / "caller"))
    with caller_writer.as_default(step=0), tf.summary.record_if(True):
        model.fit(data, validation_data=data, epochs=EPOCHS, callbacks=callbacks, verbose=0)
    caller_writer.close()

    graphs, train = _events(fn_args.model_run_dir + "/train")
    assert graphs == 1, "the train graph is written once"
    assert train["epoch_loss"] == EPOCHS and train["epoch_accuracy"] == EPOCHS
    _, validation = _events(fn_args.model_run_dir + "/validation")
    assert validation["epoch_loss"] == EPOCHS and validation["evaluation_loss_vs_iterations"] == EPOCHS
    assert not any(tag.startswith("batch_") for tag in train), train
    _, written_for_caller = _events(str(tmp_path / "caller"))
    assert written_for_caller == {}, "no step wrote into the caller's summary writer"
