"""tune_step: measure the knobs in order of cost within the budget, put the model back as it was, apply the choice
and keep it in the cache."""
from __future__ import annotations

import json
import time

from hpml.components.trainer import keras_internals
from hpml.components.trainer.step_tuning import knobs, probe
from hpml.components.trainer.step_tuning.cache import cache_key, read_cache, write_cache
from hpml.components.trainer.step_tuning.explain import explain
from hpml.components.trainer.step_tuning.knobs import (FLOAT32, KNOBS, LONG_TRAINING_S, MAX_STEPS_PER_EXECUTION,
                                                       MIN_SWEEP_S, PAYBACK, WITHIN, Device, StepChoice, StepTuning,
                                                       candidate_precisions, measure_budget_s, pays_back)
from hpml.components.trainer.step_tuning.policies import apply_choice, measure_on, measure_policy, reference_loss
from hpml.components.trainer.step_tuning.probe import this_device
from hpml.components.trainer.step_tuning.sweep import smallest_as_fast, spe_reason, sweep, warm_up


def tune_step(model, dataset, *, batch_size: int, total_steps: int, pinned: dict | None = None,
              rebuild=None, device: Device | None = None, cache_dir: str | None = None,
              max_steps_per_execution: int = MAX_STEPS_PER_EXECUTION) -> tuple[object, StepTuning]:
    """Measure and apply the fastest training step for `model` (compiled) on `dataset` (repeating batches of
    `batch_size`); returns the model to train (a new one only where a mixed policy won, built by `rebuild()`)
    and what was decided. `total_steps` is the training's length, which bounds what measuring may cost."""
    pinned = {k: v for k, v in (pinned or {}).items() if v is not None}
    if set(KNOBS) <= set(pinned):  # nothing left to measure
        choice = StepChoice(int(pinned["steps_per_execution"]), bool(pinned["jit_compile"]), pinned["precision"])
        return apply_choice(model, choice, rebuild), StepTuning(choice, reasons=dict.fromkeys(
            KNOBS, "pinned in hyperparameters"))
    device = device or this_device()
    key = cache_key(model, batch_size, device, f"{json.dumps(pinned, sort_keys=True)} {dataset.element_spec}")
    cached = read_cache(cache_dir, key)
    if cached is not None:
        cached.reused, cached.seconds, cached.trace_s = True, 0.0, 0.0
        return apply_choice(model, cached.choice, rebuild), cached
    from hpml.components.trainer.model_state import restored_afterwards

    started = time.perf_counter()
    model.optimizer.build(model.trainable_variables)  # its slots exist now, to be put back after measuring
    with restored_afterwards(model):
        choice, tuning, trained = _measure(model, dataset, batch_size, total_steps, pinned, rebuild, device,
                                           max_steps_per_execution, started)
    tuning.choice = choice
    tuning.seconds = time.perf_counter() - started
    model = apply_choice(model, choice, rebuild, trained=trained)
    write_cache(cache_dir, key, tuning)
    return model, tuning


def _measure(model, dataset, batch_size, total_steps, pinned, rebuild, device, max_steps_per_execution, started):
    tuning = StepTuning(StepChoice())
    policies, why = candidate_precisions(device)
    precision_check = (dataset.take(4).cache(), model.get_weights())  # a mixed policy starts from these weights
    reference = None  # float32's loss on those batches at those weights, taken when a policy is first measured
    iterator = iter(model.distribute_strategy.experimental_distribute_dataset(dataset))
    keras_internals.build_looping_train_function(model, max_steps_per_execution)  # which fit reuses
    looping = None if model.jit_compile else keras_internals.train_functions(model)  # without XLA

    # 1. steps_per_execution: cheap, measured on the compiled model.
    if "steps_per_execution" in pinned:
        spe_values = [int(pinned["steps_per_execution"])]
        tuning.reasons["steps_per_execution"] = "pinned in hyperparameters"
    else:
        spe_values, value = [], 1
        while value <= min(max_steps_per_execution, max(1, total_steps)):
            spe_values.append(value)
            value *= 2
    trace_s = warm_up(model, iterator, spe_values[0])
    sweep_started = time.perf_counter()
    rates, rounds = sweep(model, iterator, batch_size, spe_values, lambda rates: time.perf_counter() - sweep_started
                           > max(MIN_SWEEP_S, measure_budget_s(total_steps * batch_size / max(rates.values())) / 2))
    round_s = (time.perf_counter() - sweep_started) / rounds
    spe = smallest_as_fast(rates, batch_size)
    tuning.measured += [{"steps_per_execution": v, "jit_compile": False, "precision": FLOAT32,
                         "examples_per_s": r} for v, r in sorted(rates.items())]
    if "steps_per_execution" not in pinned:
        tuning.reasons["steps_per_execution"] = spe_reason(spe, rates)
    choice = StepChoice(spe)
    fastest = rates[spe]

    # 2. XLA and a mixed policy: each candidate costs a compile, so they are measured, most promising first, only
    # while the budget allows. Together, not one after the other: on a CPU, bfloat16 can win alone and lose with XLA.
    predicted = total_steps * batch_size / fastest
    budget = measure_budget_s(predicted)
    compile_s = max(trace_s, 0.2)
    jit_pinned, precision_pinned = pinned.get("jit_compile"), pinned.get("precision")
    jits = [bool(jit_pinned)] if jit_pinned is not None else [False, True]
    precisions = [precision_pinned] if precision_pinned is not None else \
        [FLOAT32] + (policies if rebuild is not None else [])
    if jit_pinned is not None:
        tuning.reasons["jit_compile"] = "pinned in hyperparameters"
    if precision_pinned is not None:
        tuning.reasons["precision"] = "pinned in hyperparameters"
    elif not policies:
        tuning.reasons["precision"] = f"float32: {why}"
    elif rebuild is None:
        tuning.reasons["precision"] = "float32: the run_fn gives no way to build the model again under a policy"
    policies_here = [p for p in precisions if p != FLOAT32]
    ordered = [(False, p) for p in policies_here] + [(True, FLOAT32)] + [(True, p) for p in policies_here]
    candidates = [key for key in ordered if key[0] in jits and key[1] in precisions]
    results = {(False, FLOAT32): fastest} if (False, FLOAT32) in [(j, p) for j in jits for p in precisions] else {}
    differences: dict[str, float] = {}
    skipped, savings, paid_back = [], {}, set()
    measured_models: dict[tuple, object] = {}  # a policy's model, kept for training if it wins
    policy_trace_s = 0.0  # tracing that model's step
    candidate_cost = 1.5 * compile_s  # building, tracing and timing one candidate
    for jit, precision in candidates:
        if time.perf_counter() - started + 2 * compile_s > budget:
            if jit or precision == FLOAT32 or predicted >= LONG_TRAINING_S or \
                    predicted < PAYBACK * candidate_cost:  # (nothing under that could save enough)
                skipped.append((jit, precision))
                continue
            if precision not in savings:
                savings[precision] = probe.predicted_saving_s(model, precision, batch_size, total_steps,
                                                        needed_s=PAYBACK * candidate_cost)
            if not pays_back(predicted, savings[precision], candidate_cost):
                skipped.append((jit, precision))
                continue
            paid_back.add((jit, precision))
        at = spe  # the steps per call it is timed at
        if precision == FLOAT32:
            rate, _ = measure_on(model, iterator, batch_size, spe, jit)  # its trace is not kept: XLA is off after
        else:
            if reference is None:
                reference = reference_loss(model, precision_check, rebuild)
            # In turns with float32 without XLA, while the model still is that (XLA's candidate switches it), at the
            # most steps per call swept: there the step's own cost shows, not the calls'. Its own steps per call
            # are swept after, if it wins.
            turns = not (jit or model.jit_compile or (False, FLOAT32) not in results)
            at = max(rates) if turns else spe
            rate, differences[precision], candidate, candidate_trace_s = measure_policy(
                precision_check, reference, iterator, rebuild, precision, at, jit, batch_size,
                (model, fastest) if turns else None)
            if rate > max((results[k] for k in measured_models), default=0.0):
                measured_models = {(jit, precision): candidate}  # only the fastest policy's model is kept
                policy_trace_s = candidate_trace_s
            del candidate
        results[(jit, precision)] = rate
        tuning.measured.append({"steps_per_execution": at, "jit_compile": jit, "precision": precision,
                                "examples_per_s": rate, **({"loss_difference": differences[precision]}
                                                           if precision in differences else {})})
    allowed = {key: rate for key, rate in results.items()
               if key[1] == FLOAT32 or differences.get(key[1], 0.0) <= knobs.PRECISION_TOLERANCE}
    if not allowed:  # only pinned candidates, none measured: take the pins as they are
        jit, precision = jits[0], precisions[0]
    else:
        best_key = max(allowed, key=allowed.get)
        # float32 without XLA unless a costly knob is clearly faster
        base = allowed.get((False, FLOAT32))
        jit, precision = best_key if base is None or allowed[best_key] > (1 + WITHIN) * base else (False, FLOAT32)
    if any(key[0] and key[1] == FLOAT32 for key in results):  # XLA was switched on to measure it: switch it off
        model.jit_compile = False
        if looping is not None:  # the function traced without XLA, which fit can reuse
            keras_internals.set_train_functions(model, looping)
        else:
            keras_internals.build_looping_train_function(model, spe)
            trace_s = 0.0
    trained = measured_models.get((jit, precision))
    # The trace training reuses: float32's without XLA, or the kept policy model's; float32 under XLA traces anew.
    tuning.trace_s = policy_trace_s if trained is not None else 0.0 if jit else trace_s

    # 3. The winning policy's own steps_per_execution: a sweep of bursts (two rounds) on its model, which training
    # then uses.
    if trained is not None and "steps_per_execution" not in pinned and len(spe_values) > 1:
        if time.perf_counter() - started + 2 * round_s <= budget or (
                (jit, precision) in paid_back and pays_back(predicted, savings[precision],
                                                            candidate_cost + 2 * round_s)):
            from hpml.components.trainer.model_state import restored_afterwards

            with restored_afterwards(trained):
                warm_up(trained, iterator, spe_values[0])
                again, _ = sweep(trained, iterator, batch_size, spe_values, lambda rates: False)  # both rounds
            spe = smallest_as_fast(again, batch_size)
            results[(jit, precision)] = again[spe]
            tuning.measured += [{"steps_per_execution": v, "jit_compile": jit, "precision": precision,
                                 "examples_per_s": r} for v, r in sorted(again.items())]
            tuning.reasons["steps_per_execution"] = (
                f"{spe} ran {again[spe]:,.0f} examples/s under {precision}"
                + (f", {again[spe] / again[1]:.1f}x one step per call" if 1 in again and spe != 1 else ""))
    choice = StepChoice(spe, jit, precision)
    explain(tuning, choice, results, differences, skipped, budget, predicted, compile_s, why, savings, paid_back)
    box = [iterator]
    del iterator
    _let_go(box)
    return choice, tuning, trained


def _let_go(box: list) -> None:
    """Empty `box`, which holds the measuring iterator's last reference, on another thread: deleting the iterator
    sometimes waited about 2 s, idle (no CPU), on this project's machines, a wait training need not start behind."""
    import threading

    threading.Thread(target=box.clear, name="hpml-drop-iterator", daemon=True).start()
