"""Gradient accumulation: k micro-batches of size b update exactly like one batch of k*b."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from components.trainer.grad_accum import GradientAccumulationModel

K, B = 4, 8


def _build(model_class, **kwargs):
    tf_keras.utils.set_random_seed(7)
    inputs = tf_keras.Input(shape=(5,))
    hidden = tf_keras.layers.Dense(16, activation="tanh")(inputs)
    outputs = tf_keras.layers.Dense(3)(hidden)
    model = model_class(inputs, outputs, **kwargs)
    model.compile(tf_keras.optimizers.SGD(0.5),
                  tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(K * B, 5)).astype("float32"), rng.integers(0, 3, size=(K * B,))


def _reference_weights():
    x, y = _data()
    plain = _build(tf_keras.Model)
    plain.fit(x, y, batch_size=K * B, epochs=1, shuffle=False, verbose=0)
    return plain.get_weights()


@pytest.mark.parametrize("strategy_name", ["one_device", "mirrored_2_logical_cpus"])
def test_accumulated_update_equals_full_batch_update(strategy_name):
    x, y = _data()
    if strategy_name == "one_device":
        strategy = tf.distribute.get_strategy()
    else:
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                                  cross_device_ops=tf.distribute.ReductionToOneDevice())
        assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        accumulating = _build(GradientAccumulationModel, accumulation_steps=K)
    initial = accumulating.get_weights()
    accumulating.fit(x, y, batch_size=K * B, epochs=1, shuffle=False, verbose=0)
    assert int(accumulating.optimizer.iterations.numpy()) == 1, "one optimizer update per batch"
    changed = max(np.abs(a - b).max() for a, b in zip(accumulating.get_weights(), initial))
    assert changed > 1e-3, "the update must actually move the weights"
    for got, want in zip(accumulating.get_weights(), _reference_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_single_micro_batch_differs_from_full_batch():
    """Guard against a vacuous pass: updating on only the first micro-batch must differ."""
    x, y = _data()
    first_only = _build(tf_keras.Model)
    first_only.fit(x[:B], y[:B], batch_size=B, epochs=1, shuffle=False, verbose=0)
    diffs = [np.abs(a - b).max() for a, b in zip(first_only.get_weights(), _reference_weights())]
    assert max(diffs) > 1e-3


def test_uneven_split_weights_micro_batches_by_size():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(30, 5)).astype("float32"), rng.integers(0, 3, size=(30,))
    accumulating = _build(GradientAccumulationModel, accumulation_steps=4)  # micro-batches 8, 8, 8, 6
    accumulating.fit(x, y, batch_size=30, epochs=1, shuffle=False, verbose=0)
    plain = _build(tf_keras.Model)
    plain.fit(x, y, batch_size=30, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(accumulating.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
