"""Input stall: the share of a training step spent waiting for input.

The same steps are timed on a compiled tf_keras model fed by the real pipeline and fed the same
batches from memory; what the in-memory steps save is time the step waited on input. The two
feeds alternate in short blocks, because on a shared machine step times drift by tens of percent
over seconds while adjacent blocks see the same drift. The model's weights, optimizer state and
metrics are put back afterwards.
"""
from __future__ import annotations

import contextlib
import time

from hpml.components.artifacts import STALL_FILE

WARMUP_STEPS = 2
BLOCK_STEPS = 50


def _timed_block(train_step, iterator, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        outputs = train_step(iterator)
    _ = {k: float(v) for k, v in outputs.items()}  # wait for the last step to finish
    return time.perf_counter() - start


@contextlib.contextmanager
def _one_step_per_call(model):
    """A tuned model runs several steps per call; the stall is per step, so its calls run one while it is timed."""
    from hpml.components.trainer import keras_internals

    before = keras_internals.steps_per_execution(model)
    if before is None:
        yield
        return
    keras_internals.set_steps_per_execution(model, 1)
    try:
        yield
    finally:
        keras_internals.set_steps_per_execution(model, before)


def measure_input_stall(model, dataset, steps: int = 30, repeats: int = 3, warmup: int = WARMUP_STEPS,
                        block_steps: int = BLOCK_STEPS, memory_source=None) -> dict:
    """{stall_fraction, real/in-memory seconds per step, each block's seconds, the seconds measuring took};
    `dataset` yields training batches.

    `repeats` x `steps` steps are timed from each feed, in alternating blocks of `block_steps`.
    One iterator reads the pipeline throughout, so its per-epoch work is timed where it falls.
    Its first `warmup` steps are not timed: 2 by default (tracing, first batch); a whole epoch to
    time only the warm epochs that follow it. The in-memory feed replays `steps` batches: the first
    `steps` of `memory_source`, a dataset of the same batches (the training data unshuffled starts
    at once, where a shuffled twin first fills its shuffle window: a second fill that measuring
    need not pay; a twin built the same way times a cold first epoch), or by default those of
    `dataset` past the warmup, whose cache, if any, that read fills.
    `block_steps >= repeats x steps` times each feed in one piece.
    """
    started = time.perf_counter()
    steps, block_steps = max(1, steps), max(1, block_steps)
    batches = (dataset.skip(warmup) if memory_source is None else memory_source).take(steps).cache()
    count = int(batches.reduce(0, lambda n, _: n + 1))  # fills the in-memory cache
    if count < steps:
        raise ValueError(f"input stall needs {steps + warmup} batches, the dataset has {warmup + count}"
                         if memory_source is None else f"input stall needs {steps} batches to replay, the memory "
                                                       f"source has {count}")
    from hpml.components.trainer.model_state import restored_afterwards

    strategy = model.distribute_strategy
    train_step = model.make_train_function()
    blocks: dict[str, list] = {"real": [], "memory": []}
    with restored_afterwards(model), _one_step_per_call(model):
        feeds = {"real": iter(strategy.experimental_distribute_dataset(dataset)),
                 "memory": iter(strategy.experimental_distribute_dataset(batches.repeat()))}
        for name, skip in (("real", warmup), ("memory", WARMUP_STEPS)):
            for _ in range(skip):
                train_step(feeds[name])
        timed = 0
        while timed < repeats * steps:
            size = min(block_steps, repeats * steps - timed)
            order = ("real", "memory") if len(blocks["real"]) % 2 == 0 else ("memory", "real")
            for name in order:
                blocks[name].append(_timed_block(train_step, feeds[name], size))
            timed += size
    real_step, memory_step = sum(blocks["real"]) / timed, sum(blocks["memory"]) / timed
    return {"stall_fraction": max(0.0, 1.0 - memory_step / real_step), "real_step_s": real_step,
            "in_memory_step_s": memory_step, "steps": steps, "warmup_steps": warmup, "repeats": repeats,
            "block_steps": block_steps, "real_block_s": blocks["real"], "in_memory_block_s": blocks["memory"],
            "seconds": time.perf_counter() - started}


# DESIGN.md's B3 yardstick: a tuned pipeline keeps the stall under this share of a step.
STALL_LIMIT = 0.05
# A wait per batch under this is the fixed cost of any tf.data feed (the iterator call, the copy into the step),
# not a slow stage; it only shows as a stall where the step itself is short.
FIXED_WAIT_S = 0.0005


def describe_stall(result: dict) -> str:
    """One or two sentences on a measured stall, with what to try where it is over STALL_LIMIT."""
    real, memory = result["real_step_s"], result["in_memory_step_s"]
    text = (f"Input stall: {result['stall_fraction']:.1%} of each step waits on input ({1e3 * real:.2f} ms per step "
            f"from the pipeline, {1e3 * memory:.2f} ms from memory).")
    if result["stall_fraction"] <= STALL_LIMIT:
        return text
    if real - memory < FIXED_WAIT_S:
        return (f"{text} The pipeline adds {1e3 * (real - memory):.2f} ms per batch, the fixed cost of feeding a "
                "step, which is a large share of a step this short; a larger batch_size spreads it over more "
                "examples.")
    return f"{text} The pipeline is slower than the model; the stage breakdown names where its time goes."


def record_input_stall(model, dataset, model_run_dir: str, steps: int = 30,
                       progress_directory: str | None = None, warmup: int = WARMUP_STEPS,
                       memory_source=None) -> dict:
    """Measure the stall and write it where the Trainer collects it for the run record (and, given the run's
    progress directory, beside its live progress). `warmup` steps are read untimed first."""
    import json
    import logging
    import os

    result = measure_input_stall(model, dataset, steps, warmup=warmup, memory_source=memory_source)
    from hpml.components import files

    text = json.dumps(result, indent=2)
    files.write_text(os.path.join(model_run_dir, STALL_FILE), text)
    if progress_directory:
        from hpml.components.trainer.progress_state import write_json

        write_json(os.path.join(progress_directory, STALL_FILE), result)
    logging.getLogger("hpml.trainer").info("%s", describe_stall(result))
    return result
