"""steps_per_execution, measured: bursts of the compiled model's looping train function at each value, and the
choice read from them."""
from __future__ import annotations

import time

from hpml.components.trainer import keras_internals
from hpml.components.trainer.step_tuning.knobs import BURST_NOISE, BURST_S, FIT_CALL_S, WITHIN


def warm_up(model, iterator, steps: int) -> float:
    """Seconds of one untimed call at `steps` per call: the first after a new train function traces (and, under
    XLA, compiles) it."""
    keras_internals.set_steps_per_execution(model, steps)
    started = time.perf_counter()
    model.train_function(iterator)["loss"].numpy()
    return time.perf_counter() - started


def burst_rate(model, iterator, batch_size: int, steps: int) -> float:
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


def sweep(model, iterator, batch_size: int, values: list[int], limit_s) -> tuple[dict[int, float], int]:
    """Examples/s at each steps_per_execution in `values`, best of up to two interleaved rounds (this machine's
    noise hits every value alike), and the rounds run. A round stops two doublings past the knee, or before a value
    whose burst would end past `limit_s(rates)` seconds of sweeping (a call of that many steps lasts longest: for
    short training the largest values alone would pass the limit); a round that ends past it is the last."""
    rates: dict[int, float] = {}
    started, rounds = time.perf_counter(), 0
    for _ in (1, 2):
        best_so_far, flat, measured = 0.0, 0, False
        for value in values:
            if rates and time.perf_counter() - started + burst_s(value, batch_size, max(rates.values())) > \
                    limit_s(rates):
                break
            rate = burst_rate(model, iterator, batch_size, value)
            rates[value], measured = max(rates.get(value, 0.0), rate), True
            # Past the knee, more steps per call only cost time: two doublings without a gain end the round.
            flat = flat + 1 if rates[value] < (1 + WITHIN) * best_so_far else 0
            best_so_far = max(best_so_far, rates[value])
            if flat >= 2:
                break
        rounds += measured
        if not measured or time.perf_counter() - started > limit_s(rates):
            break
    return rates, rounds


def burst_s(steps: int, batch_size: int, examples_per_s: float) -> float:
    """How long a burst at `steps` per call lasts at `examples_per_s`: BURST_S, or one call where that is longer."""
    return max(BURST_S, steps * batch_size / examples_per_s)


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


def spe_reason(spe: int, rates: dict[int, float]) -> str:
    """Why `spe`, in the numbers measured: its own rate, and the fastest burst where that was another value's."""
    fastest = max(rates, key=rates.__getitem__)
    if spe == 1 and fastest == 1:
        return "more steps per call were not faster here"
    reason = f"{spe} ran {rates[spe]:,.0f} examples/s, {rates[spe] / rates[1]:.1f}x one step per call"
    if fastest != spe:
        reason += (f"; {fastest}'s best burst ran {rates[fastest] / rates[spe] - 1:.0%} faster, within the noise "
                   "of the fit of every value's bursts, and fewer steps per call keep callbacks finer")
    return reason
