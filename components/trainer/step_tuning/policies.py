"""XLA and mixed-precision candidates, measured: each built (and traced) anew, timed in turns with float32, its
loss compared with float32's on the same batches; and the chosen knobs applied to the model."""
from __future__ import annotations

from hpml.components.trainer import keras_internals
from hpml.components.trainer.step_tuning.knobs import FLOAT32, StepChoice
from hpml.components.trainer.step_tuning.sweep import burst_rate, warm_up


def loss_on(model, batches) -> float:
    """The model's loss on `batches` as its own `test_step` computes it (a custom model's too). Eagerly where one
    device holds the model, so no test function is traced for a one-off check; through `evaluate` under a
    strategy that spreads its variables."""
    import tensorflow as tf

    strategy = model.distribute_strategy
    one_device = isinstance(strategy, tf.distribute.OneDeviceStrategy) or \
        type(strategy).__name__ == "_DefaultDistributionStrategy"
    if one_device:
        model.reset_metrics()
        for data in batches:
            logs = model.test_step(data)
        model_loss = float(logs["loss"])
        model.reset_metrics()
        return model_loss
    return float(model.evaluate(batches, verbose=0, return_dict=True)["loss"])


def measure_on(model, iterator, batch_size: int, spe: int, jit: bool, against=None) -> tuple[float, float]:
    """(examples/s, seconds tracing its step) of `model` with XLA `jit` at `spe` steps per call. With `against` (a
    model already measured at `fastest` examples/s), the two take turns, three bursts each, and the rate is `fastest`
    times the ratio of their best bursts: a comparison this machine's noise cannot tilt by striking one of them
    alone."""
    model.jit_compile = jit
    keras_internals.build_looping_train_function(model, spe)
    trace_s = warm_up(model, iterator, spe)
    if against is None:
        return max(burst_rate(model, iterator, batch_size, spe) for _ in range(2)), trace_s
    baseline, fastest = against
    ours = theirs = 0.0
    for _ in range(3):
        ours = max(ours, burst_rate(model, iterator, batch_size, spe))
        theirs = max(theirs, burst_rate(baseline, iterator, batch_size, spe))
    return fastest * ours / theirs, trace_s


def reference_loss(model, precision_check, rebuild) -> float:
    """float32's loss on the precision check's batches at its weights: on the model itself where it is float32 (its
    weights are put back after measuring anyway), else on a twin built under float32."""
    batches, weights = precision_check
    if model.dtype_policy.name == FLOAT32:
        model.set_weights(weights)
        return loss_on(model, batches)
    twin = build_under(FLOAT32, rebuild)
    twin.set_weights(weights)
    return loss_on(twin, batches)


def measure_policy(precision_check, reference: float, iterator, rebuild, policy: str, spe: int, jit: bool,
                    batch_size: int, against=None):
    """(examples/s, relative loss difference from float32 on the same batches at the same weights, the model, seconds
    tracing its step) of the model built again under `policy`, timed in turns with `against` where given. The model
    leaves as it was built, with the check's weights: ready to train."""
    from hpml.components.trainer.model_state import restored_afterwards

    batches, weights = precision_check
    candidate = build_under(policy, rebuild)
    candidate.set_weights(weights)
    candidate.optimizer.build(candidate.trainable_variables)
    with restored_afterwards(candidate):
        difference = abs(loss_on(candidate, batches) - reference) / max(abs(reference), 1e-6)
        rate, trace_s = measure_on(candidate, iterator, batch_size, spe, jit, against)
    keras_internals.mark_looping(candidate)
    return rate, difference, candidate, trace_s


def build_under(policy: str, rebuild):
    import tf_keras

    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        return rebuild()
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)


def apply_choice(model, choice: StepChoice, rebuild=None, trained=None):
    """The model to train with `choice`: this one with its steps per call and XLA set, or, for a mixed policy,
    `trained` (the model measuring built under it) or one built again, with this one's weights. Where only the steps
    per call change and the model's train function already loops over them (as after measuring), that function is
    kept: fit reuses its trace."""
    if choice.precision != FLOAT32:
        if rebuild is None and trained is None:
            raise ValueError(f"precision {choice.precision} needs the model built again under it (rebuild)")
        weights = model.get_weights()
        model = trained if trained is not None else build_under(choice.precision, rebuild)
        model.set_weights(weights)
    if not keras_internals.has_looping_train_function(model) or bool(model.jit_compile) != choice.jit_compile:
        model.jit_compile = choice.jit_compile
        keras_internals.build_looping_train_function(model, choice.steps_per_execution)
    keras_internals.set_steps_per_execution(model, choice.steps_per_execution)
    return model
