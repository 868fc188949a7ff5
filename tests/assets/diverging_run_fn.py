"""A run_fn whose SGD diverges when its learning rate is too high: linear regression on fixed data.

At learning_rate 3.0 each step multiplies the error by about 5: the loss is ~3e11 after epoch 1,
~1e24 after epoch 2 and infinite during epoch 3. `eval_scale` multiplies the eval features, so that a
large one makes only the validation loss overflow. It trains with the standard callbacks.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np

EPOCHS = 4
BATCH = 32


def run_fn(fn_args):
    import tensorflow as tf
    import tf_keras

    from hpml.components.trainer.callbacks import standard_callbacks
    from hpml.components.trainer.strategies import is_chief, make_strategy

    hyperparameters = fn_args.hyperparameters or {}
    strategy_name = fn_args.custom_config["strategy"]
    strategy = make_strategy(strategy_name)
    tf_keras.utils.set_random_seed(3)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32"))[:, None]
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).with_options(options)
    scale = float(hyperparameters.get("eval_scale", 1.0))
    evaluation = tf.data.Dataset.from_tensor_slices((x[:64] * scale, y[:64])).batch(BATCH).with_options(options)
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(1)])
        model.compile(tf_keras.optimizers.SGD(hyperparameters.get("learning_rate", 0.05)), "mse")
    os.makedirs(fn_args.model_run_dir, exist_ok=True)
    if is_chief():
        with open(os.path.join(fn_args.working_dir, "attempts"), "a", encoding="utf-8") as handle:
            handle.write("attempt\n")
    callbacks = standard_callbacks(fn_args, strategy_name, batch_size=BATCH, epochs=EPOCHS)
    model.fit(train, epochs=EPOCHS, validation_data=evaluation, callbacks=callbacks, verbose=0)
    model.save(fn_args.serving_model_dir, save_format="tf")
