"""Gradient accumulation inside `train_step`: one optimizer update per batch, computed from
k micro-batches, so k micro-batches of size b update exactly like one batch of size k*b
while only b examples' activations are alive at a time.

Works under any tf.distribute strategy: each replica splits its own share of the batch,
and Keras's loss scaling and the optimizer's cross-replica sum are left as they are.
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras


def _micro_batch(structure, start, stop):
    return tf.nest.map_structure(lambda t: None if t is None else t[start:stop], structure)


def micro_batch_bounds(batch, k: int) -> list:
    """[start, stop) of each of k micro-batches: sizes differ by at most one, so none is empty while
    batch >= k (ceil-sized slices would leave the last ones empty, e.g. 2, 2, 1, 0 for 5 examples)."""
    return [((i * batch) // k, ((i + 1) * batch) // k) for i in range(k)]


class GradientAccumulationModel(tf_keras.Model):
    """A functional tf_keras model whose train_step accumulates over `accumulation_steps` micro-batches."""

    def __init__(self, *args, accumulation_steps: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
        self.accumulation_steps = int(accumulation_steps)

    def get_config(self):
        return {**super().get_config(), "accumulation_steps": self.accumulation_steps}

    def train_step(self, data):
        x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
        batch = tf.shape(tf.nest.flatten(x)[0])[0]
        variables = self.trainable_variables
        summed = [tf.zeros_like(v) for v in variables]
        # k is static: the loop unrolls into one graph, and the one optimizer update below is unconditional
        for start, stop in micro_batch_bounds(batch, self.accumulation_steps):
            x_i, y_i = _micro_batch(x, start, stop), _micro_batch(y, start, stop)
            w_i = _micro_batch(sample_weight, start, stop)
            grads, y_pred = self._micro_step(x_i, y_i, w_i, stop > start)
            share = tf.cast(stop - start, tf.float32) / tf.cast(batch, tf.float32)
            summed = [s + share * g for s, g in zip(summed, grads)]
            self.compiled_metrics.update_state(y_i, y_pred, w_i)
        self.optimizer.apply_gradients(zip(summed, variables))
        return self.get_metrics_result()

    def _micro_step(self, x, y, sample_weight, non_empty):
        """Gradients and predictions of one micro-batch. An empty one (a batch smaller than k: a
        replica's share, or an epoch's last batch) is skipped: a training-mode forward pass on no
        examples would write NaN into BatchNormalization's moving statistics."""
        variables = self.trainable_variables

        def train():
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x, y, y_pred, sample_weight)
            grads = tape.gradient(loss, variables)
            return [tf.zeros_like(v) if g is None else tf.cast(g, v.dtype) for v, g in zip(variables, grads)], y_pred

        def skip():
            return [tf.zeros_like(v) for v in variables], self(x, training=False)

        if self.accumulation_steps == 1:
            return train()
        return tf.cond(non_empty, train, skip)
