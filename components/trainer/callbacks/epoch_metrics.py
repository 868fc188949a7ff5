"""Per-epoch metrics with throughput, as JSON lines for the run record and plain log lines."""
from __future__ import annotations

import json
import logging
import math
import os
import time

import tf_keras

from hpml.components import files
from hpml.components.artifacts import METRICS_FILE

log = logging.getLogger("hpml.trainer")


class EpochMetricsLogger(tf_keras.callbacks.Callback):
    """Writes one JSON line and one plain log line per epoch: loss, metrics, examples/s, step time, ETA.

    Throughput and step time are of training alone: validation is timed apart as val_seconds and left
    out, whether it is fit's own (from on_test_begin to on_test_end) or CoordinatorValidation's (which
    puts its time in the logs; the end-of-epoch callbacks before this one, such as a backup, then count
    as training). `seconds` is the whole epoch, callbacks included. Examples are steps x batch_size, at most
    `examples_per_epoch` where the run_fn knows it: an epoch's last batch may be short.
    """

    def __init__(self, out_dir: str, batch_size: int, total_epochs: int, examples_per_epoch: int | None = None):
        super().__init__()
        self._path = os.path.join(out_dir, METRICS_FILE)
        self._batch_size = batch_size
        self._examples_per_epoch = examples_per_epoch
        self._total = total_epochs
        self._started = None

    # Steps come from the optimizer's counter, not batch hooks, which ParameterServerStrategy forbids.
    def _iterations(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()
        self._started = self._started or self._epoch_start
        self._first_step = self._iterations()
        self._validation = None  # fit's validation: [start, end]

    def on_test_begin(self, logs=None):  # the epoch's training is over
        if self._validation is None:
            self._validation = [time.perf_counter()] * 2

    def on_test_end(self, logs=None):
        if self._validation is not None:
            self._validation[1] = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        now = time.perf_counter()
        seconds = now - self._epoch_start
        steps = max(self._iterations() - self._first_step, 1)
        record = {k: float(v) for k, v in (logs or {}).items()
                  if isinstance(v, (int, float)) or hasattr(v, "__float__")}
        if self._validation is not None:
            record["val_seconds"] = self._validation[1] - self._validation[0]
            train_seconds = self._validation[0] - self._epoch_start
        else:
            train_seconds = seconds - record.get("val_seconds", 0.0)
        record.update(
            epoch=epoch + 1,
            seconds=seconds,
            step_time_ms=1000.0 * train_seconds / steps,
            examples_per_sec=self._examples(steps) / train_seconds if train_seconds > 0 else math.nan,
        )
        with files.open_file(self._path, "a") as handle:  # an object store's file is written again whole
            handle.write(json.dumps(record) + "\n")
        eta = (time.perf_counter() - self._started) / (epoch + 1) * (self._total - epoch - 1)
        line = " ".join(f"{k}={shown(k, v)}" for k, v in sorted(record.items())
                        if k not in ("epoch", "seconds", "val_seconds"))
        log.info("epoch %d/%d %s eta=%.1fs", epoch + 1, self._total, line, eta)

    def _examples(self, steps: int) -> int:
        examples = steps * self._batch_size
        return examples if self._examples_per_epoch is None else min(examples, self._examples_per_epoch)


def shown(name: str, value: float) -> str:
    """A metric as the epoch line shows it: whole examples per second, step time to 10 µs, and losses and
    metrics to 4 decimals, or in 4 significant digits under 0.001, where 4 decimals keep one digit or none."""
    if name == "examples_per_sec":
        return f"{value:.0f}"
    if name == "step_time_ms":
        return f"{value:.2f}"
    return f"{value:.3e}" if 0 < abs(value) < 1e-3 else f"{value:.4f}"


def read_metrics(model_run_dir: str) -> list[dict]:
    path = os.path.join(model_run_dir, METRICS_FILE)
    if not files.exists(path):
        return []
    rows = [json.loads(line) for line in files.read_text(path).splitlines() if line.strip()]
    # After a restart from a mid-epoch backup an epoch can be logged twice: keep the latest.
    latest = {int(row["epoch"]): row for row in rows}
    return [latest[epoch] for epoch in sorted(latest)]
