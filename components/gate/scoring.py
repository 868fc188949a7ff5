"""Score classifiers on one split of raw tf.Examples, in one pass: each batch is read once and goes through
every model's serving signature (parse, transform and model, as a client calls it)."""
from __future__ import annotations

from collections.abc import Mapping

from hpml.components import artifacts, files
from hpml.components.errors import InputDataError, SpecError

# The metrics the gate computes, and which way is better.
HIGHER_IS_BETTER = {"accuracy": True, "loss": False}
_PROBABILITY_FLOOR = 1e-7  # the loss of a probability of 0 is large, not infinite


class _Model:
    """One SavedModel's serving signature and the class name of each probability column."""

    def __init__(self, name: str, serving: str):
        import tensorflow as tf

        if not files.isfile(f"{serving}/saved_model.pb"):
            raise SpecError(f"Gate: the {name} model has no SavedModel at {serving}")
        loaded = tf.saved_model.load(serving)
        if artifacts.CLASS_NAMES_SIGNATURE not in loaded.signatures:
            raise SpecError(f"Gate: the {name} model at {serving} has no {artifacts.CLASS_NAMES_SIGNATURE!r} "
                            "signature, so its probability columns cannot be matched with labels",
                            hint="export it with export_serving_model(..., class_names=...)")
        self.name = name
        self.loaded = loaded  # keeps the signature's variables alive
        self.signature = loaded.signatures["serving_default"]
        self.class_names = loaded.signatures[artifacts.CLASS_NAMES_SIGNATURE]()["class_names"]
        self.correct = 0
        self.log_loss = 0.0

    def add(self, serialized, labels) -> None:
        import tensorflow as tf

        probabilities = self.signature(examples=serialized)["probabilities"]
        matches = tf.equal(labels[:, None], self.class_names[None, :])
        label_probability = tf.reduce_sum(tf.where(matches, probabilities, 0.0), axis=1)
        predicted = tf.gather(self.class_names, tf.argmax(probabilities, axis=1))
        self.correct += int(tf.reduce_sum(tf.cast(tf.equal(predicted, labels), tf.int64)))
        self.log_loss += float(-tf.reduce_sum(tf.math.log(tf.maximum(label_probability, _PROBABILITY_FLOOR))))

    def metrics(self, count: int) -> dict[str, float]:
        return {"accuracy": self.correct / count, "loss": self.log_loss / count}


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
          batch_size: int) -> tuple[int, dict[str, dict[str, float]]]:
    """(examples scored, {model name: {metric: value}}) for the named serving SavedModels on `split`."""
    import tensorflow as tf

    pattern = artifacts.examples_file_pattern(examples_uri, split)
    shards = artifacts.require_files(pattern, f"Gate: split {split!r}")
    label_spec = {label_key: _label_feature(schema_uri, label_key)}
    scored = [_Model(name, uri) for name, uri in models.items()]
    count = 0
    batches = tf.data.TFRecordDataset(shards, compression_type="GZIP").batch(batch_size)
    try:
        for serialized in batches:
            label = tf.io.parse_example(serialized, label_spec)[label_key]
            labels = label if label.dtype == tf.string else tf.strings.as_string(label)
            for model in scored:
                model.add(serialized, labels)
            count += int(serialized.shape[0])
    except tf.errors.InvalidArgumentError as err:
        raise InputDataError(f"Gate: {pattern}: an example's label {label_key!r} is missing or not one value "
                             f"({err.message.splitlines()[0]})") from None
    if count == 0:
        raise InputDataError(f"Gate: split {split!r} at {pattern} has no examples to score")
    return count, {model.name: model.metrics(count) for model in scored}
