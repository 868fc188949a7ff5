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
        k = self.accumulation_steps
        micro = (batch + k - 1) // k
        variables = self.trainable_variables
        summed = [tf.zeros_like(v) for v in variables]
        for i in range(k):  # k is static: the loop unrolls into one graph, no conditional update
            start = tf.minimum(i * micro, batch)
            stop = tf.minimum(start + micro, batch)
            x_i, y_i = _micro_batch(x, start, stop), _micro_batch(y, start, stop)
            w_i = _micro_batch(sample_weight, start, stop)
            share = tf.cast(stop - start, tf.float32) / tf.cast(batch, tf.float32)
            with tf.GradientTape() as tape:
                y_pred = self(x_i, training=True)
                loss = self.compute_loss(x_i, y_i, y_pred, w_i)
            grads = tape.gradient(loss, variables)
            summed = [s + share * tf.cast(g, s.dtype) for s, g in zip(summed, grads)]
            self.compiled_metrics.update_state(y_i, y_pred, w_i)
        self.optimizer.apply_gradients(zip(summed, variables))
        return self.get_metrics_result()
