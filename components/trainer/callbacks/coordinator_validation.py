"""Exact validation under ParameterServerStrategy, by the coordinator."""
from __future__ import annotations

import time

import tf_keras


class CoordinatorValidation(tf_keras.callbacks.Callback):
    """Exact validation under ParameterServerStrategy, run by the coordinator after each epoch.

    fit's own validation there is either inexact (each worker reads its own copy of the eval data, so
    some examples count twice and others never) or, with exact evaluation, needs several eval files
    per worker. Instead the weights are copied into `local_model` (the same architecture, compiled
    outside the strategy) and it scores the whole `dataset`; the results join the epoch's logs as
    val_*, so this callback must come before any that reads them. The evaluation runs on its own
    thread: fit's strategy scope is thread-local, and inside it the local model would hand its
    evaluation to the workers as well.
    """

    def __init__(self, local_model, dataset, steps: int | None = None):
        super().__init__()
        self._local, self._dataset, self._steps = local_model, dataset, steps

    def on_epoch_end(self, epoch, logs=None):
        from concurrent.futures import ThreadPoolExecutor

        started = time.perf_counter()
        self._local.set_weights([v.numpy() for v in self.model.weights])
        with ThreadPoolExecutor(1, thread_name_prefix="coordinator-validation") as pool:
            results = pool.submit(self._local.evaluate, self._dataset, steps=self._steps, verbose=0,
                                  return_dict=True).result()
        if logs is not None:
            logs.update({f"val_{name}": float(value) for name, value in results.items()})
            logs["val_seconds"] = time.perf_counter() - started  # EpochMetricsLogger leaves it out of throughput
