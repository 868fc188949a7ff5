"""A callback that records when fit began and ended (wall clock), so the Trainer can tell the time before
training and the time after it from the epochs themselves."""
from __future__ import annotations

import json
import os
import time

import tf_keras

from hpml.components import files
from hpml.components.artifacts import FIT_WINDOW_FILE


class FitWindow(tf_keras.callbacks.Callback):
    """Writes {"started_at", "ended_at"} (seconds since the epoch) to `out_dir` when fit ends."""

    def __init__(self, out_dir: str):
        super().__init__()
        self._path = os.path.join(out_dir, FIT_WINDOW_FILE)
        self._started_at: float | None = None

    def on_train_begin(self, logs=None):
        self._started_at = time.time()

    def on_train_end(self, logs=None):
        files.write_text(self._path, json.dumps({"started_at": self._started_at, "ended_at": time.time()}))
