"""Knowledge distillation: the loss against NumPy, a=0 equals plain training, the T^2 factor,
multi-teacher averaging, precomputed soft targets, and teacher checks before training."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from hpml.components.errors import SpecError
from hpml.components.trainer.distill import loss as kd
from hpml.components.trainer.distill.distiller import Distiller, check_teachers


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_kl_term_matches_numpy():
    rng = np.random.default_rng(0)
    p, q = _softmax(rng.normal(size=(5, 4))), _softmax(rng.normal(size=(5, 4)))
    expected = (p * (np.log(p) - np.log(q))).sum(axis=-1)
    np.testing.assert_allclose(kd.kl_divergence(tf.constant(p), tf.constant(q)).numpy(), expected, rtol=1e-6)


def test_full_loss_matches_numpy():
    rng = np.random.default_rng(1)
    z, t = rng.normal(size=(6, 3)).astype("float32"), rng.normal(size=(6, 3)).astype("float32")
    y = rng.integers(0, 3, size=6)
    temp, a = 3.0, 0.7
    p_t, q_t = _softmax(t / temp), _softmax(z / temp)
    hard = -np.log(_softmax(z)[np.arange(6), y])
    expected = np.mean((1 - a) * hard + a * temp ** 2 * (p_t * np.log(p_t / q_t)).sum(-1))
    got = kd.distillation_loss(tf.constant(y), tf.constant(z), tf.constant(p_t), temp, a).numpy()
    assert got == pytest.approx(expected, rel=1e-5)


def _student(seed=0):
    tf_keras.utils.set_random_seed(seed)
    return tf_keras.Sequential([tf_keras.layers.Dense(8, activation="tanh", input_shape=(5,)),
                                tf_keras.layers.Dense(3)])


def _teacher(seed=5, classes=3):
    tf_keras.utils.set_random_seed(seed)
    return tf_keras.Sequential([tf_keras.layers.Dense(16, activation="relu", input_shape=(5,)),
                                tf_keras.layers.Dense(classes, activation="softmax")])


def _data():
    rng = np.random.default_rng(2)
    return rng.normal(size=(64, 5)).astype("float32"), rng.integers(0, 3, size=64)


def test_alpha_zero_equals_plain_training_step_for_step():
    x, y = _data()
    distiller = Distiller(_student(), [_teacher()], temperature=4.0, alpha=0.0)
    distiller.compile(tf_keras.optimizers.SGD(0.2))
    plain = _student()
    plain.compile(tf_keras.optimizers.SGD(0.2), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for step in range(3):
        batch = slice(16 * step, 16 * (step + 1))
        distiller.train_on_batch(x[batch], y[batch])
        plain.train_on_batch(x[batch], y[batch])
        for a, b in zip(distiller.student.get_weights(), plain.get_weights()):
            np.testing.assert_allclose(a, b, atol=1e-6)


def _soft_gradient_norm(temperature, with_t2=True):
    rng = np.random.default_rng(3)
    student_logits = tf.Variable(rng.normal(size=(256, 10)).astype("float32"))
    teacher_logits = rng.normal(scale=2.0, size=(256, 10)).astype("float32")
    targets = tf.nn.softmax(teacher_logits / temperature)
    with tf.GradientTape() as tape:
        soft = tf.reduce_mean(kd.kl_divergence(targets, tf.nn.softmax(student_logits / temperature)))
        loss = temperature ** 2 * soft if with_t2 else soft
    return float(tf.norm(tape.gradient(loss, student_logits)))


def test_t_squared_keeps_the_soft_gradient_size_steady():
    temps = [2.0, 4.0, 8.0, 16.0]
    scaled = [_soft_gradient_norm(t) for t in temps]
    unscaled = [_soft_gradient_norm(t, with_t2=False) for t in temps]
    assert max(scaled) / min(scaled) < 2.0, scaled
    assert unscaled[0] / unscaled[-1] > 30, "without T^2 the gradient shrinks about as 1/T^2"


def test_soft_targets_are_averaged_over_teachers():
    x, _ = _data()
    teachers = [_teacher(5), _teacher(6), _teacher(7)]
    distiller = Distiller(_student(), teachers, temperature=2.0)
    got = distiller.soft_targets(tf.constant(x)).numpy()
    each = [_softmax(np.log(np.clip(t(x).numpy(), 1e-7, 1)) / 2.0) for t in teachers]
    np.testing.assert_allclose(got, np.mean(each, axis=0), atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(got, each[0], atol=1e-3), "the ensemble must differ from one teacher"


def test_precomputed_soft_targets_train_exactly_like_on_the_fly():
    x, y = _data()
    on_the_fly = Distiller(_student(), [_teacher()], temperature=3.0, alpha=0.8)
    cached_targets = on_the_fly.soft_targets(tf.constant(x)).numpy()
    precomputed = Distiller(_student(), [], temperature=3.0, alpha=0.8)
    for model in (on_the_fly, precomputed):
        model.compile(tf_keras.optimizers.SGD(0.2))
    on_the_fly.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    cached = tf.data.Dataset.from_tensor_slices(((x, cached_targets), y)).batch(16)
    precomputed.fit(cached, epochs=2, verbose=0)
    for a, b in zip(on_the_fly.student.get_weights(), precomputed.student.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_teachers_are_frozen():
    x, y = _data()
    teacher = _teacher()
    before = [w.copy() for w in teacher.get_weights()]
    distiller = Distiller(_student(), [teacher], temperature=2.0, alpha=0.5)
    distiller.compile(tf_keras.optimizers.SGD(0.5))
    distiller.fit(x, y, batch_size=16, epochs=1, verbose=0)
    for a, b in zip(before, teacher.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_bad_teachers_are_refused_before_training(tmp_path):
    sample = tf.zeros([2, 5])
    with pytest.raises(SpecError, match="teacher model .*missing"):
        check_teachers([str(tmp_path / "nope")], 3, sample)
    wrong = _teacher(classes=4)
    wrong.save(str(tmp_path / "wrong" / "Format-Serving"), save_format="tf")
    with pytest.raises(SpecError, match="predicts 4 classes but the student predicts 3"):
        check_teachers([str(tmp_path / "wrong")], 3, sample)
    good = _teacher()
    good.save(str(tmp_path / "good" / "Format-Serving"), save_format="tf")
    assert len(check_teachers([str(tmp_path / "good")], 3, sample)) == 1
    with pytest.raises(SpecError, match="temperature must be positive"):
        Distiller(_student(), [good], temperature=0)


def test_under_mixed_float16_the_distiller_scales_its_loss_so_small_gradients_survive():
    """Inputs of 1e-4 and output weights of 1e-3 make first-layer gradients of about 1e-8, below float16's smallest
    number: unscaled, the step would leave those weights as they were. Scaled, it moves them as float32 does
    (tolerance: float16's rounding, 2e-2 relative)."""
    LEARNING_RATE = 1e4
    rng = np.random.default_rng(3)
    x, y = (1e-4 * rng.uniform(1, 2, size=(16, 5))).astype("float32"), rng.integers(0, 3, size=16)
    outputs = (1e-3 * np.sign(rng.normal(size=(8, 3)))).astype("float32")
    moved = {}
    for policy in ("float32", "mixed_float16"):
        tf_keras.mixed_precision.set_global_policy(policy)
        try:
            tf_keras.utils.set_random_seed(0)
            student = tf_keras.Sequential([tf_keras.layers.Dense(8, activation="tanh", input_shape=(5,)),
                                           tf_keras.layers.Dense(3, dtype="float32")])
            student.layers[1].kernel.assign(outputs)
            distiller = Distiller(student, [_teacher()], temperature=2.0, alpha=0.5)
            distiller.compile(tf_keras.optimizers.SGD(LEARNING_RATE))  # updates well above float32's resolution
            before = student.layers[0].kernel.numpy()
            distiller.train_on_batch(x, y)
            moved[policy] = (student.layers[0].kernel.numpy() - before) / LEARNING_RATE  # the gradient
        finally:
            tf_keras.mixed_precision.set_global_policy("float32")
    assert isinstance(distiller.optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    assert 1e-10 < np.abs(moved["float32"]).max() < 6e-8, "the gradients are below float16's range"
    np.testing.assert_allclose(moved["mixed_float16"], moved["float32"], rtol=2e-2, atol=1e-11)
