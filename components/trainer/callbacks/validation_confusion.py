"""A callback that counts the confusion matrix inside fit's own validation, so the per-class report needs no second
pass over the eval split."""
from __future__ import annotations

import tf_keras

from hpml.components.trainer import keras_internals


class ConfusionCounts(tf_keras.metrics.Metric):
    """[actual, predicted] counts of a classifier (labels are class ids, outputs scores per class); float64, as
    Keras's MeanIoU keeps its matrix, so that replicas' counts sum exactly."""

    def __init__(self, classes: int, name: str = "confusion_counts"):
        super().__init__(name=name, dtype="float64")
        self.classes = classes
        self.counts = self.add_weight("counts", shape=(classes, classes), initializer="zeros", dtype="float64")

    def update_state(self, labels, scores, sample_weight=None):
        from hpml.components.trainer.classification import batch_confusion

        return self.counts.assign_add(batch_confusion(labels, scores, self.classes, "float64"))

    def result(self):
        return self.counts

    def reset_state(self):
        import tensorflow as tf

        self.counts.assign(tf.zeros_like(self.counts))


class ValidationConfusion(tf_keras.callbacks.Callback):
    """Counts the confusion matrix of fit's validation passes; `matrix` is the final epoch's, the one on the
    weights fit ends with, or None where fit's last epoch is not the run's last or did not validate (then
    `write_classification_report` makes its own pass).

    It adds the counting to the model's test step, which must be tf_keras's own: a model with a test_step of its
    own is left alone and counted by that second pass.
    """

    def __init__(self, classes: int):
        super().__init__()
        self._classes = classes
        self._counts: ConfusionCounts | None = None
        self._counted_epoch: int | None = None
        self._epoch: int | None = None
        self.matrix = None

    def on_train_begin(self, logs=None):
        self.matrix, self._counted_epoch, self._counts = None, None, None
        model = self.model
        if type(model).test_step is not tf_keras.Model.test_step:
            return
        with model.distribute_strategy.scope():  # this fit's model: a callback used again starts afresh
            counts = self._counts = ConfusionCounts(self._classes)

        def test_step(data):  # tf_keras's own test step, with the counts updated from its predictions
            x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
            predicted = model(x, training=False)
            model.compute_loss(x, y, predicted, sample_weight)
            counts.update_state(y, predicted)
            return model.compute_metrics(x, y, predicted, sample_weight)

        model.test_step = test_step
        keras_internals.build_looping_test_function(model)  # traced again, with the counting, at the first validation

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_test_begin(self, logs=None):
        if self._counts is not None:
            self._counts.reset_state()

    def on_test_end(self, logs=None):
        if self._counts is not None:
            self._counted_epoch = self._epoch

    def on_train_end(self, logs=None):
        epochs = (self.params or {}).get("epochs")
        if self._counts is not None and epochs is not None and self._counted_epoch == epochs - 1:
            self.matrix = self._counts.result().numpy().astype("int64")
