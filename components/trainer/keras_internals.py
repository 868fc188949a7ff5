"""Every use of a private tf_keras attribute, in one place.

The tuned step and the input-stall probe change how many steps a compiled train function runs per call, swap
train functions and walk nested layers; ServingExport gives its own thread Keras's seed source. tf_keras has no
public API for these. A tf_keras upgrade that renames one breaks here, and tests/test_keras_internals.py names
which (PRIVATE_ATTRIBUTES; tests/test_serving_export.py for the seed source).
"""
from __future__ import annotations

# attribute -> where tf_keras defines it: checked by the tests on a compiled model of the pinned tf_keras
PRIVATE_ATTRIBUTES = {
    "_steps_per_execution": "Model.compile: the tf.Variable a looping train function reads each call",
    "_flatten_layers": "Layer: the walk over a layer's nested layers",
    "train_tf_function": "Model.make_train_function: the tf.function behind train_function",
    "_cluster_coordinator": "Model: the ParameterServer coordinator that schedules the train function, or None",
    "compiled_loss": "Model.compile: the loss container, which builds its metric on its first call",
    "compiled_metrics": "Model.compile: the metrics container, which builds its metrics on its first call",
}


def seed_this_thread(seed: int) -> None:
    """Give this thread Keras's own source of initializer seeds. Without one, a thread other than the one that called
    `tf_keras.utils.set_random_seed` draws them from Python's global `random`, moving every other thread's draws on."""
    import random

    from tf_keras.src import backend

    backend._SEED_GENERATOR.generator = random.Random(seed)


_LOOPING = "_hpml_looping"  # hpml's own mark: the train function was built to loop over several steps per call


def steps_per_execution(model) -> int | None:
    """How many steps the model's train function runs per call; None before it is compiled."""
    variable = getattr(model, "_steps_per_execution", None)
    return None if variable is None else int(variable.numpy())


def set_steps_per_execution(model, steps: int) -> None:
    """Steps per call of the already built train function: read at each call, so no new trace is needed as long as
    the function was built looping (steps > 1 when it was made)."""
    model._steps_per_execution.assign(steps)


def build_looping_train_function(model, steps: int) -> None:
    """A new train function that loops over up to `steps` per call (at least 2, so that it is built looping), and
    marks the model as having one. Its test function loops the same way."""
    set_steps_per_execution(model, max(steps, 2))
    model.train_function = model.train_tf_function = _looping(model, model.make_train_function)
    build_looping_test_function(model)
    setattr(model, _LOOPING, True)


def build_looping_test_function(model) -> None:
    """A new test function (fit's validation, evaluate) that runs the model's steps per call, read at each call."""
    model.test_function = _looping(model, model.make_test_function)


def _looping(model, make):
    """tf_keras's own one-step function from `make` (the model's make_train_function or make_test_function), called
    in a tf.while_loop for the steps per call the model holds at each call. tf_keras's looping function is a Python
    loop over tf.range, which AutoGraph traces twice to learn what the loop carries: its step is traced twice (about
    0.2 s of a 1M-row run's first call). Here the loop carries only its counter and the last step is called after it,
    so the one-step function is traced once and the steps are the same. A model under a cluster coordinator or run
    eagerly keeps tf_keras's own."""
    import tensorflow as tf

    if model._cluster_coordinator is not None or model.run_eagerly:
        return make(force=True)
    steps = model._steps_per_execution
    wanted = int(steps.numpy())
    steps.assign(1)  # tf_keras makes its one-step function where the model holds 1 step per call
    try:
        one_step = make(force=True)
    finally:
        steps.assign(wanted)

    @tf.function(autograph=False, reduce_retracing=True)
    def looping(iterator):
        def step(done):
            one_step(iterator)
            return done + 1

        tf.while_loop(lambda done: done < steps - 1, step, [tf.constant(0, steps.dtype)])
        return one_step(iterator)

    return looping


def mark_looping(model) -> None:
    setattr(model, _LOOPING, True)


def has_looping_train_function(model) -> bool:
    return bool(getattr(model, _LOOPING, False)) and model.train_function is not None


def train_functions(model) -> tuple:
    """The model's train function and the tf.function behind it, to put back later with `set_train_functions`."""
    return model.train_function, model.train_tf_function


def set_train_functions(model, functions: tuple) -> None:
    model.train_function, model.train_tf_function = functions


def sublayers(layer, include_self: bool = True) -> list:
    """The layer and every layer nested in it, depth first, as tf_keras walks them."""
    return list(layer._flatten_layers(include_self=include_self))


def build_compiled_metrics(model, batch) -> None:
    """Build the compiled loss's and metrics' variables from one (features, label) batch, as the first training
    step would. A train function traced after creates no variables, so tf.function traces it once: it traces twice
    a function whose first trace made variables (about 0.35 s of a 1M-row run's first trace)."""
    metrics = getattr(model, "compiled_metrics", None)
    if metrics is None or getattr(metrics, "_built", True) or not isinstance(batch, tuple) or len(batch) < 2:
        return
    with model.distribute_strategy.scope():
        _build(model, model(batch[0], training=False), batch[1])


def build_compiled_metrics_from_spec(model, element_spec, batch_size: int) -> bool:
    """`build_compiled_metrics` with no batch read and no model call: zeros of `batch_size` rows shaped as the
    dataset's label spec and the model's symbolic outputs, which is all building looks at (reading a batch and
    calling the model cost about 0.2 s of a 1M-row run's tuning). False, and nothing built, where the model has no
    symbolic outputs (a subclassed model) or a label or an output is not a dense tensor of known shape past its
    batch dimension: then `build_compiled_metrics` needs a real batch."""
    import tensorflow as tf

    metrics = getattr(model, "compiled_metrics", None)
    if metrics is None or getattr(metrics, "_built", True):
        return True
    if not isinstance(element_spec, tuple) or len(element_spec) < 2:
        return False
    try:
        outputs = model.output  # a Functional or Sequential model's symbolic outputs, as its call returns them
    except (AttributeError, ValueError):
        return False

    def zeros(tensor):
        spec = getattr(tensor, "type_spec", tensor)  # a symbolic output's, or the dataset's own
        if not isinstance(spec, tf.TensorSpec) or spec.shape.rank in (None, 0) or None in spec.shape.as_list()[1:]:
            raise TypeError(spec)
        return tf.zeros([batch_size, *spec.shape.as_list()[1:]], spec.dtype)

    try:
        predictions, labels = tf.nest.map_structure(zeros, outputs), tf.nest.map_structure(zeros, element_spec[1])
    except TypeError:
        return False
    with model.distribute_strategy.scope():
        _build(model, predictions, labels)
    return True


def _build(model, predictions, labels) -> None:
    loss = getattr(model, "compiled_loss", None)
    if loss is not None:
        loss.build(predictions)
    model.compiled_metrics.build(predictions, labels)
