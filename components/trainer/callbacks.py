"""Keras callbacks shared by run_fns: per-epoch metrics with throughput, as JSON lines and log lines."""
from __future__ import annotations

import json
import logging
import math
import os
import time

import tf_keras

log = logging.getLogger("hpml.trainer")

METRICS_FILE = "metrics.jsonl"


class EpochMetricsLogger(tf_keras.callbacks.Callback):
    """Writes one JSON line and one plain log line per epoch: loss, metrics, examples/s, step time, ETA."""

    def __init__(self, out_dir: str, batch_size: int, total_epochs: int):
        super().__init__()
        self._path = os.path.join(out_dir, METRICS_FILE)
        self._batch_size = batch_size
        self._total = total_epochs
        self._started = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()
        self._started = self._started or self._epoch_start
        self._steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self._epoch_start
        steps = max(self._steps, 1)
        record = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float)) or hasattr(v, "__float__")}
        record.update(
            epoch=epoch + 1,
            seconds=seconds,
            step_time_ms=1000.0 * seconds / steps,
            examples_per_sec=steps * self._batch_size / seconds if seconds > 0 else math.nan,
        )
        with open(self._path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        eta = (time.perf_counter() - self._started) / (epoch + 1) * (self._total - epoch - 1)
        shown = " ".join(f"{k}={v:.4f}" for k, v in sorted(record.items()) if k not in ("epoch", "seconds"))
        log.info("epoch %d/%d %s eta=%.1fs", epoch + 1, self._total, shown, eta)


def read_metrics(model_run_dir: str) -> list[dict]:
    path = os.path.join(model_run_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
