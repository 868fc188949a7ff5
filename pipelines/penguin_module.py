"""The penguin user module: `preprocessing_fn` for Transform and `run_fn` for Trainer.

Written against TFX's contract only (FnArgs fields, tfxio dataset options), so a TFX
pipeline can use it as its Transform and Trainer module_file.
"""
from __future__ import annotations

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
import tensorflow_transform as tft  # noqa: E402

from pipelines.columns import PENGUIN_CATEGORICAL as CATEGORICAL_FEATURES  # noqa: E402
from pipelines.columns import PENGUIN_LABEL as LABEL_KEY  # noqa: E402
from pipelines.columns import PENGUIN_NUMERIC as NUMERIC_FEATURES  # noqa: E402

DEFAULT_HYPERPARAMETERS = {"epochs": 10, "batch_size": 32, "learning_rate": 0.01, "seed": 42}


def _dense(x, default):
    """A [batch] tensor; a missing value (absent feature) becomes `default`."""
    if isinstance(x, tf.sparse.SparseTensor):
        x = tf.sparse.to_dense(
            tf.SparseTensor(x.indices, x.values, [x.dense_shape[0], 1]), default_value=default
        )
    return tf.reshape(x, [-1])


def preprocessing_fn(inputs):
    """z-score the measurements (missing -> the mean), vocabularies for island, sex and the label."""
    outputs = {}
    for name in NUMERIC_FEATURES:
        value = tf.cast(inputs[name], tf.float32) if not isinstance(inputs[name], tf.sparse.SparseTensor) else \
            tf.SparseTensor(inputs[name].indices, tf.cast(inputs[name].values, tf.float32), inputs[name].dense_shape)
        outputs[name] = _dense(tft.scale_to_z_score(value), 0.0)
    for name in CATEGORICAL_FEATURES:
        outputs[name] = tft.compute_and_apply_vocabulary(
            _dense(inputs[name], ""), num_oov_buckets=1, vocab_filename=name
        )
    outputs[LABEL_KEY] = tft.compute_and_apply_vocabulary(_dense(inputs[LABEL_KEY], ""), vocab_filename=LABEL_KEY)
    return outputs


def _label_classes(tf_transform_output) -> int:
    """The label vocabulary's size; one class leaves nothing to learn (and Keras would then score
    "accuracy" as binary accuracy, reporting 0 for a model that is always right), so it is refused."""
    from components.errors import InputDataError

    classes = tf_transform_output.vocabulary_size_by_name(LABEL_KEY)
    if classes < 2:
        values = tf_transform_output.vocabulary_by_name(LABEL_KEY)
        raise InputDataError(
            f"label {LABEL_KEY!r}: the training data holds {classes} class(es) "
            f"({', '.join(v.decode() for v in values) or 'none'}); a classifier needs at least 2",
            hint="check the data path: it may hold a subset of the data",
        )
    return classes


def build_model(tf_transform_output, learning_rate: float, accumulation_steps: int = 1):
    """A small MLP over the z-scored measurements and one-hot categories."""
    import tf_keras

    from components.trainer.grad_accum import GradientAccumulationModel

    inputs, encoded = {}, []
    for name in NUMERIC_FEATURES:
        inputs[name] = tf_keras.Input(shape=(), name=name, dtype=tf.float32)
        encoded.append(tf_keras.layers.Reshape((1,))(inputs[name]))
    for name in CATEGORICAL_FEATURES:
        depth = tf_transform_output.vocabulary_size_by_name(name) + 1
        inputs[name] = tf_keras.Input(shape=(), name=name, dtype=tf.int64)
        encoded.append(tf_keras.layers.CategoryEncoding(depth, output_mode="one_hot")(inputs[name]))
    x = tf_keras.layers.Concatenate()(encoded)
    for units in (16, 8):
        x = tf_keras.layers.Dense(units, activation="relu")(x)
    classes = _label_classes(tf_transform_output)
    outputs = tf_keras.layers.Dense(classes, activation="softmax")(x)
    if accumulation_steps > 1:
        model = GradientAccumulationModel(inputs, outputs, accumulation_steps=accumulation_steps)
    else:
        model = tf_keras.Model(inputs, outputs)
    model.compile(
        optimizer=tf_keras.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
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


def build_pipeline_model(tf_transform_output, hp):
    """The same MLP as a GPipe PipelineModel over K stages and M micro-batches."""
    import tf_keras

    from components.trainer.gpipe.pipeline_model import PipelineModel

    classes = _label_classes(tf_transform_output)
    layers = [_feature_layer(tf_transform_output), tf_keras.layers.Dense(16, activation="relu"),
              tf_keras.layers.Dense(8, activation="relu"), tf_keras.layers.Dense(classes, activation="softmax")]
    k = int(hp.get("pipeline_stages", 2))
    model = PipelineModel(layers, num_stages=k, num_micro_batches=int(hp.get("micro_batches", 4)),
                          balance=hp.get("balance", [2, 2] if k == 2 else [1] * k),
                          remat=hp.get("remat", "except_last"), schedule_name=hp.get("schedule", "gpipe"),
                          swap=bool(hp.get("swap", False)))
    model.compile(optimizer=tf_keras.optimizers.Adam(hp["learning_rate"]),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _record_pipeline(model, batch, model_run_dir):
    """K, M, the balance, profiled per-stage costs and the bubble they imply, and the executed
    timeline of one traced step (order per stage and measured bubble), for the run record."""
    from components.trainer.gpipe import profile, trace

    features, labels = batch[0], batch[1]
    costs = profile.layer_costs(model.pipeline_layers, features, repeats=3)
    stage_costs = profile.stage_costs(costs, model.stages)
    events = trace.trace_train_step(model, features, labels)
    executed = trace.executed_order(events, model.num_stages)
    record = dict(model.describe(), stage_costs_s=stage_costs,
                  measured_bubble=profile.measured_bubble(model.order, stage_costs),
                  executed_bubble=trace.measured_bubble(events, model.num_stages),
                  executed_order=executed, executed_in_schedule_order=executed == model.order,
                  executed_events=[[e.stage, e.kind, e.micro, round(e.start_ms, 4), round(e.end_ms, 4), e.name]
                                   for e in events])
    with open(os.path.join(model_run_dir, "gpipe.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=2)


def estimate_model_memory(hyperparameters):
    """The Trainer's strategy planner asks for this: about 300 parameters, tiny activations."""
    from components.trainer.plan import ModelMemory

    batch = int(hyperparameters.get("batch_size", DEFAULT_HYPERPARAMETERS["batch_size"]))
    return ModelMemory(params=16 * 12 + 16 + 8 * 16 + 8 + 3 * 8 + 3, activation_bytes=batch * 48 * 4)


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
    """Train the penguin classifier under the planned strategy and export it for serving."""
    import tf_keras

    from components.input_pipeline.stall import record_input_stall
    from components.trainer.callbacks import CoordinatorValidation, epoch_size, standard_callbacks
    from components.trainer.export import export_serving_model
    from components.trainer.strategies import make_strategy

    hp = dict(DEFAULT_HYPERPARAMETERS, **(fn_args.hyperparameters or {}))
    config = fn_args.custom_config or {}
    strategy_name = config.get("strategy", "one_device")
    strategy = make_strategy(strategy_name)  # first: cluster strategies must precede other TF ops
    tf_keras.utils.set_random_seed(hp["seed"])
    tf_transform_output = tft.TFTransformOutput(fn_args.transform_output)
    accumulation = int(hp.get("gradient_accumulation_steps", 1))

    evaluation = _dataset(fn_args, fn_args.eval_files, tf_transform_output, hp["batch_size"], hp["seed"], False)
    with strategy.scope():
        if strategy_name == "gpipe":
            model = build_pipeline_model(tf_transform_output, hp)
            model(next(iter(evaluation))[0])  # create each stage's variables on its device, outside fit
        else:
            model = build_model(tf_transform_output, hp["learning_rate"], accumulation)
    os.makedirs(fn_args.model_run_dir, exist_ok=True)
    # Steps per epoch must be known for BackupAndRestore to resume mid-epoch and for the PS
    # coordinator; the training data then repeats and the steps mark the epoch boundaries.
    steps, examples = fn_args.train_steps, None
    if not steps:
        steps, examples = epoch_size(
            _dataset(fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], False))
    callbacks = standard_callbacks(fn_args, strategy_name, hp["batch_size"], hp["epochs"],
                                   config.get("backup_save_freq", "epoch"), examples_per_epoch=examples)
    if strategy_name == "parameter_server":
        # The coordinator schedules steps on the workers; each worker makes its own dataset.
        train = tf_keras.utils.experimental.DatasetCreator(lambda context: _dataset(
            fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], True, None))
        local = build_model(tf_transform_output, hp["learning_rate"])  # evaluates and exports on the coordinator
        callbacks.insert(0, CoordinatorValidation(local, evaluation, fn_args.eval_steps))
        model.fit(train, epochs=hp["epochs"], steps_per_epoch=steps, callbacks=callbacks, verbose=0)
        local.set_weights([v.numpy() for v in model.weights])
        model = local
    else:
        train = _dataset(fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], True, None)
        model.fit(train, epochs=hp["epochs"], steps_per_epoch=steps, validation_data=evaluation,
                  validation_steps=fn_args.eval_steps, callbacks=callbacks, verbose=0)
        if strategy_name != "multi_worker_mirrored":  # workers would have to time their steps in lockstep
            record_input_stall(model, train, fn_args.model_run_dir, steps=min(30, 2 * steps))
    if strategy_name == "gpipe":
        _record_pipeline(model, next(iter(evaluation)), fn_args.model_run_dir)
    results = model.evaluate(evaluation, steps=fn_args.eval_steps, verbose=0, return_dict=True)
    with open(os.path.join(fn_args.model_run_dir, "eval_metrics.json"), "w", encoding="utf-8") as handle:
        json.dump({k: float(v) for k, v in results.items()}, handle)
    class_names = tf_transform_output.vocabulary_by_name(LABEL_KEY)
    export_serving_model(
        model, tf_transform_output, fn_args.serving_model_dir, LABEL_KEY,
        class_names=[c.decode() if isinstance(c, bytes) else c for c in class_names],
    )
