"""A deterministic run_fn for strategy-equivalence tests: synthetic data, no shuffling, SGD.

It reads no files: the data is generated from a fixed seed, so one process and a cluster
see exactly the same global batches. The chief saves its final weights as weights.npz.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402


def run_fn(fn_args):
    import tensorflow as tf
    import tf_keras

    from components.trainer.strategies import is_chief, make_strategy

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
    model.fit(dataset, epochs=3, verbose=0)
    model.save(fn_args.serving_model_dir, save_format="tf")
    if is_chief():
        np.savez(os.path.join(fn_args.model_run_dir, "weights.npz"), *model.get_weights())
