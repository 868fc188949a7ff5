"""Input stall: the share of a training step spent waiting for input.

The same steps are timed twice on a compiled tf_keras model: fed by the real pipeline, then fed
the same batches from memory. What the in-memory run saves is time the step waited on input.
The model's weights, optimizer state and metrics are put back afterwards.
"""
from __future__ import annotations

import time

WARMUP_STEPS = 2


def _timed_steps(model, dataset, steps: int, warmup: int) -> float:
    strategy = model.distribute_strategy
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    train_step = model.make_train_function()
    for _ in range(warmup):
        train_step(iterator)
    start = time.perf_counter()
    for _ in range(steps):
        outputs = train_step(iterator)
    _ = {k: float(v) for k, v in outputs.items()}  # wait for the last step to finish
    return time.perf_counter() - start


def measure_input_stall(model, dataset, steps: int = 30, repeats: int = 3, warmup: int = WARMUP_STEPS) -> dict:
    """{stall_fraction, real/in-memory seconds per step, steps}; `dataset` yields training batches.

    The first `warmup` steps of each run are not timed: 2 by default (tracing, first batch); a
    whole epoch to time only the warm epochs that follow it.
    """
    steps = max(1, steps)
    batches = dataset.take(steps + warmup).cache()
    count = int(batches.reduce(0, lambda n, _: n + 1))  # fills the in-memory cache
    if count < steps + warmup:
        raise ValueError(f"input stall needs {steps + warmup} batches, the dataset has {count}")
    from components.trainer.model_state import restored_afterwards

    real, memory = [], []
    with restored_afterwards(model):
        for _ in range(repeats):
            real.append(_timed_steps(model, dataset.take(steps + warmup), steps, warmup))
            memory.append(_timed_steps(model, batches, steps, warmup))
    real_step, memory_step = sorted(real)[len(real) // 2] / steps, sorted(memory)[len(memory) // 2] / steps
    return {"stall_fraction": max(0.0, 1.0 - memory_step / real_step), "real_step_s": real_step,
            "in_memory_step_s": memory_step, "steps": steps, "warmup_steps": warmup, "repeats": repeats}


STALL_FILE = "input_stall.json"


def record_input_stall(model, dataset, model_run_dir: str, steps: int = 30) -> dict:
    """Measure the stall and write it where the Trainer collects it for the run record."""
    import json
    import logging
    import os

    result = measure_input_stall(model, dataset, steps)
    with open(os.path.join(model_run_dir, STALL_FILE), "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    logging.getLogger("hpml.trainer").info(
        "input stall: %.1f%% of each step waits on input (%.2f ms per step from the pipeline, %.2f ms from memory)",
        100 * result["stall_fraction"], 1e3 * result["real_step_s"], 1e3 * result["in_memory_step_s"])
    return result
