"""Stop training, with what to do, once the loss is NaN or infinite."""
from __future__ import annotations

import math

import tf_keras


class StopOnDivergence(tf_keras.callbacks.Callback):
    """Raises TrainingDiverged at the end of the first epoch whose loss or validation loss is NaN or
    infinite. tf_keras's TerminateOnNaN only ends fit, and the run would then publish the diverged model
    as if it had trained. Put it first, so that no backup is taken once the loss is seen to be non-finite.
    """

    def __init__(self, total_epochs: int):
        super().__init__()
        self._total = total_epochs
        self._epoch = 0
        self._last_loss = None  # the last finished epoch's loss, for the message

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self._check(logs, f"at the end of epoch {epoch + 1}/{self._total}", ("loss", "val_loss"))
        if logs and "loss" in logs:
            self._last_loss = float(logs["loss"])

    def _check(self, logs, where: str, names) -> None:
        from hpml.components.errors import TrainingDiverged

        for name in names:
            value = (logs or {}).get(name)
            if value is None or math.isfinite(float(value)):
                continue
            before = "" if self._last_loss is None else \
                f" (epoch {self._epoch}/{self._total} ended at loss {self._last_loss:.4g})"
            if name == "val_loss":
                hint = ("the training loss is finite: look for extreme values in the eval split, which the "
                        "model meets only in validation")
            else:
                hint = ("lower the learning rate, or look for extreme values in the data: one far outside the "
                        "rest makes its column's z-scores huge")
            raise TrainingDiverged(f"training diverged: {name} is {float(value)} {where}{before}",
                                   hint=hint + "; the model is not published")


class StopOnDivergenceEveryStep(StopOnDivergence):
    """StopOnDivergence that also reads the running loss after every step, so a long epoch is not spent on
    diverged weights. Batch hooks make fit read each step's logs on the host, and ParameterServerStrategy
    allows none: use it only where a batch-level callback runs anyway (the progress display)."""

    def on_train_batch_end(self, batch, logs=None):
        self._check(logs, f"after step {batch + 1} of epoch {self._epoch + 1}/{self._total}", ("loss",))
