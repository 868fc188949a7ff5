"""Profile each layer's forward + backward time on a sample batch, for balance='time'."""
from __future__ import annotations

import time

import tensorflow as tf


def layer_costs(layers, sample, repeats: int = 5) -> list[float]:
    """Median seconds of forward + backward per layer, each fed the previous layer's output."""
    costs, x = [], sample
    for layer in layers:
        @tf.function
        def step(inp, layer=layer):
            floats = [t for t in tf.nest.flatten(inp) if t.dtype.is_floating]
            with tf.GradientTape() as tape:
                tape.watch(floats)
                out = layer(inp, training=True)
                total = tf.reduce_sum(out)
            return out, tape.gradient(total, floats + layer.trainable_variables)

        out, _ = step(x)  # build and trace
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            _, grads = step(x)
            tf.nest.map_structure(lambda g: g.numpy() if g is not None else None, grads)
            times.append(time.perf_counter() - start)
        costs.append(sorted(times)[len(times) // 2])
        x = out
    return costs


def stage_costs(costs: list[float], stages: list[list[int]]) -> list[float]:
    return [sum(costs[i] for i in stage) for stage in stages]


def measured_bubble(order, forward_costs: list[float]) -> float:
    """The idle fraction of the schedule when each stage takes its measured time (backward = 2x)."""
    from hpml.components.trainer.gpipe import schedule

    return schedule.simulate(order, forward_cost=forward_costs).bubble
