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

Modules: `knobs` (the choice, the device, the budget; pure), `probe` (the device and the matmul probe), `sweep`
(steps_per_execution), `policies` (XLA and precision), `explain` (the reasons), `cache`, and `measure` (the order
of it all: `tune_step`).
"""
from __future__ import annotations

import json
import logging
import os

from hpml.components.trainer.step_tuning.cache import cache_key, default_cache_dir
from hpml.components.trainer.step_tuning.knobs import (FLOAT32, KNOBS, MAX_STEPS_PER_EXECUTION, MIXED_BFLOAT16,
                                                       MIXED_FLOAT16, TUNED_STEP_FILE, Device, StepChoice, StepTuning,
                                                       candidate_precisions, compute_dtype, measure_budget_s, pays_back)
from hpml.components.trainer.step_tuning.measure import tune_step
from hpml.components.trainer.step_tuning.policies import apply_choice
from hpml.components.trainer.step_tuning.probe import predicted_saving_s, this_device
from hpml.components.trainer.step_tuning.sweep import smallest_as_fast

__all__ = ["FLOAT32", "MAX_STEPS_PER_EXECUTION", "MIXED_BFLOAT16", "MIXED_FLOAT16", "TUNABLE_STRATEGIES",
           "TUNED_STEP_FILE", "Device", "StepChoice", "StepTuning", "apply_choice", "cache_key", "candidate_precisions",
           "compute_dtype", "default_cache_dir", "measure_budget_s", "pays_back", "predicted_saving_s",
           "smallest_as_fast", "this_device", "tune_step", "tune_training_step"]

log = logging.getLogger("hpml.trainer")

# Strategies whose training step tune_training_step measures: one process drives every replica, so a burst on the
# chief times the whole step. Under multi_worker_mirrored the workers would have to time their steps in lockstep,
# parameter_server's coordinator schedules steps on the workers, and gpipe's schedule is its own step.
TUNABLE_STRATEGIES = ("one_device", "mirrored", "central_storage", "tpu")


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
