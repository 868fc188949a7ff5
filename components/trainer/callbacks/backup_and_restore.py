"""tf_keras's BackupAndRestore, under CentralStorage too and with save_freq in steps."""
from __future__ import annotations

import tf_keras


class BackupAndRestore(tf_keras.callbacks.BackupAndRestore):
    """tf_keras's BackupAndRestore, allowed under CentralStorage too.

    tf_keras checks the strategy against a fixed list that leaves CentralStorage out, but its
    checkpoint (one worker, variables on the host) saves and restores like Mirrored's: a run
    stopped after a backup and started again ends with the uninterrupted run's weights (tested).
    """

    def __init__(self, *args, **kwargs):
        import tensorflow as tf

        super().__init__(*args, **kwargs)
        self._supported_strategies = (*self._supported_strategies,
                                      tf.distribute.experimental.CentralStorageStrategy)
        self._call_begin = 0

    def on_train_batch_begin(self, batch, logs=None):
        self._call_begin = batch
        super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        # tf_keras counts calls toward save_freq; with steps_per_execution > 1 a call runs steps `_call_begin` to
        # `batch`, so the steps beyond the first are counted here: save_freq stays in steps.
        steps = batch - self._call_begin + 1
        if self.save_freq not in (False, None, "epoch") and steps > 1:
            self._batches_count += steps - 1
        super().on_train_batch_end(batch, logs)
