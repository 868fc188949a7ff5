"""Score classifiers or regressors on one split of raw tf.Examples, in one pass: each batch is read once and goes
through every model's serving signature (parse, transform and model, as a client calls it). A batch's work is one
TensorFlow function call: the models run side by side, their sums stay in TensorFlow, and reading, decompressing and
parsing the labels run ahead on tf.data's threads."""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from hpml.components import artifacts, files
from hpml.components.errors import InputDataError, SpecError

log = logging.getLogger(__name__)

# The metrics the gate computes, and which way is better: a classifier's accuracy and log loss; a regressor's mean
# squared error (its loss), mean absolute error and R^2 (1 - its squared error over the eval labels' variance: 0 is
# no better than predicting the mean, whatever the label's scale).
HIGHER_IS_BETTER = {"accuracy": True, "loss": False, "mae": False, "r2": True}
CLASSIFIER_METRICS = ("accuracy", "loss")
REGRESSOR_METRICS = ("loss", "mae", "r2")
_PROBABILITY_FLOOR = 1e-7  # the loss of a probability of 0 is large, not infinite
_PROGRESS_EVERY_S = 30.0


class _Classifier:
    """A classifier's serving signature, the class name of each probability column, and the sums its metrics come
    from: examples predicted right and the log loss."""

    kind, computes, sums = "classifier", CLASSIFIER_METRICS, 2

    def __init__(self, name: str, loaded):
        self.name = name
        self.loaded = loaded  # keeps the signature's variables alive
        self.signature = loaded.signatures["serving_default"]
        self.class_names = loaded.signatures[artifacts.CLASS_NAMES_SIGNATURE]()["class_names"]

    def batch_sums(self, serialized, label):
        """This batch's [examples predicted right, log loss], float64 (traced into the pass's function)."""
        import tensorflow as tf

        labels = label if label.dtype == tf.string else tf.strings.as_string(label)
        probabilities = self.signature(examples=serialized)["probabilities"]
        matches = tf.equal(labels[:, None], self.class_names[None, :])
        label_probability = tf.reduce_sum(tf.where(matches, probabilities, 0.0), axis=1)
        predicted = tf.gather(self.class_names, tf.argmax(probabilities, axis=1))
        correct = tf.reduce_sum(tf.cast(tf.equal(predicted, labels), tf.float64))
        log_loss = -tf.reduce_sum(tf.math.log(tf.maximum(label_probability, _PROBABILITY_FLOOR)))
        return tf.stack([correct, tf.cast(log_loss, tf.float64)])

    @staticmethod
    def metrics(sums, count: int) -> dict[str, float]:
        correct, log_loss = sums
        return {"accuracy": correct / count, "loss": log_loss / count}


class _Regressor:
    """A regressor's serving signature (`predictions`) and the sums its errors and R^2 come from."""

    kind, computes, sums = "regressor", REGRESSOR_METRICS, 4

    def __init__(self, name: str, loaded):
        self.name = name
        self.loaded = loaded
        self.signature = loaded.signatures["serving_default"]

    def batch_sums(self, serialized, label):
        """This batch's [squared error, absolute error, label, squared label] sums, float64."""
        import tensorflow as tf

        actual = tf.cast(tf.reshape(label, [-1]), tf.float64)
        error = tf.cast(tf.reshape(self.signature(examples=serialized)["predictions"], [-1]), tf.float64) - actual
        return tf.stack([tf.reduce_sum(tf.square(error)), tf.reduce_sum(tf.abs(error)), tf.reduce_sum(actual),
                         tf.reduce_sum(tf.square(actual))])

    @staticmethod
    def metrics(sums, count: int) -> dict[str, float]:
        squared, absolute, label_sum, label_squares = sums
        spread = label_squares - label_sum ** 2 / count  # the squared error of predicting the mean
        r2 = 1.0 - squared / spread if spread > 0 else (1.0 if squared == 0 else float("-inf"))
        return {"loss": squared / count, "mae": absolute / count, "r2": r2}


def _load(name: str, serving: str):
    """The model at `serving` as a scorer of its kind: a classifier (it names its classes) or a regressor."""
    import tensorflow as tf

    if not files.isfile(f"{serving}/saved_model.pb"):
        raise SpecError(f"Gate: the {name} model has no SavedModel at {serving}")
    loaded = tf.saved_model.load(files.tf_readable(serving))
    if artifacts.CLASS_NAMES_SIGNATURE in loaded.signatures:
        return _Classifier(name, loaded)
    outputs = loaded.signatures["serving_default"].structured_outputs if "serving_default" in loaded.signatures \
        else {}
    if "predictions" in outputs:
        return _Regressor(name, loaded)
    raise SpecError(f"Gate: the {name} model at {serving} is neither a classifier with a "
                    f"{artifacts.CLASS_NAMES_SIGNATURE!r} signature nor a regressor whose serving_default returns "
                    "'predictions'", hint="export it with export_serving_model(..., class_names=...) or "
                                          "export_serving_model(..., regression=True)")


def require_metrics(scorers, metrics) -> None:
    """Every metric the gate is asked to check must be one these models compute, and the models of one kind."""
    kinds = {scorer.kind for scorer in scorers}
    if len(kinds) > 1:
        raise SpecError("Gate: the candidate and the champion are not the same kind of model ("
                        + ", ".join(f"{scorer.name} is a {scorer.kind}" for scorer in scorers) + ")",
                        hint="push a model of another kind to a serving folder of its own")
    lacking = sorted(set(metrics) - set(scorers[0].computes))
    if lacking:
        raise SpecError(f"Gate: {', '.join(lacking)} is not a metric of a {scorers[0].kind}",
                        hint=f"a {scorers[0].kind}'s metrics: {', '.join(scorers[0].computes)}")


def _label_feature(schema_uri: str, label_key: str):
    import tensorflow as tf
    from tensorflow_metadata.proto.v0 import schema_pb2

    from hpml.components.schema_file import read_schema

    schema = read_schema(artifacts.schema_path(schema_uri))
    kinds = {feature.name: feature.type for feature in schema.feature}
    if label_key not in kinds:
        raise SpecError(f"Gate: label_key {label_key!r} is not a feature of the schema at {schema_uri}",
                        hint=f"features: {', '.join(sorted(kinds))}")
    dtype = {schema_pb2.BYTES: tf.string, schema_pb2.INT: tf.int64, schema_pb2.FLOAT: tf.float32}[kinds[label_key]]
    return tf.io.FixedLenFeature([], dtype)


def score(examples_uri: str, schema_uri: str, split: str, label_key: str, models: Mapping[str, str],
          batch_size: int, metrics=()) -> tuple[int, dict[str, dict[str, float]]]:
    """(examples scored, {model name: {metric: value}}) for the named serving SavedModels on `split`; `metrics`,
    the ones the verdict will check, are checked against what the models compute before any example is read."""
    import tensorflow as tf

    pattern = artifacts.examples_file_pattern(examples_uri, split)
    shards = artifacts.require_files(pattern, f"Gate: split {split!r}")
    label_feature = _label_feature(schema_uri, label_key)
    scored = [_load(name, uri) for name, uri in models.items()]
    require_metrics(scored, metrics)
    totals = [tf.Variable(tf.zeros([model.sums], tf.float64), trainable=False) for model in scored]

    @tf.function(autograph=False, input_signature=[  # one trace, the last batch's shorter shape included
        tf.TensorSpec([None], tf.string), tf.TensorSpec([None], label_feature.dtype)])
    def add(serialized, label):
        for model, total in zip(scored, totals):
            total.assign_add(model.batch_sums(serialized, label))

    count, reported = 0, time.monotonic()
    try:
        for serialized, label in labelled_batches(shards, label_key, label_feature, batch_size):
            add(serialized, label)
            count += int(serialized.shape[0])
            if time.monotonic() - reported > _PROGRESS_EVERY_S:
                log.info("Gate: %d examples of split %r scored", count, split)
                reported = time.monotonic()
    except tf.errors.InvalidArgumentError as err:  # in the batch after the `count` examples scored
        raise InputDataError(f"Gate: {pattern}: an example's label {label_key!r} is missing or not one value, in "
                             f"examples {count + 1}-{count + batch_size} of the split "
                             f"({_cause(err.message)})") from None
    if count == 0:
        raise InputDataError(f"Gate: split {split!r} at {pattern} has no examples to score")
    return count, {model.name: model.metrics([float(s) for s in total.numpy()], count)
                   for model, total in zip(scored, totals)}


def labelled_batches(shards: list[str], label_key: str, label_feature, batch_size: int):
    """(serialized examples, their labels) in batches: the split read, decompressed and its labels parsed on tf.data's
    threads, ahead of the batch being scored."""
    import tensorflow as tf

    spec = {label_key: label_feature}
    return tf.data.TFRecordDataset(shards, compression_type="GZIP").batch(batch_size).map(
        lambda serialized: (serialized, tf.io.parse_example(serialized, spec)[label_key]),
        num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def _cause(message: str) -> str:
    """What TensorFlow says went wrong, without where in tf.data it did: from 'Feature: ...' where it names one."""
    start = message.find("Feature: ")
    return (message[start:] if start >= 0 else message).splitlines()[0]
