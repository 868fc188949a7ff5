"""The digits user module: `preprocessing_fn` and a `run_fn` that trains a teacher, a student from
scratch, or (Trainer mode `distill`) a student against frozen teachers.

scikit-learn's 8x8 digits: 64 pixel intensities 0..16 and the digit. Every model is an MLP on the
64 scaled pixels that outputs logits; the exported Model adds a softmax and serves raw tf.Examples.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf

LABEL_KEY = "digit"
PIXELS = tuple(f"pixel_{i}" for i in range(64))

NUM_CLASSES = 10
CLASS_NAMES = [str(d) for d in range(NUM_CLASSES)]
DEFAULT_HYPERPARAMETERS = {"epochs": 60, "batch_size": 64, "learning_rate": 0.01, "seed": 0,
                           "hidden": [32], "activation": "relu", "dropout": 0.0, "shift_augment": False}
# One-pixel shifts (and the unshifted image) that the teachers may train on: Hinton et al.'s jitter.
SHIFTS = ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1))


def _column(x):
    """A [batch] float tensor from a raw column (dense or, if the schema says so, sparse)."""
    if isinstance(x, tf.sparse.SparseTensor):
        x = tf.sparse.to_dense(tf.SparseTensor(x.indices, x.values, [x.dense_shape[0], 1]))
    return tf.reshape(tf.cast(x, tf.float32), [-1])


def preprocessing_fn(inputs):
    """The 64 pixels as one [batch, 64] feature scaled to [0, 1]; the digit as an int64 label."""
    pixels = tf.stack([_column(inputs[name]) for name in PIXELS], axis=1) / 16.0
    label = tf.cast(_column(inputs[LABEL_KEY]), tf.int64)
    return {"pixels": pixels, LABEL_KEY: label}


def shift_pixels(pixels, dx: int, dy: int):
    """[batch, 64] images moved dx columns right and dy rows down; pixels moved in are blank."""
    images = tf.reshape(pixels, [-1, 8, 8])
    images = tf.pad(images, [[0, 0], [max(dy, 0), max(-dy, 0)], [max(dx, 0), max(-dx, 0)]])
    images = images[:, max(-dy, 0):max(-dy, 0) + 8, max(-dx, 0):max(-dx, 0) + 8]
    return tf.reshape(images, [-1, 64])


def _shift_batch(features, label, seed: int):
    """Each image moved by one of SHIFTS, drawn at random: augmentation that keeps the digit."""
    pixels = features["pixels"]
    shifted = tf.stack([shift_pixels(pixels, dx, dy) for dx, dy in SHIFTS], axis=1)  # [batch, shifts, 64]
    choice = tf.random.uniform(tf.shape(pixels)[:1], 0, len(SHIFTS), dtype=tf.int32, seed=seed)
    return dict(features, pixels=tf.gather(shifted, choice, batch_dims=1)), label


def build_mlp(hidden: list[int], activation: str, dropout: float):
    """An MLP on `pixels` that outputs logits over the ten digits."""
    import tf_keras

    pixels = tf_keras.Input(shape=(64,), name="pixels")
    x = pixels
    for units in hidden:
        x = tf_keras.layers.Dense(units, activation=activation)(x)
        if dropout:
            x = tf_keras.layers.Dropout(dropout)(x)
    # float32 logits whatever the policy: under a mixed policy the losses stay in full precision
    return tf_keras.Model({"pixels": pixels}, tf_keras.layers.Dense(NUM_CLASSES, name="logits", dtype="float32")(x))


def _dataset(fn_args, files, schema, batch_size, seed, shuffle, num_epochs=1):
    from tfx_bsl.public import tfxio

    options = tfxio.TensorFlowDatasetOptions(batch_size=batch_size, label_key=LABEL_KEY, num_epochs=num_epochs,
                                             shuffle=shuffle, shuffle_seed=seed)
    dataset = fn_args.data_accessor.tf_dataset_factory(files, options, schema)
    sharding = tf.data.Options()
    sharding.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(sharding)


def run_fn(fn_args):
    """Train (or distil) the MLP the hyperparameters describe under the planned strategy; export it."""
    import tensorflow_transform as tft
    import tf_keras

    from hpml.v1 import (build_distiller, distillation_config, distillation_schema, epoch_size, export_serving_model,
                         final_eval_metrics, make_strategy, resume_training_data, standard_callbacks,
                         student_for_serving, tune_training_step, write_eval_metrics)

    hp = dict(DEFAULT_HYPERPARAMETERS, **(fn_args.hyperparameters or {}))
    config = fn_args.custom_config or {}
    strategy_name = config.get("strategy", "one_device")
    strategy = make_strategy(strategy_name)  # first: cluster strategies must precede other TF ops
    tf_keras.utils.set_random_seed(int(hp["seed"]))
    distillation = distillation_config(config)
    tft_output = tft.TFTransformOutput(fn_args.transform_output)
    schema = distillation_schema(tft_output.transformed_metadata.schema, distillation)

    batch, epochs = int(hp["batch_size"]), int(hp["epochs"])
    evaluation = _dataset(fn_args, fn_args.eval_files, schema, batch, hp["seed"], False)

    def training_data():
        train = _dataset(fn_args, fn_args.train_files, schema, batch, hp["seed"], True, None)
        return train.map(lambda f, y: _shift_batch(f, y, int(hp["seed"]))) if hp["shift_augment"] else train

    train = resume_training_data(training_data(), fn_args)  # a resumed run reads on from where its backup was taken
    steps, examples = fn_args.train_steps, None
    if not steps:
        steps, examples = epoch_size(_dataset(fn_args, fn_args.train_files, schema, batch, hp["seed"], False),
                                     fn_args.train_files, batch)

    def build():  # the model to fit, compiled; built again by the step tuner under a mixed policy, if it measures one
        with strategy.scope():
            student = build_mlp(list(hp["hidden"]), hp["activation"], float(hp["dropout"]))
            if distillation:
                model = build_distiller(student, distillation, next(iter(evaluation))[0])
                model.compile(optimizer=tf_keras.optimizers.Adam(hp["learning_rate"]))
            else:
                model = student
                model.compile(optimizer=tf_keras.optimizers.Adam(hp["learning_rate"]),
                              loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                              metrics=["accuracy"])
        return model

    tf.io.gfile.makedirs(fn_args.model_run_dir)  # local or on an object store
    # steps_per_execution, XLA and precision, measured for this model on this machine (or pinned in hp), on a twin
    # of the training data: reading `train` itself would move its shuffle order on
    model = tune_training_step(build(), training_data(), fn_args, hp, strategy_name=strategy_name,
                               steps_per_epoch=steps, epochs=epochs, batch_size=batch, rebuild=build,
                               save_freq=config.get("backup_save_freq", "epoch"))
    student = model.student if distillation else model
    # several steps per call need validation's count
    eval_steps = fn_args.eval_steps or epoch_size(evaluation, fn_args.eval_files, batch)[0]
    callbacks = standard_callbacks(fn_args, strategy_name, batch, epochs, config.get("backup_save_freq", "epoch"),
                                   examples_per_epoch=examples)
    history = model.fit(train, epochs=epochs, steps_per_epoch=steps, validation_data=evaluation,
                        validation_steps=eval_steps, callbacks=callbacks, verbose=0)
    results = final_eval_metrics(model, evaluation, eval_steps, history)
    write_eval_metrics(fn_args.model_run_dir, dict(results, params=student.count_params()))
    export_serving_model(student_for_serving(student), tft_output, fn_args.serving_model_dir,
                         LABEL_KEY, class_names=CLASS_NAMES)
