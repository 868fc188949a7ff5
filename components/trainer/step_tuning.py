"""The training step, tuned for this model on this machine: steps_per_execution, XLA and a mixed-precision policy,
chosen by measuring short bursts of the real model on the real input pipeline, as Transform tunes tf.data.

`candidate_precisions`, `measure_budget_s` and `pays_back` are pure (tested on described devices); `tune_step` measures:

1. steps_per_execution: 1, 2, 4, ... on the compiled model, whose train function loops over a variable trip count,
   so each value costs a burst of steps, not a retrace. The smallest value within 3% of the fastest wins (finer
   callbacks, such as progress and divergence checks, at no measurable cost), read from a fit of compute per step
   plus overhead per call to the bursts, with what fit adds to a call (`smallest_as_fast`).
2. XLA and a mixed-precision policy, each of which costs a compile, only where that compile fits the budget: 10% of
   the training time the measured rate predicts (5% for training of 10 minutes or more). For training under 10
   minutes, a policy the budget leaves out is still measured where a probe of the model's matmuls in its compute
   dtype predicts that it saves more of this training than measuring it costs (`pays_back`): a net gain in this run,
   and the cached choice pays in every later one. A policy must also keep the loss on the same batches within
   `PRECISION_TOLERANCE` of float32's.
3. Where a policy wins, steps_per_execution is swept again on the model built under it (bursts, no retrace), and
   that model is the one training uses: its trace is not made twice.

The model's weights, optimizer state and metrics are put back as they were, so training starts where it would have
without tuning. A choice is kept in `cache_dir` under a key of the model's variables, the batch, the device and
TensorFlow's version, and reused without measuring. Any knob given in `pinned` is used as given.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field

from hpml.components import files
from hpml.components.trainer import keras_internals

log = logging.getLogger("hpml.trainer")

TUNED_STEP_FILE = "tuned_step.json"
MAX_STEPS_PER_EXECUTION = 64
BURST_S = 0.03  # a timed burst of one candidate lasts at least this long
MIN_SWEEP_S = 0.25  # the steps_per_execution sweep may always take this long, however short the training
WITHIN = 0.03  # a smaller steps_per_execution this close to the fastest is preferred
# A value whose own best burst is this much slower than another value's is slower, whatever the fit says: the fit
# smooths noise, it must not overrule a gap wider than the noise (best-of-two bursts here vary by about a tenth).
BURST_NOISE = 0.15
# What tf_keras's fit adds to every call of the train function (callback hooks, its step bookkeeping), which bursts
# calling the function directly do not pay: 0.5 ms measured with tf_keras 2.21 on this project's 2-core machines.
# Left out, the fit of the bursts put 32 steps per call within 3% of 64 where fit ran 64 7-20% faster.
FIT_CALL_S = 0.0005
PRECISION_TOLERANCE = 0.02  # relative difference of the loss on the same batches, against float32
BUDGET_SHARE, LONG_BUDGET_SHARE, LONG_TRAINING_S = 0.10, 0.05, 600.0
PAYBACK = 1.0  # a policy measured past the budget must be predicted to save this many times what measuring costs
FLOAT32, MIXED_BFLOAT16, MIXED_FLOAT16 = "float32", "mixed_bfloat16", "mixed_float16"
KNOBS = ("steps_per_execution", "jit_compile", "precision")


@dataclass(frozen=True)
class StepChoice:
    steps_per_execution: int = 1
    jit_compile: bool = False
    precision: str = FLOAT32

    def describe(self) -> str:
        return (f"steps_per_execution={self.steps_per_execution}, XLA {'on' if self.jit_compile else 'off'}, "
                f"{self.precision}")


@dataclass
class StepTuning:
    """The choice, each measurement (examples/s), why each knob is what it is, and what measuring cost."""

    choice: StepChoice
    measured: list[dict] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    reused: bool = False
    trace_s: float = 0.0  # of `seconds`, tracing the training step, which fit then reuses

    def to_dict(self) -> dict:
        return {"choice": asdict(self.choice), "measured": self.measured, "reasons": self.reasons,
                "seconds": self.seconds, "reused": self.reused, "trace_s": self.trace_s}

    @staticmethod
    def from_dict(data: dict) -> StepTuning:
        return StepTuning(StepChoice(**data["choice"]), data.get("measured", []), data.get("reasons", {}),
                          data.get("seconds", 0.0), data.get("reused", False), data.get("trace_s", 0.0))


@dataclass(frozen=True)
class Device:
    """What decides which precisions are worth measuring: the device kind, a GPU's compute capability, and whether
    the CPU has bfloat16 instructions (AVX512_BF16 or AMX_BF16)."""

    kind: str = "CPU"  # "CPU", "GPU" or "TPU"
    compute_capability: tuple[int, int] | None = None
    cpu_bf16: bool = False

    def describe(self) -> str:
        if self.kind == "GPU":
            return f"GPU (compute capability {'.'.join(map(str, self.compute_capability or ()))})"
        return f"{self.kind}{' with bfloat16 instructions' if self.kind == 'CPU' and self.cpu_bf16 else ''}"


def candidate_precisions(device: Device) -> tuple[list[str], str]:
    """The policies worth measuring on this device beside float32, and why."""
    if device.kind == "TPU":
        return [MIXED_BFLOAT16], "a TPU computes in bfloat16 natively"
    if device.kind == "GPU":
        if device.compute_capability and device.compute_capability >= (7, 0):
            return [MIXED_FLOAT16], "a GPU with tensor cores (compute capability 7.0 or more) runs float16 fast"
        return [], "this GPU has no tensor cores (compute capability under 7.0): float16 would not be faster"
    if device.cpu_bf16:
        return [MIXED_BFLOAT16], "the CPU has bfloat16 instructions (AVX512_BF16 or AMX)"
    return [], "the CPU has no bfloat16 instructions: a mixed policy would only add casts"


def measure_budget_s(predicted_training_s: float) -> float:
    """How long measuring the costly candidates may take: a share of the training time the rate predicts."""
    share = LONG_BUDGET_SHARE if predicted_training_s >= LONG_TRAINING_S else BUDGET_SHARE
    return share * predicted_training_s


def pays_back(predicted_training_s: float, predicted_saving_s: float, cost_s: float) -> bool:
    """Whether a policy the budget leaves out is still worth measuring: training under 10 minutes (long training keeps
    its 5%) that a probe predicts it to shorten by at least PAYBACK times what measuring it costs."""
    return predicted_training_s < LONG_TRAINING_S and predicted_saving_s >= PAYBACK * cost_s


def compute_dtype(policy: str) -> str:
    return {MIXED_BFLOAT16: "bfloat16", MIXED_FLOAT16: "float16"}.get(policy, "float32")


def this_device() -> Device:
    """The device training runs on: the first GPU or TPU TensorFlow sees, else the CPU and its instruction set."""
    import tensorflow as tf

    if tf.config.list_logical_devices("TPU"):
        return Device("TPU")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return Device("GPU", compute_capability=details.get("compute_capability"))
    return Device("CPU", cpu_bf16=_cpu_has_bf16())


def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            flags = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def cache_key(model, batch_size: int, device: Device, extra: str = "") -> str:
    """The same model shape, data and device: its variables' shapes and dtypes, its layers, the optimizer and loss,
    the batch size, the device and TensorFlow's version (and `extra`: the data's element spec, the pinned knobs)."""
    import tensorflow as tf

    parts = [f"{tuple(v.shape)}:{v.dtype.name}" for v in model.variables]  # not names: Keras numbers each model's
    parts += [type(layer).__name__ for layer in getattr(model, "layers", [])]
    parts += [type(model).__name__, type(model.optimizer).__name__, str(getattr(model, "loss", "")), str(batch_size),
              device.describe(), tf.__version__, extra]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _warm(model, iterator, steps: int) -> float:
    """Seconds of one untimed call at `steps` per call: the first after a new train function traces (and, under
    XLA, compiles) it."""
    keras_internals.set_steps_per_execution(model, steps)
    started = time.perf_counter()
    model.train_function(iterator)["loss"].numpy()
    return time.perf_counter() - started


def _rate(model, iterator, batch_size: int, steps: int) -> float:
    """Examples per second of a burst of calls at `steps` per call, lasting at least BURST_S."""
    keras_internals.set_steps_per_execution(model, steps)
    calls, started = 0, time.perf_counter()
    while True:
        outputs = model.train_function(iterator)
        calls += 1
        if time.perf_counter() - started >= BURST_S:
            break
    outputs["loss"].numpy()
    return calls * steps * batch_size / (time.perf_counter() - started)


def _loss_on(model, batches) -> float:
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


def _dense_kernel_shapes(model) -> list[tuple[int, int]]:
    import tf_keras

    return [tuple(layer.kernel.shape) for layer in keras_internals.sublayers(model, include_self=False)
            if isinstance(layer, tf_keras.layers.Dense) and len(layer.kernel.shape) == 2]


def matmul_step(kernel_shapes, rows: int, dtype: str):
    """A function running one training step's matmuls of dense layers with `kernel_shapes` on `rows` rows in
    `dtype`: the forward product and the two of the backward pass. A probe of what a compute dtype is worth here,
    costing a small trace instead of building and tracing the whole model again."""
    import tensorflow as tf

    generator = tf.random.Generator.from_seed(0)
    operands = [[tf.cast(generator.normal(shape), dtype) for shape in ((rows, fan_in), (fan_in, fan_out),
                                                                       (rows, fan_out))]
                for fan_in, fan_out in kernel_shapes]

    @tf.function
    def products():
        sums = []
        for x, kernel, grad in operands:
            sums += [tf.matmul(x, kernel), tf.matmul(x, grad, transpose_a=True),
                     tf.matmul(grad, kernel, transpose_b=True)]
        return tf.add_n([tf.cast(tf.reduce_sum(t), tf.float32) for t in sums])

    products().numpy()
    return products


def _seconds_per_call(function) -> float:
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < BURST_S:
        result = function()
        calls += 1
    result.numpy()
    return (time.perf_counter() - started) / calls


def predicted_saving_s(model, policy: str, batch_size: int, total_steps: int, needed_s: float = 0.0) -> float:
    """Seconds `policy` is predicted to save over `total_steps` steps: the model's matmuls in float32 against the
    policy's compute dtype, best of three interleaved bursts each. Casts and the rest of the step are not in it;
    measuring the policy settles that. Where the float32 matmuls alone take less than `needed_s`, no saving can reach
    it and the policy is not probed."""
    shapes = _dense_kernel_shapes(model)
    if not shapes:
        return 0.0
    rows = max(1, batch_size // model.distribute_strategy.num_replicas_in_sync)
    full = matmul_step(shapes, rows, "float32")
    best_full = _seconds_per_call(full)
    if total_steps * best_full < needed_s:
        return 0.0
    reduced = matmul_step(shapes, rows, compute_dtype(policy))
    best_reduced = _seconds_per_call(reduced)
    for _ in range(2):
        best_full = min(best_full, _seconds_per_call(full))
        best_reduced = min(best_reduced, _seconds_per_call(reduced))
    return total_steps * (best_full - best_reduced)


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
    cached = _read_cache(cache_dir, key)
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
    _write_cache(cache_dir, key, tuning)
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
    trace_s = _warm(model, iterator, spe_values[0])
    sweep_started = time.perf_counter()
    rates, rounds = _sweep(model, iterator, batch_size, spe_values, lambda rates: time.perf_counter() - sweep_started
                           > max(MIN_SWEEP_S, measure_budget_s(total_steps * batch_size / max(rates.values())) / 2))
    round_s = (time.perf_counter() - sweep_started) / rounds
    spe = smallest_as_fast(rates, batch_size)
    tuning.measured += [{"steps_per_execution": v, "jit_compile": False, "precision": FLOAT32,
                         "examples_per_s": r} for v, r in sorted(rates.items())]
    if "steps_per_execution" not in pinned:
        tuning.reasons["steps_per_execution"] = _spe_reason(spe, rates)
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
                savings[precision] = predicted_saving_s(model, precision, batch_size, total_steps,
                                                        needed_s=PAYBACK * candidate_cost)
            if not pays_back(predicted, savings[precision], candidate_cost):
                skipped.append((jit, precision))
                continue
            paid_back.add((jit, precision))
        at = spe  # the steps per call it is timed at
        if precision == FLOAT32:
            rate, _ = _measure_on(model, iterator, batch_size, spe, jit)  # its trace is not kept: XLA is off after
        else:
            if reference is None:
                reference = _reference_loss(model, precision_check, rebuild)
            # In turns with float32 without XLA, while the model still is that (XLA's candidate switches it), at the
            # most steps per call swept: there the step's own cost shows, not the calls'. Its own steps per call
            # are swept after, if it wins.
            turns = not (jit or model.jit_compile or (False, FLOAT32) not in results)
            at = max(rates) if turns else spe
            rate, differences[precision], candidate, candidate_trace_s = _measure_policy(
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
               if key[1] == FLOAT32 or differences.get(key[1], 0.0) <= PRECISION_TOLERANCE}
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
                _warm(trained, iterator, spe_values[0])
                again, _ = _sweep(trained, iterator, batch_size, spe_values, lambda rates: False)  # both rounds
            spe = smallest_as_fast(again, batch_size)
            results[(jit, precision)] = again[spe]
            tuning.measured += [{"steps_per_execution": v, "jit_compile": jit, "precision": precision,
                                 "examples_per_s": r} for v, r in sorted(again.items())]
            tuning.reasons["steps_per_execution"] = (
                f"{spe} ran {again[spe]:,.0f} examples/s under {precision}"
                + (f", {again[spe] / again[1]:.1f}x one step per call" if 1 in again and spe != 1 else ""))
    choice = StepChoice(spe, jit, precision)
    _explain(tuning, choice, results, differences, skipped, budget, predicted, compile_s, why, savings, paid_back)
    box = [iterator]
    del iterator
    _let_go(box)
    return choice, tuning, trained


def _let_go(box: list) -> None:
    """Empty `box`, which holds the measuring iterator's last reference, on another thread: deleting the iterator
    sometimes waited about 2 s, idle (no CPU), on this project's machines, a wait training need not start behind."""
    import threading

    threading.Thread(target=box.clear, name="hpml-drop-iterator", daemon=True).start()


def _sweep(model, iterator, batch_size: int, values: list[int], enough) -> tuple[dict[int, float], int]:
    """Examples/s at each steps_per_execution in `values`, best of up to two interleaved rounds (this machine's
    noise hits every value alike), and the rounds run; a round stops two doublings past the knee, and
    `enough(rates)` ends the sweep after its first round."""
    rates: dict[int, float] = {}
    for rounds in (1, 2):  # noqa: B007 - how many ran is returned
        best_so_far, flat = 0.0, 0
        for value in values:
            rate = _rate(model, iterator, batch_size, value)
            rates[value] = max(rates.get(value, 0.0), rate)
            # Past the knee, more steps per call only cost time: two doublings without a gain end the round.
            flat = flat + 1 if rates[value] < (1 + WITHIN) * best_so_far else 0
            best_so_far = max(best_so_far, rates[value])
            if flat >= 2:
                break
        if enough(rates):
            break
    return rates, rounds


def smallest_as_fast(rates: dict[int, float], batch_size: int | None = None) -> int:
    """The smallest steps_per_execution within WITHIN of the fastest: finer callbacks at no measurable cost.

    A call's time is its steps' compute plus a fixed overhead, so a step costs `c + o / steps_per_execution`. That
    line is fitted to every value's best burst (least squares in 1 / steps_per_execution), and the choice is read
    from the fit, not from single bursts, which on a noisy machine can make a small value look as fast as a large
    one. Fewer than three values, a fit that is not a cost falling with more steps, or a fitted choice that its own
    bursts show slower than another value's by more than BURST_NOISE, fall back to the bursts.
    Given the `batch_size`, each call also pays FIT_CALL_S, the work `fit` adds around a call, which bursts do not."""
    if batch_size:
        rates = {v: 1.0 / (1.0 / r + FIT_CALL_S / (batch_size * v)) for v, r in rates.items()}
    values = sorted(rates)
    if len(values) >= 3:
        xs = [1.0 / v for v in values]
        ys = [1.0 / rates[v] for v in values]  # seconds per example, proportional to seconds per step
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        spread = sum((x - mean_x) ** 2 for x in xs)
        overhead = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
        compute = mean_y - overhead * mean_x
        if overhead > 0 and compute > 0:
            fitted = {v: 1.0 / (compute + overhead / v) for v in values}
            choice = min(v for v in values if fitted[v] >= (1 - WITHIN) * fitted[values[-1]])
            if rates[choice] >= (1 - BURST_NOISE) * max(rates.values()):
                return choice
    best = max(rates.values())
    return min(value for value, rate in rates.items() if rate >= (1 - WITHIN) * best)


def _spe_reason(spe: int, rates: dict[int, float]) -> str:
    """Why `spe`, in the numbers measured: its own rate, and the fastest burst where that was another value's."""
    fastest = max(rates, key=rates.get)
    if spe == 1 and fastest == 1:
        return "more steps per call were not faster here"
    reason = f"{spe} ran {rates[spe]:,.0f} examples/s, {rates[spe] / rates[1]:.1f}x one step per call"
    if fastest != spe:
        reason += (f"; {fastest}'s best burst ran {rates[fastest] / rates[spe] - 1:.0%} faster, within the noise "
                   "of the fit of every value's bursts, and fewer steps per call keep callbacks finer")
    return reason


def _measure_on(model, iterator, batch_size: int, spe: int, jit: bool, against=None) -> tuple[float, float]:
    """(examples/s, seconds tracing its step) of `model` with XLA `jit` at `spe` steps per call. With `against` (a
    model already measured at `fastest` examples/s), the two take turns, three bursts each, and the rate is `fastest`
    times the ratio of their best bursts: a comparison this machine's noise cannot tilt by striking one of them
    alone."""
    model.jit_compile = jit
    keras_internals.build_looping_train_function(model, spe)
    trace_s = _warm(model, iterator, spe)
    if against is None:
        return max(_rate(model, iterator, batch_size, spe) for _ in range(2)), trace_s
    baseline, fastest = against
    ours = theirs = 0.0
    for _ in range(3):
        ours = max(ours, _rate(model, iterator, batch_size, spe))
        theirs = max(theirs, _rate(baseline, iterator, batch_size, spe))
    return fastest * ours / theirs, trace_s


def _reference_loss(model, precision_check, rebuild) -> float:
    """float32's loss on the precision check's batches at its weights: on the model itself where it is float32 (its
    weights are put back after measuring anyway), else on a twin built under float32."""
    batches, weights = precision_check
    if model.dtype_policy.name == FLOAT32:
        model.set_weights(weights)
        return _loss_on(model, batches)
    twin = _build_under(FLOAT32, rebuild)
    twin.set_weights(weights)
    return _loss_on(twin, batches)


def _measure_policy(precision_check, reference: float, iterator, rebuild, policy: str, spe: int, jit: bool,
                    batch_size: int, against=None):
    """(examples/s, relative loss difference from float32 on the same batches at the same weights, the model, seconds
    tracing its step) of the model built again under `policy`, timed in turns with `against` where given. The model
    leaves as it was built, with the check's weights: ready to train."""
    from hpml.components.trainer.model_state import restored_afterwards

    batches, weights = precision_check
    candidate = _build_under(policy, rebuild)
    candidate.set_weights(weights)
    candidate.optimizer.build(candidate.trainable_variables)
    with restored_afterwards(candidate):
        difference = abs(_loss_on(candidate, batches) - reference) / max(abs(reference), 1e-6)
        rate, trace_s = _measure_on(candidate, iterator, batch_size, spe, jit, against)
    keras_internals.mark_looping(candidate)
    return rate, difference, candidate, trace_s


def _explain(tuning, choice, results, differences, skipped, budget, predicted, compile_s, why, savings,
             paid_back) -> None:
    """Each knob's reason, from what was measured, what the budget left out and what the matmul probe predicted."""
    base = results.get((False, FLOAT32))

    def probed(policy) -> str:
        if policy not in savings:
            return ""
        if any(key[1] == policy for key in paid_back):
            return (f"; measured past the budget: a probe of its matmuls predicted it to save about "
                    f"{savings[policy]:.1f} s of this training")
        return (f"; a probe of its matmuls predicts it to save about {max(savings[policy], 0.0):.1f} s, less than "
                "measuring it would cost")

    def versus(key) -> str:
        rate = results[key]
        return f"{rate:,.0f} examples/s" + (f", {rate / base:.2f}x float32 without XLA" if base else "")

    over_budget = (f"compiling a candidate (about {compile_s:.1f} s) would take measuring past its {budget:.1f} s "
                   f"budget, {_share(predicted)} of the {predicted:.0f} s this training should take")
    if "jit_compile" not in tuning.reasons:
        xla = [key for key in results if key[0]]
        if not xla:
            tuning.reasons["jit_compile"] = f"not measured: {over_budget}"
        elif choice.jit_compile:
            tuning.reasons["jit_compile"] = f"XLA: {versus((True, choice.precision))}"
        else:
            best = max(xla, key=results.get)
            tuning.reasons["jit_compile"] = f"off: with XLA, at best {versus(best)}"
    if "precision" not in tuning.reasons:
        policy = next((key[1] for key in list(results) + skipped if key[1] != FLOAT32), None)
        if policy is None:
            tuning.reasons["precision"] = "float32"
        elif policy not in differences:
            tuning.reasons["precision"] = f"float32: {policy} not measured: {over_budget}{probed(policy)}"
        elif differences[policy] > PRECISION_TOLERANCE:
            tuning.reasons["precision"] = (f"float32: {policy}'s loss differs by {differences[policy]:.1%} from "
                                           f"float32's on the same batches, over the {PRECISION_TOLERANCE:.0%} "
                                           "allowed")
        elif choice.precision == policy:
            tuning.reasons["precision"] = (f"{policy} ({why}): {versus((choice.jit_compile, policy))}, loss within "
                                           f"{differences[policy]:.2%} of float32's{probed(policy)}")
        else:
            best = max((key for key in results if key[1] == policy), key=results.get)
            tuning.reasons["precision"] = f"float32: {policy} ran at best {versus(best)}{probed(policy)}"


def _share(predicted_s: float) -> str:
    return f"{100 * (LONG_BUDGET_SHARE if predicted_s >= LONG_TRAINING_S else BUDGET_SHARE):.0f}%"


def _build_under(policy: str, rebuild):
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
        model = trained if trained is not None else _build_under(choice.precision, rebuild)
        model.set_weights(weights)
    if not keras_internals.has_looping_train_function(model) or bool(model.jit_compile) != choice.jit_compile:
        model.jit_compile = choice.jit_compile
        keras_internals.build_looping_train_function(model, choice.steps_per_execution)
    keras_internals.set_steps_per_execution(model, choice.steps_per_execution)
    return model


def _read_cache(cache_dir: str | None, key: str) -> StepTuning | None:
    if not cache_dir:
        return None
    try:
        with open(os.path.join(cache_dir, f"{key}.json"), encoding="utf-8") as handle:
            return StepTuning.from_dict(json.load(handle))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(cache_dir: str | None, key: str, tuning: StepTuning) -> None:
    if not cache_dir:
        return
    try:
        files.write_text(os.path.join(cache_dir, f"{key}.json"), json.dumps(tuning.to_dict(), indent=2))
    except OSError as err:  # a cache that cannot be written costs a measurement next time, nothing else
        log.warning("the tuned step could not be cached in %s: %s", cache_dir, err)


# Strategies whose training step tune_training_step measures: one process drives every replica, so a burst on the
# chief times the whole step. Under multi_worker_mirrored the workers would have to time their steps in lockstep,
# parameter_server's coordinator schedules steps on the workers, and gpipe's schedule is its own step.
TUNABLE_STRATEGIES = ("one_device", "mirrored", "central_storage", "tpu")


def default_cache_dir() -> str:
    """Where tuned steps are kept between runs on this machine: `$XDG_CACHE_HOME/hpml/tuned_steps`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hpml", "tuned_steps")


def _largest_power_of_two_dividing(number: int) -> int:
    return number & -number


def tune_training_step(model, dataset, fn_args, hyperparameters: dict, *, strategy_name: str, steps_per_epoch: int,
                       epochs: int, batch_size: int, rebuild=None, save_freq="epoch"):
    """A run_fn's tuned step: measures (or reuses) the fastest step for `model` on its training `dataset` and returns
    the model to fit. Hyperparameters `steps_per_execution`, `jit_compile` and `precision` pin a knob. The decision
    goes to `tuned_step.json` in the model_run dir, which the run record and report show."""
    import tensorflow as tf

    pinned = {knob: hyperparameters.get(knob) for knob in KNOBS}
    if strategy_name not in TUNABLE_STRATEGIES:
        tuning = StepTuning(StepChoice(int(pinned["steps_per_execution"] or 1)),
                            reasons={"steps_per_execution": f"not measured under {strategy_name}: its workers (or "
                                                            "its schedule) set the pace of a step, not one process"})
        model = apply_choice(model, tuning.choice) if pinned["steps_per_execution"] else model
    else:
        bound = MAX_STEPS_PER_EXECUTION
        if isinstance(save_freq, int) and save_freq > 0:  # backups land on whole calls: keep them on save_freq
            bound = min(bound, _largest_power_of_two_dividing(save_freq))
        model, tuning = tune_step(model, dataset, batch_size=batch_size, total_steps=steps_per_epoch * epochs,
                                  pinned=pinned, rebuild=rebuild, cache_dir=default_cache_dir(),
                                  max_steps_per_execution=bound)
    if fn_args.model_run_dir:
        tf.io.gfile.makedirs(fn_args.model_run_dir)
        with tf.io.gfile.GFile(os.path.join(fn_args.model_run_dir, TUNED_STEP_FILE), "w") as handle:
            handle.write(json.dumps(tuning.to_dict(), indent=2))
    how = "reused for this model, data and device" if tuning.reused else \
        f"measured in {tuning.seconds:.1f} s, {tuning.trace_s:.1f} s of it tracing the step that training reuses"
    log.info("training step: %s (%s; the run report gives the reason for each choice)", tuning.choice.describe(),
             how)
    for knob, reason in tuning.reasons.items():
        log.debug("training step: %s: %s", knob, reason)
    return model
