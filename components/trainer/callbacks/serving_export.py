"""A callback that exports the serving model while fit trains, so that after fit only the final weights are written.

`export_serving_model` after fit loads the transform graph, traces the signatures and saves the SavedModel: about a
second on the Trainer's critical path that does not depend on the weights. Here a twin of the model (the same
architecture, built from its config) is saved that way in a background thread during the epochs; `publish(model)`
then copies the trained weights into the twin, writes them over the staged copy's variables and moves it into place.
"""
from __future__ import annotations

import logging
import os
import threading

import tensorflow as tf
import tf_keras

from hpml.components import files
from hpml.components.artifacts import serving_staging_path
from hpml.components.trainer import keras_internals
from hpml.components.trainer.export import export_serving_model, rebuilt_from_config, save_serving_model

log = logging.getLogger("hpml.trainer")
_THREAD = "hpml-serving-export"


class _UncompiledTwin(logging.Filter):
    """Drops the warning Keras's save logs for a model that was never compiled ("the compiled metrics have yet to
    be built"): the twin is uncompiled on purpose, and the warning would reach the Trainer's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.threadName == _THREAD and record.getMessage().startswith("Compiled the loaded model"))


class ServingExport(tf_keras.callbacks.Callback):
    """Exports what `export_serving_model(model, tf_transform_output, serving_model_dir, label_key, ...)` would, with
    the work that does not depend on the weights done during fit. Call `publish(model)` once fit is over.

    The staged model carries no optimizer state (serving needs none). A model Keras cannot rebuild from its config
    (a model or layer class of its own), one trained under a strategy with replicas, or a destination on an object
    store is exported by `publish` after fit, as `export_serving_model` does.
    """

    def __init__(self, tf_transform_output, serving_model_dir: str, label_key: str,
                 class_names: list[str] | None = None, regression: bool = False):
        super().__init__()
        self._export = (tf_transform_output, serving_model_dir, label_key, class_names, regression)
        self._staged = serving_staging_path(serving_model_dir)
        self._thread: threading.Thread | None = None
        self._twin = None
        self._error: BaseException | None = None

    def on_train_begin(self, logs=None):
        if self._thread is None and _stageable(self.model, self._export[1]):
            self._thread = threading.Thread(target=self._stage, args=(self.model,), name=_THREAD, daemon=True)
            self._thread.start()

    def _stage(self, model) -> None:
        """Save a twin of `model` at the staging path; fit's model is only read (Keras's save would change it)."""
        quiet, tf_logger = _UncompiledTwin(), logging.getLogger("tensorflow")
        tf_logger.addFilter(quiet)
        try:
            tfo, _, label_key, class_names, regression = self._export
            files.rmtree(self._staged)
            keras_internals.seed_this_thread(0)  # the twin's initial values are thrown away: no shared random state
            twin = tf_keras.models.clone_model(model)
            save_serving_model(twin, tfo, self._staged, label_key, class_names, regression, include_optimizer=False)
            self._twin = twin
        except Exception as error:  # noqa: BLE001 - publish() exports after fit instead, and says why
            self._error = error
        finally:
            tf_logger.removeFilter(quiet)

    def publish(self, model) -> None:
        """Put `model`'s serving SavedModel at `serving_model_dir`: the staged twin with `model`'s weights, or a
        whole export where none was staged."""
        if self._thread is not None:
            self._thread.join()
        tfo, serving_model_dir, label_key, class_names, regression = self._export
        if self._twin is None:
            if self._error is not None:
                log.warning("the serving model could not be built during fit (%s: %s); exporting it now",
                            type(self._error).__name__, self._error)
            files.rmtree(self._staged)
            export_serving_model(model, tfo, serving_model_dir, label_key, class_names=class_names,
                                 regression=regression)
            return
        self._twin.set_weights(model.get_weights())
        tf.train.Checkpoint(root=self._twin).write(os.path.join(self._staged, "variables", "variables"))
        files.rmtree(serving_model_dir)
        os.replace(self._staged, serving_model_dir)
        self._twin = None


def _stageable(model, serving_model_dir: str) -> bool:
    """Whether a twin can stand in for `model` during fit: built from its config, on local disk, trained on one
    device. Under a strategy with replicas, a second thread's work in the strategy's scope can take collective keys
    that fit's replicas need in step (seen under MirroredStrategy as a collective's shape mismatch)."""
    strategy = model.distribute_strategy
    one_device = isinstance(strategy, tf.distribute.OneDeviceStrategy) or (
        type(strategy).__name__ == "_DefaultDistributionStrategy")
    return one_device and not files.is_url(serving_model_dir) and rebuilt_from_config(model)
