"""The distillation loss: L = (1 - a) * CE(y, student) + a * T^2 * KL(p_T || q_T).

p_T is the teachers' softened distribution (averaged over an ensemble), q_T = softmax(z_s / T).
The T^2 factor keeps the soft term's gradient about the same size as T changes (Hinton et al.).
"""
from __future__ import annotations

import tensorflow as tf
import tf_keras

_EPS = 1e-7


def soften(probabilities, temperature: float):
    """Re-temper a model's output probabilities: softmax(log p / T) (log p are logits up to a constant). In float32,
    whatever precision the teacher computes in: 1e-7 is below float16's and bfloat16's resolution near 1."""
    logits = tf.math.log(tf.clip_by_value(tf.cast(probabilities, tf.float32), _EPS, 1.0))
    return tf.nn.softmax(logits / temperature, axis=-1)


def ensemble_soft_targets(teacher_probabilities: list, temperature: float):
    """Average of each teacher's softened distribution."""
    softened = [soften(p, temperature) for p in teacher_probabilities]
    return tf.add_n(softened) / float(len(softened))


def kl_divergence(p, q):
    """KL(p || q) per example, summed over classes."""
    p = tf.clip_by_value(p, _EPS, 1.0)
    q = tf.clip_by_value(q, _EPS, 1.0)
    return tf.reduce_sum(p * (tf.math.log(p) - tf.math.log(q)), axis=-1)


def distillation_loss(labels, student_logits, soft_targets, temperature: float, alpha: float):
    """Mean over the batch of (1 - a) * CE(labels, softmax(z)) + a * T^2 * KL(soft_targets || softmax(z / T)),
    computed in float32 under any precision policy."""
    student_logits, soft_targets = tf.cast(student_logits, tf.float32), tf.cast(soft_targets, tf.float32)
    hard = tf_keras.losses.sparse_categorical_crossentropy(labels, student_logits, from_logits=True)
    soft = kl_divergence(soft_targets, tf.nn.softmax(student_logits / temperature, axis=-1))
    return tf.reduce_mean((1.0 - alpha) * hard + alpha * temperature ** 2 * soft)
