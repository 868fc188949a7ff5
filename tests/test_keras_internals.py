"""The private tf_keras attributes hpml relies on (components/trainer/keras_internals.py) still exist in the pinned
tf_keras and still do what hpml uses them for. A tf_keras upgrade that renames or changes one fails here, by name."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from hpml.components.trainer import keras_internals


def _compiled():
    tf_keras.utils.set_random_seed(0)
    inner = tf_keras.Sequential([tf_keras.layers.Dense(4, activation="relu", name="inner_dense")], name="block")
    inputs = tf_keras.Input((3,))
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(1, name="head")(inner(inputs)))
    model.compile(tf_keras.optimizers.SGD(0.01), "mse")
    return model


def _iterator(model):
    x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(4).repeat()
    return iter(model.distribute_strategy.experimental_distribute_dataset(dataset))


@pytest.mark.parametrize("name", sorted(keras_internals.PRIVATE_ATTRIBUTES))
def test_each_private_attribute_exists_on_a_compiled_model(name):
    model = _compiled()
    model.make_train_function(force=True)
    assert hasattr(model, name), f"tf_keras no longer has {name}: {keras_internals.PRIVATE_ATTRIBUTES[name]}"


def test_steps_per_call_change_without_a_new_train_function():
    """The looping train function reads its steps per call at each call: one trace serves every value."""
    model = _compiled()
    assert keras_internals.steps_per_execution(model) == 1
    keras_internals.build_looping_train_function(model, 8)
    assert keras_internals.has_looping_train_function(model)
    function, iterator = model.train_function, _iterator(model)
    for steps in (1, 3, 8):
        keras_internals.set_steps_per_execution(model, steps)
        before = int(model.optimizer.iterations.numpy())
        model.train_function(iterator)
        assert int(model.optimizer.iterations.numpy()) - before == steps
        assert keras_internals.steps_per_execution(model) == steps
    assert model.train_function is function, "no train function was made again"


def test_train_functions_can_be_put_back():
    model = _compiled()
    keras_internals.build_looping_train_function(model, 4)
    kept = keras_internals.train_functions(model)
    model.make_train_function(force=True)
    assert model.train_function is not kept[0]
    keras_internals.set_train_functions(model, kept)
    assert keras_internals.train_functions(model) == kept


def test_sublayers_walk_into_nested_models():
    model = _compiled()
    names = [layer.name for layer in keras_internals.sublayers(model, include_self=False)]
    assert "inner_dense" in names and "head" in names and "block" in names
    assert keras_internals.sublayers(model)[0] is model


def _classifier(classes: int = 3):
    """A 3-class classifier on logits, or (classes=1) a binary one on a sigmoid: Keras picks "accuracy"'s kind from the
    shapes it is built with."""
    tf_keras.utils.set_random_seed(0)
    if classes == 1:
        model = tf_keras.Sequential([tf_keras.layers.Dense(8, activation="relu"),
                                     tf_keras.layers.Dense(1, activation="sigmoid")])
        model.compile(tf_keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=["accuracy"])
    else:
        model = tf_keras.Sequential([tf_keras.layers.Dense(8, activation="relu"), tf_keras.layers.Dense(classes)])
        model.compile(tf_keras.optimizers.Adam(0.01),
                      tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.build((None, 3))
    return model


def _batches(classes: int = 3):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + (0 if classes == 1 else (x[:, 1] > 0))
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)


@pytest.mark.parametrize("built_from", ["batch", "spec"])
@pytest.mark.parametrize("classes", [3, 1])
@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_metrics_built_before_the_first_step_make_its_train_function_trace_once_and_train_the_same(
        strategy, classes, built_from):
    """tf.function traces a function twice where its first trace created variables: the compiled metrics, which
    tf_keras builds on the first step. Built beforehand, from one batch or from the dataset's spec and the model's
    symbolic outputs, they cost the trace nothing, and training ends with the same weights, metrics and history (a
    metric built from the wrong shapes would count another kind of accuracy)."""
    def trained(prebuilt: bool):
        scope = tf.distribute.MirroredStrategy(["/cpu:0"]) if strategy == "mirrored" else tf.distribute.get_strategy()
        with scope.scope():
            model = _classifier(classes)
        if prebuilt and built_from == "batch":
            keras_internals.build_compiled_metrics(model, next(iter(_batches(classes))))
        elif prebuilt:
            assert keras_internals.build_compiled_metrics_from_spec(model, _batches(classes).element_spec, 8)
        model.optimizer.build(model.trainable_variables)
        model.make_train_function(force=True)
        history = model.fit(_batches(classes), epochs=2, verbose=0).history
        return model.train_tf_function.experimental_get_tracing_count(), model.get_weights(), history

    traces, weights, history = trained(prebuilt=True)
    plain_traces, plain_weights, plain_history = trained(prebuilt=False)
    assert (traces, plain_traces) == (1, 2)
    assert history == plain_history
    for a, b in zip(weights, plain_weights):
        np.testing.assert_array_equal(a, b)


def test_metrics_are_left_to_a_real_batch_where_the_spec_or_the_model_cannot_say_the_shapes():
    class Subclassed(tf_keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = tf_keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    subclassed = Subclassed()
    subclassed.compile("adam", "sparse_categorical_crossentropy", ["accuracy"])
    assert not keras_internals.build_compiled_metrics_from_spec(subclassed, _batches().element_spec, 8)
    sparse_label = (tf.TensorSpec([None, 3], tf.float32), tf.SparseTensorSpec([None, 1], tf.int64))
    unknown_width = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, None], tf.int64))
    for spec in (sparse_label, unknown_width, tf.TensorSpec([None, 3], tf.float32)):
        model = _classifier()
        assert not keras_internals.build_compiled_metrics_from_spec(model, spec, 8)
        assert not model.compiled_metrics._built, "nothing built"


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_looping_functions_train_and_validate_as_tf_keras_own_loops_do_and_trace_each_step_once(strategy):
    """hpml's looping train and test functions (a tf.while_loop around tf_keras's one-step functions) against tf_keras's
    own at 3 steps per call: the same weights, history and evaluation, epochs of 10 steps included (tf_keras cuts an
    epoch's last call to the step left). tf_keras's Python loop over tf.range makes AutoGraph trace its step twice;
    hpml's traces each step once."""
    def run(looping: bool):
        scope = tf.distribute.MirroredStrategy(["/cpu:0"]) if strategy == "mirrored" else tf.distribute.get_strategy()
        with scope.scope():
            model = _classifier()
            model.compile(tf_keras.optimizers.Adam(0.01), model.loss, metrics=["accuracy"], steps_per_execution=3)
        traces = {"train": 0, "test": 0}
        train_step, test_step = model.train_step, model.test_step

        def counted(kind, step):
            def traced(data):
                traces[kind] += 1  # Python runs only while tracing
                return step(data)
            return traced

        model.train_step, model.test_step = counted("train", train_step), counted("test", test_step)
        keras_internals.build_compiled_metrics(model, next(iter(_batches())))  # no retrace for creating them
        model.optimizer.build(model.trainable_variables)
        if looping:
            keras_internals.build_looping_train_function(model, 3)
        data = _batches().repeat()
        history = model.fit(data, epochs=2, steps_per_epoch=10, validation_data=_batches(), validation_steps=7,
                            verbose=0).history
        evaluation = model.evaluate(_batches(), steps=8, verbose=0, return_dict=True)
        return model.get_weights(), history, evaluation, traces, int(model.optimizer.iterations.numpy())

    weights, history, evaluation, traces, steps = run(looping=True)
    own_weights, own_history, own_evaluation, own_traces, own_steps = run(looping=False)
    assert steps == own_steps == 20
    assert history == own_history and evaluation == own_evaluation
    for ours, theirs in zip(weights, own_weights):
        np.testing.assert_array_equal(ours, theirs)
    assert traces == {"train": 1, "test": 1}
    assert own_traces == {"train": 2, "test": 2}
