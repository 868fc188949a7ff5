"""A classifier's per-class precision, recall and F1, and its confusion matrix, on the eval split.

`write_classification_report` leaves them in the ModelRun, where the run record keeps them and the run report
shows a table and a heatmap: the first things an ML engineer looks at after overall accuracy.
"""
from __future__ import annotations

import json
import os

import numpy as np

from hpml.components import files
from hpml.components.artifacts import CLASSIFICATION_FILE


def batch_confusion(labels, scores, classes: int, dtype="int64"):
    """[actual, predicted] counts of one batch: labels are class ids, scores one value per class."""
    import tensorflow as tf

    actual = tf.reshape(tf.cast(labels, tf.int64), [-1])
    predicted = tf.reshape(tf.argmax(scores, axis=-1, output_type=tf.int64), [-1])
    return tf.math.confusion_matrix(actual, predicted, num_classes=classes, dtype=dtype)


def confusion_matrix(model, dataset, classes: int, steps: int | None = None):
    """[actual, predicted] counts of `model` over (features, labels) batches of `dataset` (labels are class ids,
    outputs probabilities or logits), in one compiled pass: no Python runs per batch."""
    import tensorflow as tf

    batches = dataset.take(steps) if steps else dataset

    @tf.function
    def count():
        total = tf.zeros((classes, classes), dtype=tf.int64)
        for features, labels in batches:
            total += batch_confusion(labels, model(features, training=False), classes)
        return total

    return np.asarray(count())


def classification_report(model, dataset, class_names: list[str], steps: int | None = None,
                          confusion=None) -> dict:
    """Score `model` on (features, labels) batches of `dataset` (labels are class ids, outputs probabilities), or
    report `confusion`, [actual, predicted] counts already taken on them."""
    if confusion is None:
        confusion = confusion_matrix(model, dataset, len(class_names), steps)
    confusion = np.asarray(confusion, dtype=np.int64)
    rows = []
    for i, name in enumerate(class_names):
        true_positive = int(confusion[i, i])
        predicted, support = int(confusion[:, i].sum()), int(confusion[i].sum())
        precision = true_positive / predicted if predicted else 0.0
        recall = true_positive / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append({"class": name, "precision": precision, "recall": recall, "f1": f1, "support": support})
    return {"classes": list(class_names), "per_class": rows, "confusion_matrix": confusion.tolist(),
            "examples": int(confusion.sum())}


def write_classification_report(model_run_dir: str, model, dataset, class_names: list[str],
                                steps: int | None = None, counted=None) -> dict:
    """Compute the report and write it to the ModelRun (on the chief only, where several workers run run_fn).

    `counted`: the ValidationConfusion callback that fit ran with; where it counted fit's final validation (the
    same `steps` of `dataset`, on these weights), its matrix is reported and the eval split is not read again."""
    from hpml.components.trainer.strategies import is_chief

    confusion = None if counted is None else counted.matrix
    report = classification_report(model, dataset, class_names, steps, confusion)
    if is_chief():
        files.makedirs(model_run_dir)
        files.write_text(os.path.join(model_run_dir, CLASSIFICATION_FILE), json.dumps(report, indent=1))
    return report
