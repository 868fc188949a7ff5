"""tune_step: measure the knobs in order of cost within the budget, put the model back as it was, apply the choice
and keep it in the cache."""
from __future__ import annotations

import json
import math
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
        return _metrics_built(apply_choice(model, choice, rebuild), dataset, batch_size), StepTuning(
            choice, reasons=dict.fromkeys(KNOBS, "pinned in hyperparameters"))
    device = device or this_device()
    key = cache_key(model, batch_size, device, f"{json.dumps(pinned, sort_keys=True)} {dataset.element_spec}")
    cached = read_cache(cache_dir, key)
    if cached is not None:
        cached.reused, cached.seconds, cached.trace_s = True, 0.0, 0.0
        return _metrics_built(apply_choice(model, cached.choice, rebuild), dataset, batch_size), cached
    from hpml.components.trainer.model_state import restored_afterwards

    started = time.perf_counter()
    _metrics_built(model, dataset, batch_size)  # before the trace that measuring makes and fit reuses
    model.optimizer.build(model.trainable_variables)  # its slots exist now, to be put back after measuring
    with restored_afterwards(model):
        choice, tuning, trained = _measure(model, dataset, batch_size, total_steps, pinned, rebuild, device,
                                           max_steps_per_execution, started)
    tuning.choice = choice
    tuning.seconds = time.perf_counter() - started
    model = apply_choice(model, choice, rebuild, trained=trained)
    write_cache(cache_dir, key, tuning)
    return model, tuning


def _metrics_built(model, dataset, batch_size: int):
    """`model`, its compiled metrics built for batches of `dataset`: its train function then traces once. From the
    dataset's spec where it can, else on its first batch."""
    if not keras_internals.build_compiled_metrics_from_spec(model, dataset.element_spec, batch_size):
        keras_internals.build_compiled_metrics(model, next(iter(dataset.take(1))))
    return model


def _measure(model, dataset, batch_size, total_steps, pinned, rebuild, device, max_steps_per_execution, started):
    """(the choice, what was measured and why, the winning policy's model or None)."""
    return _Measurement(model, dataset, batch_size, total_steps, pinned, rebuild, device, max_steps_per_execution,
                        started).run()


class _Measurement:
    """One measuring of the training step, in three phases that share what they find: (1) steps_per_execution,
    swept on the compiled model; (2) XLA and a mixed policy, each costing a compile, within the budget; (3) the
    winning policy's own steps_per_execution."""

    def __init__(self, model, dataset, batch_size, total_steps, pinned, rebuild, device, max_steps_per_execution,
                 started):
        self.model, self.batch_size, self.total_steps, self.pinned, self.rebuild = (model, batch_size, total_steps,
                                                                                     pinned, rebuild)
        self.started = started
        self.tuning = StepTuning(StepChoice())
        self.policies, self.why = candidate_precisions(device)
        self.precision_check = (dataset.take(4).cache(), model.get_weights())  # a mixed policy starts from these
        self.reference = None  # float32's loss on those batches at those weights, taken when a policy is measured
        self.iterator = iter(model.distribute_strategy.experimental_distribute_dataset(dataset))
        keras_internals.build_looping_train_function(model, max_steps_per_execution)  # which fit reuses
        self.looping = None if model.jit_compile else keras_internals.train_functions(model)  # without XLA
        self.max_steps_per_execution = max_steps_per_execution
        self.differences: dict[str, float] = {}
        self.skipped, self.savings, self.paid_back = [], {}, set()
        self.measured_models: dict[tuple, object] = {}  # a policy's model, kept for training if it wins
        self.policy_trace_s = 0.0  # tracing that model's step

    def run(self):
        self.sweep_steps_per_execution()
        self.measure_costly_knobs()
        jit, precision = self.choose()
        trained = self.measured_models.get((jit, precision))
        # The trace training reuses: float32's without XLA, or the kept policy model's; float32 under XLA anew.
        self.tuning.trace_s = self.policy_trace_s if trained is not None else 0.0 if jit else self.trace_s
        if trained is not None:
            self.resweep(trained, jit, precision)
        choice = StepChoice(self.spe, jit, precision)
        explain(self.tuning, choice, self.results, self.differences, self.skipped, self.budget, self.predicted,
                self.compile_s, self.why, self.savings, self.paid_back)
        box = [self.iterator]
        del self.iterator
        _let_go(box)
        return choice, self.tuning, trained

    def sweep_steps_per_execution(self) -> None:
        """Phase 1: cheap, measured on the compiled model."""
        model, pinned, tuning = self.model, self.pinned, self.tuning
        if "steps_per_execution" in pinned:
            self.spe_values = [int(pinned["steps_per_execution"])]
            tuning.reasons["steps_per_execution"] = "pinned in hyperparameters"
        else:
            self.spe_values, value = [], 1
            while value <= min(self.max_steps_per_execution, max(1, self.total_steps)):
                self.spe_values.append(value)
                value *= 2
        self.trace_s = warm_up(model, self.iterator, self.spe_values[0])
        sweep_started = time.perf_counter()
        self.rates, rounds = sweep(  # half the budget the rate so far predicts, and MIN_SWEEP_S however short
            model, self.iterator, self.batch_size, self.spe_values,
            lambda rates: max(MIN_SWEEP_S, measure_budget_s(self.total_steps * self.batch_size / max(rates.values()))
                              / 2))
        self.round_s = (time.perf_counter() - sweep_started) / rounds
        self.spe = smallest_as_fast(self.rates, self.batch_size)
        tuning.measured += [{"steps_per_execution": v, "jit_compile": False, "precision": FLOAT32,
                             "examples_per_s": r} for v, r in sorted(self.rates.items())]
        if "steps_per_execution" not in pinned:
            tuning.reasons["steps_per_execution"] = spe_reason(self.spe, self.rates)
        self.fastest = self.rates[self.spe]
        self.predicted = self.total_steps * self.batch_size / self.fastest
        self.budget = measure_budget_s(self.predicted)
        self.compile_s = max(self.trace_s, 0.2)
        self.candidate_cost = 1.5 * self.compile_s  # building, tracing and timing one candidate

    def _candidates(self) -> list[tuple[bool, str]]:
        """(XLA, precision) pairs to measure, most promising first; says why where a knob is pinned or out."""
        pinned, tuning = self.pinned, self.tuning
        jit_pinned, precision_pinned = pinned.get("jit_compile"), pinned.get("precision")
        self.jits = [bool(jit_pinned)] if jit_pinned is not None else [False, True]
        self.precisions = [precision_pinned] if precision_pinned is not None else \
            [FLOAT32] + (self.policies if self.rebuild is not None else [])
        if jit_pinned is not None:
            tuning.reasons["jit_compile"] = "pinned in hyperparameters"
        if precision_pinned is not None:
            tuning.reasons["precision"] = "pinned in hyperparameters"
        elif not self.policies:
            tuning.reasons["precision"] = f"float32: {self.why}"
        elif self.rebuild is None:
            tuning.reasons["precision"] = "float32: the run_fn gives no way to build the model again under a policy"
        policies_here = [p for p in self.precisions if p != FLOAT32]
        ordered = [(False, p) for p in policies_here] + [(True, FLOAT32)] + [(True, p) for p in policies_here]
        return [key for key in ordered if key[0] in self.jits and key[1] in self.precisions]

    def _affordable(self, jit: bool, precision: str) -> bool:
        """Within the budget, or (a policy only) sure to pay back its cost in the training it speeds up."""
        if time.perf_counter() - self.started + 2 * self.compile_s <= self.budget:
            return True
        if jit or precision == FLOAT32 or self.predicted >= LONG_TRAINING_S or \
                self.predicted < PAYBACK * self.candidate_cost:  # (nothing under that could save enough)
            return False
        if precision not in self.savings:
            self.savings[precision] = probe.predicted_saving_s(self.model, precision, self.batch_size,
                                                               self.total_steps,
                                                               needed_s=PAYBACK * self.candidate_cost)
        if not pays_back(self.predicted, self.savings[precision], self.candidate_cost):
            return False
        self.paid_back.add((jit, precision))
        return True

    def measure_costly_knobs(self) -> None:
        """Phase 2: XLA and a mixed policy, together, not one after the other (on a CPU, bfloat16 can win alone
        and lose with XLA), only while the budget allows."""
        candidates = self._candidates()
        self.results = {(False, FLOAT32): self.fastest} \
            if (False, FLOAT32) in [(j, p) for j in self.jits for p in self.precisions] else {}
        for jit, precision in candidates:
            if not self._affordable(jit, precision):
                self.skipped.append((jit, precision))
                continue
            at, rate = self._measure_candidate(jit, precision)
            self.results[(jit, precision)] = rate
            self.tuning.measured.append({
                "steps_per_execution": at, "jit_compile": jit, "precision": precision, "examples_per_s": rate,
                **({"loss_difference": self.differences[precision]} if precision in self.differences else {})})

    def _measure_candidate(self, jit: bool, precision: str) -> tuple[int, float]:
        """(the steps per call it was timed at, its examples/s)."""
        if precision == FLOAT32:  # its trace is not kept: XLA is off after
            return self.spe, measure_on(self.model, self.iterator, self.batch_size, self.spe, jit)[0]
        if self.reference is None:
            self.reference = reference_loss(self.model, self.precision_check, self.rebuild)
        # In turns with float32 without XLA, while the model still is that (XLA's candidate switches it), at the
        # most steps per call swept: there the step's own cost shows, not the calls'. Its own steps per call are
        # swept after, if it wins.
        turns = not (jit or self.model.jit_compile or (False, FLOAT32) not in self.results)
        at = max(self.rates) if turns else self.spe
        rate, self.differences[precision], candidate, candidate_trace_s = measure_policy(
            self.precision_check, self.reference, self.iterator, self.rebuild, precision, at, jit, self.batch_size,
            (self.model, self.fastest) if turns else None)
        if rate > max((self.results[k] for k in self.measured_models), default=0.0):
            self.measured_models = {(jit, precision): candidate}  # only the fastest policy's model is kept
            self.policy_trace_s = candidate_trace_s
        return at, rate

    def choose(self) -> tuple[bool, str]:
        """The fastest allowed (XLA, precision): float32 without XLA unless a costly knob is clearly faster. The
        model is left without XLA where XLA was switched on to measure it."""
        allowed = {key: rate for key, rate in self.results.items()
                   if key[1] == FLOAT32 or self.differences.get(key[1], 0.0) <= knobs.PRECISION_TOLERANCE}
        if not allowed:  # only pinned candidates, none measured: take the pins as they are
            jit, precision = self.jits[0], self.precisions[0]
        else:
            best_key = max(allowed, key=allowed.__getitem__)
            base = allowed.get((False, FLOAT32))
            jit, precision = best_key if base is None or allowed[best_key] > (1 + WITHIN) * base else (False, FLOAT32)
        if any(key[0] and key[1] == FLOAT32 for key in self.results):  # XLA was on for measuring: switch it off
            self.model.jit_compile = False
            if self.looping is not None:  # the function traced without XLA, which fit can reuse
                keras_internals.set_train_functions(self.model, self.looping)
            else:
                keras_internals.build_looping_train_function(self.model, self.spe)
                self.trace_s = 0.0
        return jit, precision

    def resweep(self, trained, jit: bool, precision: str) -> None:
        """Phase 3: the winning policy's own steps_per_execution, a sweep of bursts (two rounds) on its model,
        which training then uses."""
        if "steps_per_execution" in self.pinned or len(self.spe_values) <= 1:
            return
        if not (time.perf_counter() - self.started + 2 * self.round_s <= self.budget or (
                (jit, precision) in self.paid_back and pays_back(self.predicted, self.savings[precision],
                                                                 self.candidate_cost + 2 * self.round_s))):
            return
        from hpml.components.trainer.model_state import restored_afterwards

        with restored_afterwards(trained):
            warm_up(trained, self.iterator, self.spe_values[0])
            again, _ = sweep(trained, self.iterator, self.batch_size, self.spe_values, lambda rates: math.inf)
        self.spe = smallest_as_fast(again, self.batch_size)
        self.results[(jit, precision)] = again[self.spe]
        self.tuning.measured += [{"steps_per_execution": v, "jit_compile": jit, "precision": precision,
                                  "examples_per_s": r} for v, r in sorted(again.items())]
        self.tuning.reasons["steps_per_execution"] = (
            f"{self.spe} ran {again[self.spe]:,.0f} examples/s under {precision}"
            + (f", {again[self.spe] / again[1]:.1f}x one step per call" if 1 in again and self.spe != 1 else ""))


def _let_go(box: list) -> None:
    """Empty `box`, which holds the measuring iterator's last reference, on another thread: deleting the iterator
    sometimes waited about 2 s, idle (no CPU), on this project's machines, a wait training need not start behind."""
    import threading

    threading.Thread(target=box.clear, name="hpml-drop-iterator", daemon=True).start()
