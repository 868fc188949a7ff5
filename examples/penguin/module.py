"""The penguin user module, derived from the columns of penguins.csv: `preprocessing_fn` for Transform
and `run_fn` for Trainer. Written by `hpml init`; edit it freely.

Written against TFX's contract (FnArgs fields, tfxio dataset options) and `hpml.v1` only, so a TFX pipeline can
use it as its Transform and Trainer module_file.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf
import tensorflow_transform as tft

LABEL_KEY = "species"
TASK = "classification"  # "classification" or "regression"
# z-scored; a missing value becomes the mean
NUMERIC_FEATURES = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g")
# a vocabulary each, plus one out-of-vocabulary id
CATEGORICAL_FEATURES = ("island", "sex")
HIDDEN_UNITS = (16, 8)
DEFAULT_HYPERPARAMETERS = {"epochs": 10, "batch_size": 32, "learning_rate": 0.01, "seed": 42}


def _dense(x, default):
    """A [batch] tensor; a missing value (absent feature) becomes `default`."""
    if isinstance(x, tf.sparse.SparseTensor):
        x = tf.sparse.to_dense(
            tf.SparseTensor(x.indices, x.values, [x.dense_shape[0], 1]), default_value=default
        )
    return tf.reshape(x, [-1])


def _float(x):
    """The same tensor, dense or sparse, as float32."""
    if isinstance(x, tf.sparse.SparseTensor):
        return tf.SparseTensor(x.indices, tf.cast(x.values, tf.float32), x.dense_shape)
    return tf.cast(x, tf.float32)


def _text(x):
    """The same tensor, dense or sparse, as strings: a whole-number label's classes are its values."""
    if x.dtype == tf.string:
        return x
    if isinstance(x, tf.sparse.SparseTensor):
        return tf.SparseTensor(x.indices, tf.strings.as_string(x.values), x.dense_shape)
    return tf.strings.as_string(x)


def preprocessing_fn(inputs):
    """z-score the numbers (missing -> the mean), a vocabulary for each text column and a class label."""
    outputs = {}
    for name in NUMERIC_FEATURES:
        outputs[name] = _dense(tft.scale_to_z_score(_float(inputs[name])), 0.0)
    for name in CATEGORICAL_FEATURES:
        outputs[name] = tft.compute_and_apply_vocabulary(
            _dense(_text(inputs[name]), ""), num_oov_buckets=1, vocab_filename=name
        )
    if TASK == "classification":
        outputs[LABEL_KEY] = tft.compute_and_apply_vocabulary(_dense(_text(inputs[LABEL_KEY]), ""),
                                                              vocab_filename=LABEL_KEY)
    else:
        outputs[LABEL_KEY] = _dense(_float(inputs[LABEL_KEY]), 0.0)
    return outputs


def _label_classes(tf_transform_output) -> int:
    """The label vocabulary's size; one class leaves nothing to learn (and Keras would then score
    "accuracy" as binary accuracy, reporting 0 for a model that is always right), so it is refused."""
    from hpml.v1 import InputDataError

    classes = tf_transform_output.vocabulary_size_by_name(LABEL_KEY)
    if classes < 2:
        values = tf_transform_output.vocabulary_by_name(LABEL_KEY)
        raise InputDataError(
            f"label {LABEL_KEY!r}: the training data holds {classes} class(es) "
            f"({', '.join(v.decode() for v in values) or 'none'}); a classifier needs at least 2",
            hint="check the data path: it may hold a subset of the data",
        )
    return classes


def _head(tf_transform_output, label_stats=None):
    """The output layer, loss and metrics the task asks for. A regressor's unit-scale output is moved to the
    label's scale by `label_stats`, the training labels' (mean, standard deviation)."""
    import tf_keras

    if TASK == "classification":
        # float32 outputs whatever the policy: a mixed-precision model keeps its loss in full precision
        return (tf_keras.layers.Dense(_label_classes(tf_transform_output), activation="softmax", dtype="float32"),
                "sparse_categorical_crossentropy", ["accuracy"])
    mean, std = label_stats or (0.0, 1.0)
    head = tf_keras.Sequential([tf_keras.layers.Dense(1, dtype="float32"),
                                tf_keras.layers.Rescaling(std, offset=mean, dtype="float32")], name="head")
    return head, "mse", ["mae"]


def label_stats(dataset):
    """(mean, standard deviation) of a regression label over one pass of (features, label) batches."""
    count, total, squares = 0.0, 0.0, 0.0
    for _, labels in dataset:
        labels = tf.cast(tf.reshape(labels, [-1]), tf.float64)
        count += float(tf.size(labels))
        total += float(tf.reduce_sum(labels))
        squares += float(tf.reduce_sum(labels * labels))
    mean = total / max(count, 1.0)
    return mean, max((squares / max(count, 1.0) - mean * mean), 0.0) ** 0.5 or 1.0


def build_model(tf_transform_output, learning_rate: float, accumulation_steps: int = 1, label_stats=None):
    """A small MLP over the z-scored numbers and one-hot categories."""
    import tf_keras

    from hpml.v1 import GradientAccumulationModel

    inputs, encoded = {}, []
    for name in NUMERIC_FEATURES:
        inputs[name] = tf_keras.Input(shape=(), name=name, dtype=tf.float32)
        encoded.append(tf_keras.layers.Reshape((1,))(inputs[name]))
    for name in CATEGORICAL_FEATURES:
        depth = tf_transform_output.vocabulary_size_by_name(name) + 1
        inputs[name] = tf_keras.Input(shape=(), name=name, dtype=tf.int64)
        encoded.append(tf_keras.layers.CategoryEncoding(depth, output_mode="one_hot")(inputs[name]))
    x = tf_keras.layers.Concatenate()(encoded) if len(encoded) > 1 else encoded[0]
    for units in HIDDEN_UNITS:
        x = tf_keras.layers.Dense(units, activation="relu")(x)
    head, loss, metrics = _head(tf_transform_output, label_stats)
    outputs = head(x)
    if accumulation_steps > 1:
        model = GradientAccumulationModel(inputs, outputs, accumulation_steps=accumulation_steps)
    else:
        model = tf_keras.Model(inputs, outputs)
    model.compile(optimizer=tf_keras.optimizers.Adam(learning_rate), loss=loss, metrics=metrics)
    return model


def _feature_layer(tf_transform_output):
    import tf_keras

    depths = {name: tf_transform_output.vocabulary_size_by_name(name) + 1 for name in CATEGORICAL_FEATURES}

    class EncodeFeatures(tf_keras.layers.Layer):
        """The dict of transformed features -> one dense vector (the first pipeline stage)."""

        def call(self, features):
            numeric = [tf.reshape(tf.cast(features[n], tf.float32), [-1, 1]) for n in NUMERIC_FEATURES]
            onehot = [tf.one_hot(features[n], depths[n]) for n in CATEGORICAL_FEATURES]
            return tf.concat(numeric + onehot, axis=1)

    return EncodeFeatures(name="encode_features")


def build_pipeline_model(tf_transform_output, hp, label_stats=None):
    """The same MLP as a GPipe PipelineModel over K stages and M micro-batches."""
    import tf_keras

    from hpml.v1 import PipelineModel

    encode = _feature_layer(tf_transform_output)
    hidden = [tf_keras.layers.Dense(units, activation="relu") for units in HIDDEN_UNITS]
    head, loss, metrics = _head(tf_transform_output, label_stats)
    layers = [encode, *hidden, head]
    k = int(hp.get("pipeline_stages", 2))
    model = PipelineModel(layers, num_stages=k, num_micro_batches=int(hp.get("micro_batches", 4)),
                          balance=hp.get("balance", [2, 2] if k == 2 else [1] * k),
                          remat=hp.get("remat", "except_last"), schedule_name=hp.get("schedule", "gpipe"),
                          swap=bool(hp.get("swap", False)))
    model.compile(optimizer=tf_keras.optimizers.Adam(hp["learning_rate"]), loss=loss, metrics=metrics)
    return model


def estimate_model_memory(hyperparameters):
    """The Trainer's strategy planner asks for this: the MLP's parameters, with 8 values a category assumed."""
    from hpml.v1 import ModelMemory

    batch = int(hyperparameters.get("batch_size", DEFAULT_HYPERPARAMETERS["batch_size"]))
    widths = [len(NUMERIC_FEATURES) + 8 * len(CATEGORICAL_FEATURES), *HIDDEN_UNITS, 8]
    params = sum((a + 1) * b for a, b in zip(widths, widths[1:]))
    return ModelMemory(params=params, activation_bytes=batch * sum(widths) * 4)


def _dataset(fn_args, files, tf_transform_output, batch_size, seed, shuffle, num_epochs=1):
    from tfx_bsl.public import tfxio

    options = tfxio.TensorFlowDatasetOptions(
        batch_size=batch_size, label_key=LABEL_KEY, num_epochs=num_epochs, shuffle=shuffle, shuffle_seed=seed
    )
    dataset = fn_args.data_accessor.tf_dataset_factory(files, options, tf_transform_output.transformed_metadata.schema)
    # Shard by element across workers: a small data set may have fewer files than workers.
    sharding = tf.data.Options()
    sharding.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(sharding)


def run_fn(fn_args):
    """Train the model under the planned strategy and export it for serving raw tf.Examples."""
    import tf_keras

    from hpml.v1 import (CoordinatorValidation, InputStallProbe, ServingExport, ValidationConfusion, epoch_size,
                         final_eval_metrics, make_strategy, record_pipeline_schedule, resume_training_data,
                         standard_callbacks, tune_training_step, write_classification_report, write_eval_metrics)

    hp = dict(DEFAULT_HYPERPARAMETERS, **(fn_args.hyperparameters or {}))
    config = fn_args.custom_config or {}
    strategy_name = config.get("strategy", "one_device")
    strategy = make_strategy(strategy_name)  # first: cluster strategies must precede other TF ops
    tf_keras.utils.set_random_seed(hp["seed"])
    tf_transform_output = tft.TFTransformOutput(fn_args.transform_output)
    accumulation = int(hp.get("gradient_accumulation_steps", 1))
    eval_steps = fn_args.eval_steps or None  # 0 or None: the whole eval split

    evaluation = _dataset(fn_args, fn_args.eval_files, tf_transform_output, hp["batch_size"], hp["seed"], False)
    stats = None if TASK == "classification" else label_stats(
        _dataset(fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], False))
    with strategy.scope():
        if strategy_name == "gpipe":
            model = build_pipeline_model(tf_transform_output, hp, stats)
            model(next(iter(evaluation))[0])  # create each stage's variables on its device, outside fit
        else:
            model = build_model(tf_transform_output, hp["learning_rate"], accumulation, stats)
    tf.io.gfile.makedirs(fn_args.model_run_dir)  # local or on an object store
    # Steps per epoch must be known for BackupAndRestore to resume mid-epoch and for the PS
    # coordinator; the training data then repeats and the steps mark the epoch boundaries.
    steps, examples = fn_args.train_steps, None
    if not steps:
        steps, examples = epoch_size(  # from the examples Transform counted, or a pass over them
            lambda: _dataset(fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], False),
            fn_args.train_files, hp["batch_size"])
    callbacks = standard_callbacks(fn_args, strategy_name, hp["batch_size"], hp["epochs"],
                                   config.get("backup_save_freq", "epoch"), examples_per_epoch=examples)
    class_names = None if TASK != "classification" else [
        c.decode() if isinstance(c, bytes) else c for c in tf_transform_output.vocabulary_by_name(LABEL_KEY)]
    confusion = None if class_names is None else ValidationConfusion(len(class_names))
    # Saves the serving model (transform graph, signatures) during fit; publish() then writes the trained weights
    export = ServingExport(tf_transform_output, fn_args.serving_model_dir, LABEL_KEY, class_names=class_names,
                           regression=TASK != "classification")
    callbacks.append(export)
    if strategy_name == "parameter_server":
        # The coordinator schedules steps on the workers; each worker makes its own dataset.
        train = tf_keras.utils.experimental.DatasetCreator(lambda context: _dataset(
            fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], True, None))
        local = build_model(tf_transform_output, hp["learning_rate"], label_stats=stats)  # evaluates, exports
        callbacks.insert(0, CoordinatorValidation(local, evaluation, eval_steps))
        history = model.fit(train, epochs=hp["epochs"], steps_per_epoch=steps, callbacks=callbacks, verbose=0)
        local.set_weights([v.numpy() for v in model.weights])
        model = local
    else:
        train = resume_training_data(  # a resumed run reads on from where its backup was taken
            _dataset(fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], True, None),
            fn_args)

        def rebuild():  # the same model, built again (under a mixed-precision policy, if the tuner measures one)
            with strategy.scope():
                return build_model(tf_transform_output, hp["learning_rate"], accumulation, stats)

        # steps_per_execution, XLA and precision, measured for this model on this machine (or pinned in hp), on the
        # training data unshuffled: its batches come at once, where a shuffled copy first fills its shuffle window,
        # and reading `train` itself would move its shuffle order on
        unshuffled = _dataset(fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], False,
                              None)
        model = tune_training_step(model, unshuffled, fn_args, hp, strategy_name=strategy_name, steps_per_epoch=steps,
                                   epochs=hp["epochs"], batch_size=hp["batch_size"], rebuild=rebuild,
                                   save_freq=config.get("backup_save_freq", "epoch"))
        if eval_steps is None:  # several steps per call need the number of steps up front, validation's too
            eval_steps = epoch_size(evaluation, fn_args.eval_files, hp["batch_size"])[0]
        # The share of a step that waits on input, measured on a twin (built only then) once the first epoch is
        # over: the run's live view shows it while the rest trains. A one-epoch run has no rest and skips it.
        twin = lambda: _dataset(  # noqa: E731
            fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], True, None)
        callbacks.append(InputStallProbe(twin, fn_args, steps_per_epoch=steps, memory_source=unshuffled))
        if confusion is not None:  # counted in fit's validation: the per-class report reads the eval split no more
            callbacks.append(confusion)
        history = model.fit(train, epochs=hp["epochs"], steps_per_epoch=steps, validation_data=evaluation,
                            validation_steps=eval_steps, callbacks=callbacks, verbose=0)
    if strategy_name == "gpipe":
        record_pipeline_schedule(model, next(iter(evaluation)), fn_args.model_run_dir)
    # The last epoch's validation ran on these weights: its numbers are the eval metrics, with no second pass
    write_eval_metrics(fn_args.model_run_dir, final_eval_metrics(model, evaluation, eval_steps, history))
    if TASK == "classification":
        write_classification_report(fn_args.model_run_dir, model, evaluation, class_names, eval_steps, confusion)
    export.publish(model)
