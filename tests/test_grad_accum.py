"""Gradient accumulation: k micro-batches of size b update exactly like one batch of k*b."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from hpml.components.trainer.grad_accum import GradientAccumulationModel, micro_batch_bounds

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


def test_micro_batches_are_contiguous_balanced_and_never_empty_while_batch_is_at_least_k():
    for k in range(1, 9):
        for batch in range(1, 41):
            bounds = micro_batch_bounds(batch, k)
            assert bounds[0][0] == 0 and bounds[-1][1] == batch
            assert all(stop == next_start for (_, stop), (next_start, _) in zip(bounds, bounds[1:]))
            sizes = [stop - start for start, stop in bounds]
            assert max(sizes) - min(sizes) <= 1, (batch, k, sizes)
            if batch >= k:
                assert min(sizes) >= 1, (batch, k, sizes)


def _build_with_batch_norm(model_class, **kwargs):
    tf_keras.utils.set_random_seed(7)
    inputs = tf_keras.Input(shape=(5,))
    hidden = tf_keras.layers.BatchNormalization()(tf_keras.layers.Dense(16)(inputs))
    outputs = tf_keras.layers.Dense(3)(tf_keras.layers.Activation("tanh")(hidden))
    model = model_class(inputs, outputs, **kwargs)
    model.compile(tf_keras.optimizers.SGD(0.5),
                  tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _accumulate_by_hand(model, x, y, bounds):
    """The documented update, written out eagerly: each non-empty micro-batch's gradient, weighted by
    its share of the batch, summed into one optimizer step."""
    loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    summed = [tf.zeros_like(v) for v in model.trainable_variables]
    for start, stop in bounds:
        if stop == start:
            continue
        with tf.GradientTape() as tape:
            loss = loss_fn(y[start:stop], model(x[start:stop], training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        summed = [s + (stop - start) / len(x) * g for s, g in zip(summed, grads)]
    model.optimizer.apply_gradients(zip(summed, model.trainable_variables))
    return model.get_weights()


@pytest.mark.parametrize("batch", [5, 3])  # 5: every micro-batch holds one or two; 3: one of four is empty
def test_batch_norm_model_stays_finite_when_micro_batches_are_small_or_empty(batch):
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(batch, 5)).astype("float32"), rng.integers(0, 3, size=(batch,))
    accumulating = _build_with_batch_norm(GradientAccumulationModel, accumulation_steps=4)
    initial = accumulating.get_weights()
    accumulating.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    got = accumulating.get_weights()
    assert all(np.isfinite(w).all() for w in got), "BatchNormalization's statistics must not turn NaN"
    assert max(np.abs(a - b).max() for a, b in zip(got, initial)) > 1e-3
    want = _accumulate_by_hand(_build_with_batch_norm(tf_keras.Model), x, y, micro_batch_bounds(batch, 4))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
