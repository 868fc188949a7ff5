"""The tuned training step: which precisions a device is worth measuring, what measuring may cost, that the tuned
step trains exactly as the plain one, that a choice is reused and a pinned knob kept, and that backups still land
on save_freq steps when a call runs several steps."""
import math

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from hpml.components.trainer import step_tuning
from hpml.components.trainer.step_tuning import (FLOAT32, MIXED_BFLOAT16, MIXED_FLOAT16, Device, candidate_precisions,
                                                 measure_budget_s, pays_back, predicted_saving_s, smallest_as_fast,
                                                 tune_step)

BATCH = 32


@pytest.mark.parametrize("device, policies", [
    (Device("CPU"), []),
    (Device("CPU", cpu_bf16=True), [MIXED_BFLOAT16]),
    (Device("GPU", compute_capability=(8, 0)), [MIXED_FLOAT16]),
    (Device("GPU", compute_capability=(7, 0)), [MIXED_FLOAT16]),
    (Device("GPU", compute_capability=(6, 1)), []),
    (Device("TPU"), [MIXED_BFLOAT16]),
])
def test_the_precisions_worth_measuring_follow_the_device(device, policies):
    chosen, why = candidate_precisions(device)
    assert chosen == policies and why


def test_measuring_may_cost_a_tenth_of_short_training_and_a_twentieth_of_long():
    assert measure_budget_s(100) == pytest.approx(10)
    assert measure_budget_s(599) == pytest.approx(59.9)
    assert measure_budget_s(1200) == pytest.approx(60)


def test_a_policy_past_the_budget_must_save_more_than_it_costs_and_long_training_keeps_its_share():
    assert pays_back(predicted_training_s=12, predicted_saving_s=2.5, cost_s=1.0)
    assert not pays_back(predicted_training_s=12, predicted_saving_s=0.8, cost_s=1.0)
    assert not pays_back(predicted_training_s=12, predicted_saving_s=-1.0, cost_s=1.0), "slower in the probe"
    assert not pays_back(predicted_training_s=900, predicted_saving_s=500, cost_s=1.0), "5% of long training holds"


def test_steps_per_execution_is_read_from_a_fit_of_all_bursts_not_from_the_luckiest_one():
    compute, overhead = 1e-6, 4e-6  # seconds per example, and per call (over a batch of one example's worth)
    clean = {v: 1 / (compute + overhead / v) for v in (1, 2, 4, 8, 16, 32, 64)}
    assert smallest_as_fast(clean) == 64, "32 runs at 94% of 64: not within 3%"
    spiked = {**clean, 16: 1.2 * clean[16]}  # one lucky burst at 16 beats 64's
    slowed = {**clean, 64: 0.85 * clean[64]}  # one slow burst at 64
    assert smallest_as_fast(spiked) == smallest_as_fast(slowed) == 64
    flat = {v: 1 / (compute + 1e-8 / v) for v in (1, 2, 4, 8, 16, 32, 64)}  # calls cost nothing extra here
    assert smallest_as_fast(flat) == 1, "finer callbacks where more steps per call buy nothing"
    assert smallest_as_fast({1: 100.0, 2: 180.0}) == 2, "two values: the bursts themselves"


def test_a_choice_is_never_a_value_its_own_bursts_show_clearly_slower_and_the_reason_says_so():
    """A 1M-row run's sweep: one slow burst at 32 (263k examples/s where 16 ran 661k and 64 592k) pulled the fit
    to choose 32. A choice its own numbers show more than BURST_NOISE slower than another value's is refused."""
    from hpml.components.trainer.step_tuning.knobs import BURST_NOISE
    from hpml.components.trainer.step_tuning.sweep import spe_reason as _spe_reason

    rates = {1: 219_500, 2: 380_000, 4: 520_000, 8: 600_000, 16: 660_858, 32: 263_444, 64: 592_345}
    spe = smallest_as_fast(rates, 1024)
    assert rates[spe] >= (1 - BURST_NOISE) * max(rates.values())
    assert spe == 16 and _spe_reason(spe, rates) == "16 ran 660,858 examples/s, 3.0x one step per call"
    # Within the noise, the fit still decides, and the reason prints the faster burst beside the choice.
    compute, overhead = 1e-6, 4e-6
    slowed = {v: 1 / (compute + overhead / v) for v in (1, 2, 4, 8, 16, 32, 64)}
    slowed[64] *= 0.9
    assert smallest_as_fast(slowed) == 64
    assert _spe_reason(64, slowed) == ("64 ran 847,059 examples/s, 4.2x one step per call; 32's best burst ran 5% "
                                       "faster, within the noise of the fit of every value's bursts, and fewer "
                                       "steps per call keep callbacks finer")
    assert _spe_reason(1, {1: 100.0, 2: 99.0}) == "more steps per call were not faster here"


def test_the_choice_counts_what_fit_adds_to_each_call():
    """Bursts call the train function directly; fit adds its own work to every call. The penguin-size model's bursts
    here: 0.25 ms a step and 0.5 ms a call at batch 256, where 32 steps per call look within 3% of 64, and fit, which
    adds about 0.5 ms a call, ran 64 faster."""
    batch = 256
    bursts = {v: batch / (0.25e-3 + 0.5e-3 / v) for v in (1, 2, 4, 8, 16, 32, 64)}
    assert smallest_as_fast(bursts) == 32
    assert smallest_as_fast(bursts, batch) == 64
    slow_steps = {v: batch / (20e-3 + 0.5e-3 / v) for v in (1, 2, 4, 8, 16, 32, 64)}  # the call's cost is noise
    assert smallest_as_fast(slow_steps, batch) == 2


def test_the_sweep_keeps_to_its_limit_however_long_a_call_of_the_largest_values_takes():
    """A short training's sweep may take MIN_SWEEP_S; a call of 64 steps of a slower step alone took longer (a 1M-row
    run's sweep took 0.5 s for 2 s of training). A value whose burst would end past the limit is not started, and the
    round ends there; with no limit, both rounds run to the knee as before."""
    from hpml.components.trainer import keras_internals
    from hpml.components.trainer.step_tuning.sweep import burst_s, sweep

    batch = 256
    model = _model(width=4096)  # a few ms a step here: a call of 64 steps alone lasts longer than the limit
    keras_internals.build_looping_train_function(model, 64)
    iterator = iter(_data().unbatch().batch(batch, drop_remainder=True))
    model.train_function(iterator)  # traced, outside the timing
    values, limit = [1, 64], 0.1  # no knee to end the round: only the limit can
    rates, rounds = sweep(model, iterator, batch, values, lambda rates: limit)
    assert burst_s(64, batch, rates[1]) > limit, "a call of 64 steps alone is past the limit"
    assert list(rates) == [1], rates  # measured twice: two rounds fit the limit, 64 in neither
    assert burst_s(1, batch, 1e9) == pytest.approx(0.03), "a burst lasts BURST_S at least"

    unlimited, rounds = sweep(model, iterator, batch, values, lambda rates: math.inf)
    assert sorted(unlimited) == [1, 64] and rounds == 2


def _data(rows=4096, seed=0):
    x = np.random.default_rng(seed).normal(size=(rows, 8)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).cache().repeat()


def _model(seed=1, width=16):
    tf_keras.utils.set_random_seed(seed)
    model = tf_keras.Sequential([tf_keras.Input((8,)), tf_keras.layers.Dense(width, activation="relu"),
                                 tf_keras.layers.Dense(2, activation="softmax", dtype="float32")])
    model.compile(tf_keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", ["accuracy"])
    return model


def _weights(model):
    return [v.numpy() for v in model.weights]


def test_the_tuned_step_trains_exactly_as_one_step_per_call(tmp_path):
    """Measuring trains the real model; its weights and optimizer state are put back, and the tuned model then
    trains to the same weights, bit for bit, as an untuned twin."""
    plain, tuned = _model(), _model()
    start = _weights(tuned)
    tuned, tuning = tune_step(tuned, _data(), batch_size=BATCH, total_steps=500, device=Device("CPU"),
                              cache_dir=str(tmp_path))
    assert [np.array_equal(a, b) for a, b in zip(start, _weights(tuned))] == [True] * len(start)
    assert int(tuned.optimizer.iterations.numpy()) == 0
    spe = tuning.choice.steps_per_execution
    rates = {m["steps_per_execution"]: m["examples_per_s"] for m in tuning.measured if not m["jit_compile"]}
    assert spe == smallest_as_fast(rates, BATCH), "read from the fit of the bursts, with fit's work per call"
    assert rates[1] and len(rates) >= 3
    for model in (plain, tuned):
        model.fit(_data(), epochs=2, steps_per_epoch=40, verbose=0)
    assert int(tuned.optimizer.iterations.numpy()) == 80
    assert all(np.array_equal(a, b) for a, b in zip(_weights(plain), _weights(tuned))), \
        f"steps_per_execution={spe} must not change what training computes"


def test_a_choice_is_reused_for_the_same_model_and_a_pinned_knob_is_kept(tmp_path):
    first, tuning = tune_step(_model(), _data(), batch_size=BATCH, total_steps=500, device=Device("CPU"),
                              cache_dir=str(tmp_path))
    assert not tuning.reused and tuning.seconds > 0
    again, reused = tune_step(_model(seed=5), _data(), batch_size=BATCH, total_steps=500, device=Device("CPU"),
                              cache_dir=str(tmp_path))
    assert reused.reused and reused.seconds == 0 and reused.choice == tuning.choice
    assert int(again._steps_per_execution.numpy()) == tuning.choice.steps_per_execution
    other, fresh = tune_step(_model(width=24), _data(), batch_size=BATCH, total_steps=500, device=Device("CPU"),
                             cache_dir=str(tmp_path))
    assert not fresh.reused, "another model shape is measured again"

    pinned, kept = tune_step(_model(), _data(), batch_size=BATCH, total_steps=500, device=Device("CPU"),
                             pinned={"steps_per_execution": 4, "jit_compile": False}, cache_dir=str(tmp_path))
    assert kept.choice == step_tuning.StepChoice(4, False, FLOAT32)
    assert kept.reasons["steps_per_execution"] == kept.reasons["jit_compile"] == "pinned in hyperparameters"
    assert int(pinned._steps_per_execution.numpy()) == 4 and not pinned.jit_compile
    _, all_pinned = tune_step(_model(), _data(), batch_size=BATCH, total_steps=500, device=Device("CPU"),
                              pinned={"steps_per_execution": 2, "jit_compile": False, "precision": FLOAT32})
    assert all_pinned.choice == step_tuning.StepChoice(2) and all_pinned.measured == [] and all_pinned.seconds == 0


def test_costly_candidates_are_measured_only_within_the_budget(tmp_path, monkeypatch):
    _, short = tune_step(_model(), _data(), batch_size=BATCH, total_steps=50, rebuild=_model,
                         device=Device("CPU", cpu_bf16=True))
    assert short.reasons["jit_compile"].startswith("not measured: compiling a candidate")
    assert "budget" in short.reasons["precision"]
    assert [m for m in short.measured if m["jit_compile"] or m["precision"] != FLOAT32] == []

    monkeypatch.setattr(step_tuning.knobs, "PRECISION_TOLERANCE", 0.0)  # no policy can match float32 exactly
    _, long = tune_step(_model(), _data(), batch_size=BATCH, total_steps=10_000_000, rebuild=_model,
                        device=Device("CPU", cpu_bf16=True))
    # Both costly knobs, alone and together: bfloat16 without XLA, XLA in float32, and both.
    costly = sorted((m["jit_compile"], m["precision"]) for m in long.measured
                    if m["jit_compile"] or m["precision"] != FLOAT32)
    assert costly == [(False, MIXED_BFLOAT16), (True, FLOAT32), (True, MIXED_BFLOAT16)], costly
    assert long.reasons["jit_compile"].startswith(("XLA: ", "off: with XLA, at best "))
    bf16 = [m for m in long.measured if m["precision"] == MIXED_BFLOAT16]
    assert all(m["loss_difference"] > 0 for m in bf16)
    assert long.choice.precision == FLOAT32 and "differs by" in long.reasons["precision"]


def test_the_matmul_probe_prices_only_dense_layers_and_stops_where_no_saving_could_be_enough():
    no_dense = tf_keras.Sequential([tf_keras.Input((8,)), tf_keras.layers.Lambda(lambda x: 2 * x)])
    assert predicted_saving_s(no_dense, MIXED_BFLOAT16, BATCH, 1000) == 0.0
    wide = _model(width=512)
    assert step_tuning.probe.dense_kernel_shapes(wide) == [(8, 512), (512, 2)]
    # float32's matmuls over 10 steps cannot take an hour: no policy could save that much, so none is timed.
    assert predicted_saving_s(wide, MIXED_BFLOAT16, BATCH, 10, needed_s=3600.0) == 0.0
    assert step_tuning.compute_dtype(MIXED_BFLOAT16) == "bfloat16" and step_tuning.compute_dtype(FLOAT32) == "float32"


def test_a_policy_left_out_by_the_budget_is_measured_where_the_probe_predicts_it_pays_back(monkeypatch):
    asked = []

    def probe(model, policy, batch_size, total_steps, needed_s=0.0):  # stands in for the timing, not the rule
        asked.append((policy, total_steps, needed_s))
        return saving

    monkeypatch.setattr(step_tuning.probe, "predicted_saving_s", probe)
    monkeypatch.setattr(step_tuning.knobs, "PRECISION_TOLERANCE", 1.0)  # the subject is what gets measured
    monkeypatch.setattr(step_tuning.knobs, "BUDGET_SHARE", 0.0)  # no compile fits the plain budget, however fast
    saving = 0.0
    _, unpaid = tune_step(_model(), _data(), batch_size=BATCH, total_steps=300_000, rebuild=_model,
                          device=Device("CPU", cpu_bf16=True))
    assert asked and asked[0][0] == MIXED_BFLOAT16 and asked[0][1] == 300_000 and asked[0][2] > 0
    assert [m for m in unpaid.measured if m["precision"] != FLOAT32] == []
    assert "less than measuring it would cost" in unpaid.reasons["precision"]

    saving = 1000.0
    _, paid = tune_step(_model(), _data(), batch_size=BATCH, total_steps=300_000, rebuild=_model,
                        device=Device("CPU", cpu_bf16=True))
    assert [m for m in paid.measured if m["precision"] == MIXED_BFLOAT16][0]["jit_compile"] is False
    assert "measured past the budget: a probe of its matmuls predicted it to save about 1000.0 s" in \
        paid.reasons["precision"]
    assert paid.reasons["jit_compile"].startswith("not measured"), "the probe speaks for the policy, not for XLA"


def test_the_policy_model_measuring_built_is_the_one_trained_and_trains_as_a_fresh_build(tmp_path):
    """A winning policy's model keeps the trace measuring made, and its weights, optimizer state and train counter
    are put back: it trains to the same weights, bit for bit, as a model built afresh under that policy."""
    def build(seed=1):
        return _model(seed=seed, width=64)

    def under_bf16(seed=1):
        return step_tuning.policies.build_under(MIXED_BFLOAT16, lambda: build(seed))

    start = _weights(build())
    tuned, tuning = tune_step(build(), _data(), batch_size=BATCH, total_steps=10_000_000, rebuild=build,
                              pinned={"jit_compile": False, "precision": MIXED_BFLOAT16},
                              device=Device("CPU", cpu_bf16=True), cache_dir=str(tmp_path))
    assert tuning.choice.precision == MIXED_BFLOAT16 and tuned.dtype_policy.name == MIXED_BFLOAT16
    assert tuned.train_function is not None, "the trace measuring made is kept for fit"
    assert int(tuned.optimizer.iterations.numpy()) == 0 and int(tuned._train_counter.numpy()) == 0
    assert all(np.array_equal(a, b) for a, b in zip(start, _weights(tuned)))
    swept = [m for m in tuning.measured if m["precision"] == MIXED_BFLOAT16]
    assert len({m["steps_per_execution"] for m in swept}) >= 3, "its own steps per call were swept"

    function, traced = tuned.train_tf_function, tuned.train_tf_function.experimental_get_tracing_count()
    assert traced >= 1 and tuning.trace_s > 0, "the policy model's trace is the one reported as reused"

    fresh = under_bf16(seed=9)
    fresh.set_weights(start)
    fresh._steps_per_execution.assign(tuning.choice.steps_per_execution)
    for model in (fresh, tuned):
        model.fit(_data(), epochs=2, steps_per_epoch=16, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(_weights(fresh), _weights(tuned)))
    assert tuned.train_tf_function is function and function.experimental_get_tracing_count() == traced


def test_the_trace_reported_as_reused_is_the_one_fit_runs_after_xla_was_measured(tmp_path):
    """Measuring XLA compiles another step; where XLA loses, fit runs the float32 step traced before it (no second
    trace), and where it wins, fit traces anew and none of measuring's trace is counted as reused."""
    tuned, tuning = tune_step(_model(width=64), _data(), batch_size=BATCH, total_steps=10_000_000,
                              pinned={"precision": FLOAT32}, device=Device("CPU"), cache_dir=str(tmp_path))
    assert any(m["jit_compile"] for m in tuning.measured), "XLA was measured"
    assert tuned.jit_compile == tuning.choice.jit_compile
    function = tuned.train_tf_function
    traced = function.experimental_get_tracing_count() if function is not None else 0
    tuned.fit(_data(), epochs=1, steps_per_epoch=16, verbose=0)
    if tuning.choice.jit_compile:
        assert tuning.trace_s == 0.0
    else:
        assert tuning.trace_s > 0 and traced >= 1
        assert tuned.train_tf_function is function and function.experimental_get_tracing_count() == traced, \
            "fit traced the step again"


def test_backups_land_on_save_freq_steps_when_a_call_runs_several(tmp_path, monkeypatch):
    from hpml.components.trainer.callbacks import BackupAndRestore

    saved = []
    backup = BackupAndRestore(str(tmp_path / "backup"), save_freq=8, delete_checkpoint=False)
    monkeypatch.setattr(backup, "_backup", lambda epoch, batch=0: saved.append((epoch, batch)))
    model = _model()
    model._steps_per_execution.assign(4)
    model.make_train_function(force=True)
    model.fit(_data(), epochs=2, steps_per_epoch=20, verbose=0, callbacks=[backup])
    # Steps 0-7, 8-15, ... of the run: a backup after every 8th step, whatever the calls.
    assert saved == [(0, 7), (0, 15), (1, 3), (1, 11), (1, 19)], saved


def test_the_precision_check_takes_the_loss_each_model_evaluates_itself_with_a_custom_test_step_too():
    """The check computes eagerly (no test function traced), and must still be the model's own loss: Keras's compiled
    loss for a plain model, the Distiller's test_step (it compiles no loss at all)."""
    from hpml.components.trainer.distill.distiller import Distiller

    batches = _data().take(4)
    plain = _model()
    tf_keras.utils.set_random_seed(2)
    student = tf_keras.Sequential([tf_keras.Input((8,)), tf_keras.layers.Dense(16, activation="relu"),
                                   tf_keras.layers.Dense(2)])
    distiller = Distiller(student, [_model(seed=3)], temperature=2.0, alpha=0.5)
    distiller.compile(tf_keras.optimizers.Adam(0.01))
    for model in (plain, distiller):
        expected = model.evaluate(batches, verbose=0, return_dict=True)["loss"]
        assert expected > 0.1
        assert step_tuning.policies.loss_on(model, batches) == pytest.approx(expected, rel=1e-5)
