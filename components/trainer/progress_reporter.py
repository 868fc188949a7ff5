"""A callback that publishes training's progress to a small JSON file while it runs."""
from __future__ import annotations

import os
import time

import tf_keras

from hpml.components import files
from hpml.components.trainer.progress_state import PROGRESS_FILE, write_json

# Points of the loss-per-step trace kept in the file: every other point is dropped when it fills up, so the
# trace covers the whole run at an even spacing and the file stays a few kB.
TRACE_POINTS = 256


class ProgressReporter(tf_keras.callbacks.Callback):
    """Publishes the global step (and the step training resumed from), the epoch, an ETA, the loss so far and
    each finished epoch's metrics, so that a launcher can tell how many steps a failure cost and when training
    is moving again, and the Airflow UI can show a run's training while it happens."""

    def __init__(self, directory: str, every_seconds: float = 0.2):
        super().__init__()
        self._path = os.path.join(directory, PROGRESS_FILE)
        # An object store takes about one write a second to the same object (GCS's documented limit).
        self._every = max(every_seconds, 1.0) if files.is_url(directory) else every_seconds
        self._last = 0.0
        self._trace: list[list[float]] = []
        self._stride = 1
        self._history: list[dict] = []
        self._epoch = 0
        self._logs: dict = {}
        files.makedirs(directory)

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _write(self, **extra):
        step, now = self._step(), time.time()
        params = self.params or {}
        epochs, steps = params.get("epochs"), params.get("steps")
        state = {"step": step, "time": now, "resumed_from_step": self._resumed, "pid": os.getpid(),
                 "epoch": self._epoch + 1, "epochs": epochs, "steps_per_epoch": steps,
                 "started": self._started, "logs": self._logs, "loss_trace": self._trace,
                 "history": self._history, **extra}
        first = self._resumed if self._resumed is not None else self._first_step
        if epochs and steps and step > first and now > self._started:
            rate = (step - first) / (now - self._started)
            state["steps_per_s"] = rate
            state["eta_s"] = max(0, epochs * steps - step) / rate
        write_json(self._path, state)

    def on_train_begin(self, logs=None):
        self._resumed = None  # the optimizer's counter is restored lazily, at its first update
        self._started, self._first_step = time.time(), self._step()
        self._write(event="begin")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

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

    def on_epoch_end(self, epoch, logs=None):
        row = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float))}
        self._history = [h for h in self._history if h["epoch"] != epoch + 1] + [{"epoch": epoch + 1, **row}]
        self._write(event="epoch")

    def on_train_end(self, logs=None):
        self._write(event="end")
