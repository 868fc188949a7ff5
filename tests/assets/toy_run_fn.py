"""A deterministic run_fn for strategy-equivalence tests: synthetic data, no shuffling, SGD.

It reads no files: the data is generated from a fixed seed, so one process and a cluster
see exactly the same global batches. The chief saves its final weights as weights.npz and the
epochs this attempt trained as epochs_run.json.

With the hyperparameter `crash_once_after_epoch` it trains with the standard callbacks
(BackupAndRestore included), and its first attempt dies after that epoch: a transient fault.
"""
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np

EPOCHS = 3


def _crash_once(after_epoch: int, marker: str):
    import tf_keras

    class CrashOnce(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch + 1 == after_epoch and not os.path.exists(marker):
                open(marker, "w").close()
                raise RuntimeError(f"transient fault after epoch {after_epoch}")

    return CrashOnce()


def run_fn(fn_args):
    import tensorflow as tf
    import tf_keras

    from hpml.components.trainer.strategies import is_chief, make_strategy

    strategy = make_strategy(fn_args.custom_config["strategy"])
    tf.config.experimental.enable_op_determinism()
    tf_keras.utils.set_random_seed(3)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(256, 6)).astype("float32")
    y = (x @ rng.normal(size=(6,)) > 0).astype("int64")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).with_options(options)
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.layers.Dense(8, activation="tanh", input_shape=(6,)),
                                     tf_keras.layers.Dense(2)])
        model.compile(tf_keras.optimizers.SGD(0.1),
                      tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = []
    hyperparameters = fn_args.hyperparameters or {}
    if "crash_once_after_epoch" in hyperparameters:
        from hpml.components.trainer.callbacks import standard_callbacks

        callbacks = standard_callbacks(fn_args, fn_args.custom_config["strategy"], batch_size=32, epochs=EPOCHS)
        if hyperparameters["crash_once_after_epoch"]:
            callbacks.append(_crash_once(hyperparameters["crash_once_after_epoch"],
                                         os.path.join(fn_args.working_dir, "crashed")))
    history = model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    model.save(fn_args.serving_model_dir, save_format="tf")
    if is_chief():
        np.savez(os.path.join(fn_args.model_run_dir, "weights.npz"), *model.get_weights())
        with open(os.path.join(fn_args.model_run_dir, "epochs_run.json"), "w") as handle:
            json.dump(history.epoch, handle)
