"""Callbacks that publish training's progress to a small JSON file while it runs: every step, or every epoch."""
from __future__ import annotations

import os
import time

import tf_keras

from hpml.components import files
from hpml.components.trainer.progress_state import PROGRESS_FILE, write_json

# Points of the loss-per-step trace kept in the file: every other point is dropped when it fills up, so the
# trace covers the whole run at an even spacing and the file stays a few kB.
TRACE_POINTS = 256


class EpochProgressReporter(tf_keras.callbacks.Callback):
    """Publishes the epoch, the global step, an ETA from the last epoch's pace and each finished epoch's metrics as
    each epoch begins and ends, for the Airflow UI. It is what parameter-server training gets: tf_keras allows it no
    batch-level callback. Its file says `grain: "epoch"` and names no resume step: a launcher cannot count steps lost
    from it."""

    GRAIN = "epoch"

    def __init__(self, directory: str, every_seconds: float = 0.2):
        super().__init__()
        self._path = os.path.join(directory, PROGRESS_FILE)
        # An object store takes about one write a second to the same object (GCS's documented limit).
        self._on_store = files.is_url(directory)
        self._every = max(every_seconds, 1.0) if self._on_store else every_seconds
        self._last = 0.0
        self._written = 0.0
        self._trace: list[list[float]] = []
        self._stride = 1
        self._history: list[dict] = []
        self._epoch = 0
        self._epoch_started = 0.0
        self._resumed: int | None = None
        self._pace: float | None = None
        self._logs: dict = {}
        files.makedirs(directory)

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _steps_per_s(self, step: int, now: float) -> float | None:
        """The last whole epoch's pace (once an epoch has ended)."""
        return self._pace

    def _write(self, **extra):
        step, now = self._step(), time.time()
        params = self.params or {}
        epochs, steps = params.get("epochs"), params.get("steps")
        state = {"step": step, "time": now, "resumed_from_step": self._resumed, "pid": os.getpid(),
                 "epoch": self._epoch + 1, "epochs": epochs, "steps_per_epoch": steps, "grain": self.GRAIN,
                 "started": self._started, "logs": self._logs, "loss_trace": self._trace,
                 "history": self._history, **extra}
        rate = self._steps_per_s(step, now)
        if epochs and steps and rate:
            state["steps_per_s"] = rate
            state["eta_s"] = max(0, epochs * steps - step) / rate
        write_json(self._path, state)
        self._written = time.perf_counter()

    def on_train_begin(self, logs=None):
        self._started, self._first_step = time.time(), self._step()  # first written as the first epoch begins

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._epoch_started = epoch, time.time()
        # The epoch under way (after a restart, the one after the backup). On an object store, at most one write a
        # second: an epoch that begins within a second of the last write is first shown at its end.
        if not self._on_store or time.perf_counter() - self._written >= self._every:
            self._write(event="epoch_begin")

    def on_epoch_end(self, epoch, logs=None):
        row = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float))}
        self._history = [h for h in self._history if h["epoch"] != epoch + 1] + [{"epoch": epoch + 1, **row}]
        steps, spent = (self.params or {}).get("steps"), time.time() - self._epoch_started
        self._pace = steps / spent if steps and spent > 0 else self._pace
        self._logs = {k: v for k, v in row.items() if not k.startswith("val_")}  # the epoch's loss and metrics
        self._write(event="epoch")

    def on_train_end(self, logs=None):
        self._write(event="end")


class ProgressReporter(EpochProgressReporter):
    """Publishes the global step (and the step training resumed from), the epoch, an ETA, the loss so far and
    each finished epoch's metrics, so that a launcher can tell how many steps a failure cost and when training
    is moving again, and the Airflow UI can show a run's training while it happens."""

    GRAIN = "step"

    def _steps_per_s(self, step: int, now: float) -> float | None:
        """The pace since training (or its resumption) began."""
        first = self._resumed if self._resumed is not None else self._first_step
        return (step - first) / (now - self._started) if step > first and now > self._started else None

    def on_train_begin(self, logs=None):
        self._resumed = None  # the optimizer's counter is restored lazily, at its first update
        super().on_train_begin(logs)
        self._write(event="begin")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._epoch_started = epoch, time.time()  # its steps will say so

    def on_train_batch_end(self, batch, logs=None):
        self._logs = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float))}
        step = self._step()
        if "loss" in self._logs and step % self._stride == 0:
            self._trace.append([step, self._logs["loss"]])
            if len(self._trace) > TRACE_POINTS:
                self._trace, self._stride = self._trace[::2], self._stride * 2
        if self._resumed is None:
            self._resumed = step - 1
            self._started, self._last = time.time(), time.perf_counter()
            self._write(event="step")
            return
        now = time.perf_counter()
        if now - self._last >= self._every:
            self._last = now
            self._write(event="step")
