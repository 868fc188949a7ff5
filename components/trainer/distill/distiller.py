"""Distiller: trains a student (logits out) against frozen teachers and the hard labels.

Soft targets come either from the teachers on the fly, or precomputed, so repeated student
training never runs the teachers again: a `soft_targets` entry in dict features, or, with no
teachers given, inputs of the form (features, soft_targets).
"""
from __future__ import annotations

import os

import tensorflow as tf
import tf_keras

from hpml.components.errors import SpecError
from hpml.components.trainer.distill.loss import distillation_loss, ensemble_soft_targets

SOFT_TARGETS_KEY = "soft_targets"


class Distiller(tf_keras.Model):
    def __init__(self, student, teachers=(), temperature: float = 4.0, alpha: float = 0.9, **kwargs):
        super().__init__(**kwargs)
        if temperature <= 0:
            raise SpecError(f"temperature must be positive, got {temperature}")
        if not 0.0 <= alpha <= 1.0:
            raise SpecError(f"alpha must be in [0, 1], got {alpha}")
        self.student = student
        self.teachers = list(teachers)
        for teacher in self.teachers:
            if isinstance(teacher, tf_keras.Model):
                teacher.trainable = False  # frozen: the optimizer never sees them
        self.temperature, self.alpha = float(temperature), float(alpha)
        self.loss_tracker = tf_keras.metrics.Mean(name="loss")
        self.accuracy = tf_keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    @property
    def metrics(self):
        return [self.loss_tracker, self.accuracy]

    def call(self, inputs, training=False):
        return self.student(inputs, training=training)

    def soft_targets(self, x):
        """The teachers' averaged softened probabilities for a batch (teachers output probabilities)."""
        if not self.teachers:
            raise SpecError("no teachers and no precomputed soft targets")
        return ensemble_soft_targets([teacher(x, training=False) for teacher in self.teachers], self.temperature)

    def _split(self, x):
        if isinstance(x, dict) and SOFT_TARGETS_KEY in x:
            x = dict(x)
            return x, x.pop(SOFT_TARGETS_KEY)
        if not self.teachers and isinstance(x, (tuple, list)) and len(x) == 2:
            return x[0], x[1]
        return x, tf.stop_gradient(self.soft_targets(x))

    def train_step(self, data):
        x, y = data[0], data[1]
        x, targets = self._split(x)
        with tf.GradientTape() as tape:
            logits = self.student(x, training=True)
            loss = distillation_loss(y, logits, targets, self.temperature, self.alpha)
            # Each replica's loss is a mean over its share of the batch and apply_gradients sums
            # across replicas, so scale by 1/replicas to take the mean over the global batch.
            scaled = loss / tf.distribute.get_strategy().num_replicas_in_sync
            # Under mixed_float16 compile wraps the optimizer to scale the loss, so that small float16 gradients
            # do not flush to zero; a custom step has to ask for it.
            loss_scaling = isinstance(self.optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
            if loss_scaling:
                scaled = self.optimizer.get_scaled_loss(scaled)
        variables = self.student.trainable_variables
        gradients = tape.gradient(scaled, variables)
        if loss_scaling:
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        self.optimizer.apply_gradients(zip(gradients, variables))
        self.loss_tracker.update_state(loss)
        self.accuracy.update_state(y, logits)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data[0], data[1]
        if isinstance(x, dict):
            x = {k: v for k, v in x.items() if k != SOFT_TARGETS_KEY}
        elif not self.teachers and isinstance(x, (tuple, list)) and len(x) == 2:
            x = x[0]
        logits = self.student(x, training=False)
        self.loss_tracker.update_state(
            tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)))
        self.accuracy.update_state(y, logits)
        return {m.name: m.result() for m in self.metrics}


def check_teachers(teacher_dirs: list[str], num_classes: int, sample) -> list:
    """Load teacher SavedModels and refuse, before any training, a missing one or one whose
    output classes differ from the student's."""
    if not teacher_dirs:
        raise SpecError("distillation needs at least one teacher Model artifact")
    teachers = []
    for path in teacher_dirs:
        serving = os.path.join(path, "Format-Serving") if os.path.isdir(os.path.join(path, "Format-Serving")) else path
        if not os.path.isfile(os.path.join(serving, "saved_model.pb")):
            raise SpecError(f"teacher model {path} is missing (no saved_model.pb)",
                            hint="train the teacher first, or fix the teacher Model artifact URI")
        teacher = tf_keras.models.load_model(serving, compile=False)
        classes = int(teacher(sample, training=False).shape[-1])
        if classes != num_classes:
            raise SpecError(f"teacher {path} predicts {classes} classes but the student predicts {num_classes}")
        teachers.append(teacher)
    return teachers
