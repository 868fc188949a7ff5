"""tf_keras's TensorBoard without per-step work where it writes per epoch."""
from __future__ import annotations

import tf_keras


class TensorBoard(tf_keras.callbacks.TensorBoard):
    """tf_keras's TensorBoard without its per-step work where it writes only per epoch.

    It says it needs no batch hooks then, but once another callback has them fit calls its hooks too, and
    each step they call tf.summary.scalar for every log: about 0.25 ms of no-op summaries per step, a fifth
    of a small model's step (benchmarks/callbacks.py). It also wrote the train graph inside the first step's
    hook; that moves to the end of the first epoch, where it is timed as neither training nor validation.
    """

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._graph_due = False  # set once a step's hook runs, where stock TensorBoard writes the graph

    def on_train_batch_begin(self, batch, logs=None):
        if self._implements_train_batch_hooks():
            super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self._implements_train_batch_hooks():
            super().on_train_batch_end(batch, logs)
        else:
            self._graph_due = self._should_write_train_graph

    def on_epoch_end(self, epoch, logs=None):
        if self._graph_due and self._should_write_train_graph:
            self._write_keras_model_train_graph()
            self._should_write_train_graph = False
        super().on_epoch_end(epoch, logs)
