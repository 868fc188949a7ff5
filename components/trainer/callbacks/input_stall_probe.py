"""A callback that measures the input stall once the first epoch is over, so a run shows it while it trains."""
from __future__ import annotations

import logging

import tf_keras

from hpml.components.trainer.input_stall import WARMUP_STEPS, record_input_stall

log = logging.getLogger("hpml.trainer")

# An epoch of at most this many steps is read once, untimed, before the stall is timed: the timed steps then read
# a warm cache, as every epoch after the first does. A longer epoch is timed on its first steps.
WARM_EPOCH_STEPS = 200


class InputStallProbe(tf_keras.callbacks.Callback):
    """At the end of the first epoch, measures the share of a step that waits on input and writes it for the run
    record and beside the run's live progress.

    `twin` is a dataset built the way the training data is, not the training data itself: a new iterator over a
    shuffled dataset draws from the seed generator that the training iterator's later epochs draw from. Training
    then runs as if nothing had been measured: the model's weights, optimizer state, metrics and train counter
    are put back. The probe measures at epoch 0's end only, which is the same point on every worker and in a run
    resumed from a backup. Not for ParameterServer training, whose steps the coordinator schedules.

    `twin` may be a function that builds it, called only when the probe measures. `memory_source`, optional, gives
    the batches the in-memory feed replays: the training data unshuffled, whose batches come at once, where the
    shuffled twin would first fill its shuffle window a second time.

    Where the first epoch is the last (`fit(epochs=1)`), there is no training left for the stall to inform, and
    measuring would add about a fifth of the epoch after it: the probe measures nothing unless `after_last_epoch`.
    """

    def __init__(self, twin, fn_args, steps_per_epoch: int, steps: int = 30, memory_source=None,
                 after_last_epoch: bool = False):
        super().__init__()
        from hpml.components.trainer.progress_state import progress_dir
        from hpml.components.trainer.strategies import is_chief

        self._twin, self._memory_source, self._model_run_dir = twin, memory_source, fn_args.model_run_dir
        self._after_last_epoch = after_last_epoch
        self._steps = max(1, min(steps, 2 * steps_per_epoch))
        self._warmup = steps_per_epoch if steps_per_epoch <= WARM_EPOCH_STEPS else WARMUP_STEPS
        working_dir = getattr(fn_args, "working_dir", None)  # TFX's Trainer gives run_fn none
        self._progress = progress_dir(working_dir) if working_dir and is_chief() else None

    def on_epoch_end(self, epoch, logs=None):
        if epoch != 0:
            return
        if self.params.get("epochs") == 1 and not self._after_last_epoch:
            log.info("input stall not measured: this run's one epoch is over, so no training is left for it to "
                     "inform (InputStallProbe(..., after_last_epoch=True) measures it anyway)")
            return
        twin = self._twin() if callable(self._twin) else self._twin
        try:
            record_input_stall(self.model, twin, self._model_run_dir, self._steps, self._progress,
                               warmup=self._warmup, memory_source=self._memory_source)
        except ValueError as err:  # a twin too short to time (one that does not repeat): training goes on
            log.warning("input stall not measured: %s; give InputStallProbe a twin (and a memory_source) that "
                        "repeats, as the training data does", err)
