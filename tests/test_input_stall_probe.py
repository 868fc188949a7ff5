"""The input stall measured mid-training: published once the first epoch is over, and training goes on as if it
had not been measured (a transparency test: the same weights, bit for bit, as a run without the probe)."""
import os
import types

import numpy as np
import tensorflow as tf
import tf_keras

from hpml.components.trainer.input_stall import STALL_FILE
from hpml.components.trainer.callbacks.input_stall_probe import InputStallProbe
from hpml.components.trainer.progress_state import progress_dir, read_json

STEPS_PER_EPOCH, EPOCHS = 6, 3


def _training_data():
    """Shuffled anew each epoch from one seed, behind a memory cache: what the tuned pipeline gives run_fn."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 5)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).cache().shuffle(96, seed=7).batch(16).repeat()


def _model():
    tf_keras.utils.set_random_seed(3)
    model = tf_keras.Sequential([tf_keras.layers.Dense(8, activation="relu"), tf_keras.layers.Dense(2)])
    model.compile(tf_keras.optimizers.Adam(0.01), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=2)
    return model


class _SeenAtEpochBegin(tf_keras.callbacks.Callback):
    def __init__(self, path):
        super().__init__()
        self.path, self.seen = path, {}

    def on_epoch_begin(self, epoch, logs=None):
        self.seen[epoch] = os.path.exists(self.path)


def _train(callbacks):
    model = _model()
    history = model.fit(_training_data(), epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH, callbacks=callbacks,
                        verbose=0)
    state = [v.numpy() for v in model.variables] + [v.numpy() for v in model.optimizer.variables()]
    return state, history.history, int(model._train_counter.numpy())


def test_the_probe_publishes_the_stall_after_the_first_epoch_and_training_ends_as_without_it(tmp_path):
    fn_args = types.SimpleNamespace(model_run_dir=str(tmp_path / "model_run"), working_dir=str(tmp_path / "work"))
    os.makedirs(fn_args.model_run_dir)
    live = os.path.join(progress_dir(fn_args.working_dir), STALL_FILE)
    os.makedirs(os.path.dirname(live))
    seen = _SeenAtEpochBegin(live)
    built = []  # the twin is built by the probe, when it measures: the run_fn `hpml init` writes passes a builder
    probed, probed_history, probed_counter = _train([InputStallProbe(lambda: built.append(1) or _training_data(),
                                                                     fn_args, steps_per_epoch=STEPS_PER_EPOCH), seen])
    plain, plain_history, plain_counter = _train([])

    assert seen.seen == {0: False, 1: True, 2: True}, "published once epoch 0 is over, while training goes on"
    assert built == [1]
    stall = read_json(live)
    assert 0.0 <= stall["stall_fraction"] < 1.0 and stall["real_step_s"] > 0 and stall["in_memory_step_s"] > 0
    # A short epoch is read once, untimed, so the timed steps read the warm cache that later epochs read.
    assert stall["warmup_steps"] == STEPS_PER_EPOCH and stall["steps"] == 2 * STEPS_PER_EPOCH
    assert read_json(os.path.join(fn_args.model_run_dir, STALL_FILE)) == stall
    # Weights, optimizer state, the per-epoch metrics and the train counter (which BackupAndRestore checkpoints
    # to resume mid-epoch) are those of the run that measured nothing.
    assert len(probed) == len(plain)
    for a, b in zip(probed, plain):
        np.testing.assert_array_equal(a, b)
    assert probed_history == plain_history
    assert probed_counter == plain_counter == EPOCHS * STEPS_PER_EPOCH


def test_a_long_epoch_is_timed_on_its_first_steps_and_the_stall_goes_nowhere_live_without_a_working_dir(tmp_path):
    """TFX's Trainer gives run_fn no working dir: the stall still reaches the run's model_run, for the record."""
    from hpml.components.trainer.callbacks.input_stall_probe import WARM_EPOCH_STEPS

    fn_args = types.SimpleNamespace(model_run_dir=str(tmp_path), working_dir=None)
    probe = InputStallProbe(_training_data(), fn_args, steps_per_epoch=WARM_EPOCH_STEPS + 1, steps=4,
                            after_last_epoch=True)
    model = _model()
    model.fit(_training_data(), epochs=1, steps_per_epoch=3, callbacks=[probe], verbose=0)
    stall = read_json(os.path.join(tmp_path, STALL_FILE))
    assert stall["warmup_steps"] == 2 and stall["steps"] == 4
    assert os.listdir(tmp_path) == [STALL_FILE]


def test_a_twin_too_short_to_time_leaves_training_going_with_a_warning(tmp_path, caplog):
    fn_args = types.SimpleNamespace(model_run_dir=str(tmp_path), working_dir=None)
    x = np.zeros((32, 5), "float32")
    once = tf.data.Dataset.from_tensor_slices((x, np.zeros(32, "int64"))).batch(16)  # two batches, no repeat
    model = _model()
    with caplog.at_level("WARNING", logger="hpml.trainer"):
        history = model.fit(_training_data(), epochs=2, steps_per_epoch=3, verbose=0,
                            callbacks=[InputStallProbe(once, fn_args, steps_per_epoch=2)])
    assert len(history.history["loss"]) == 2
    assert "input stall not measured: input stall needs 6 batches, the dataset has 2" in caplog.text
    assert not os.path.exists(os.path.join(tmp_path, STALL_FILE))


def test_the_probe_replays_the_batches_of_its_memory_source_where_it_is_given_one(tmp_path, caplog):
    """The in-memory feed's batches come from `memory_source` (the training data unshuffled, in the run_fn `hpml
    init` writes), not from a second read of the shuffled twin: a source too short to replay says so."""
    fn_args = types.SimpleNamespace(model_run_dir=str(tmp_path), working_dir=None)
    x = np.zeros((32, 5), "float32")
    two = tf.data.Dataset.from_tensor_slices((x, np.zeros(32, "int64"))).batch(16)
    with caplog.at_level("WARNING", logger="hpml.trainer"):
        _model().fit(_training_data(), epochs=2, steps_per_epoch=3, verbose=0, callbacks=[
            InputStallProbe(_training_data(), fn_args, steps_per_epoch=3, steps=4, memory_source=two)])
    assert "input stall needs 4 batches to replay, the memory source has 2" in caplog.text

    replayed = InputStallProbe(_training_data(), fn_args, steps_per_epoch=3, steps=4,
                               memory_source=_training_data().unbatch().batch(16), after_last_epoch=True)
    _model().fit(_training_data(), epochs=1, steps_per_epoch=3, callbacks=[replayed], verbose=0)
    stall = read_json(os.path.join(tmp_path, STALL_FILE))
    assert stall["steps"] == 4 and len(stall["in_memory_block_s"]) == len(stall["real_block_s"])


def test_a_one_epoch_run_measures_nothing_after_its_only_epoch_unless_asked(tmp_path, caplog):
    """Measured at the end of the first epoch, the stall informs the epochs that follow; a one-epoch run has none,
    so the probe neither builds its twin nor times a step there (at 1M rows that was a fifth of the epoch again)."""
    fn_args = types.SimpleNamespace(model_run_dir=str(tmp_path), working_dir=None)
    built = []
    probe = InputStallProbe(lambda: built.append(1) or _training_data(), fn_args, steps_per_epoch=3, steps=4)
    with caplog.at_level("INFO", logger="hpml.trainer"):
        history = _model().fit(_training_data(), epochs=1, steps_per_epoch=3, callbacks=[probe], verbose=0)
    assert len(history.history["loss"]) == 1
    assert built == [] and os.listdir(tmp_path) == []
    assert "input stall not measured: this run's one epoch is over" in caplog.text

    asked = InputStallProbe(lambda: built.append(1) or _training_data(), fn_args, steps_per_epoch=3, steps=4,
                            after_last_epoch=True)
    _model().fit(_training_data(), epochs=1, steps_per_epoch=3, callbacks=[asked], verbose=0)
    assert built == [1] and read_json(os.path.join(tmp_path, STALL_FILE))["steps"] == 4
