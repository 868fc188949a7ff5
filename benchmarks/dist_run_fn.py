"""Benchmark run_fn: an MLP on synthetic in-memory data that times its own steady-state epochs.

custom_config: strategy, backup ("on"/"off"), examples, epochs; the Trainer sets backup_save_freq.
The chief writes bench.json: examples/s over epochs 2.. (the first epoch traces graphs).
"""
import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def run_fn(fn_args):
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from hpml.components.trainer.progress_reporter import ProgressReporter
    from hpml.components.trainer.strategies import is_chief, make_strategy

    config = fn_args.custom_config
    strategy = make_strategy(config["strategy"])
    n, epochs, batch = config.get("examples", 16384), config.get("epochs", 4), 256
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 64)).astype("float32")
    y = (x[:, :8].sum(axis=1) > 0).astype("int64")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch).with_options(options)
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.layers.Dense(256, activation="relu", input_shape=(64,)),
                                     tf_keras.layers.Dense(256, activation="relu"), tf_keras.layers.Dense(2)])
        model.compile("adam", tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times = []

    class EpochTimer(tf_keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

    callbacks = [EpochTimer()]
    if config.get("backup", "on") == "on":
        callbacks.append(tf_keras.callbacks.BackupAndRestore(os.path.join(fn_args.working_dir, "backup"),
                                                             save_freq=config.get("backup_save_freq", "epoch")))
    if is_chief():
        callbacks.append(ProgressReporter(os.path.join(fn_args.working_dir, "progress")))
    steps = n // batch
    model.fit(data, epochs=epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
    model.save(fn_args.serving_model_dir, save_format="tf")
    if is_chief():
        steady = times[1:] or times
        with open(os.path.join(fn_args.model_run_dir, "bench.json"), "w") as handle:
            json.dump({"examples_per_sec": steps * batch * len(steady) / sum(steady), "epoch_seconds": times}, handle)
