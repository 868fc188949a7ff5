"""A run_fn that records which examples a parameter-server cluster's workers read.

It makes the shuffled training data through `fn_args.data_accessor`, as a TFX module does,
with a fixed global and shuffle seed. The coordinator schedules STEPS one-example steps across
the workers; the chief saves each step's example (its feature values) to batches.json.
"""
import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

STEPS = 100


def _flat(features):
    """One example's feature values as one float vector, in a fixed key order."""
    import tensorflow as tf

    parts = []
    for key in sorted(features):
        value = features[key]
        if isinstance(value, tf.SparseTensor):
            value = tf.sparse.to_dense(value)
        parts.append(tf.reshape(tf.cast(value, tf.float64), [-1]))
    return tf.concat(parts, axis=0)


def run_fn(fn_args):
    import tensorflow as tf
    import tensorflow_transform as tft
    from tfx_bsl.public import tfxio

    from hpml.components.trainer.strategies import make_strategy

    strategy = make_strategy(fn_args.custom_config["strategy"])
    tf.random.set_seed(7)
    schema = tft.TFTransformOutput(fn_args.transform_output).transformed_metadata.schema
    options = tfxio.TensorFlowDatasetOptions(batch_size=1, shuffle=True, shuffle_seed=7, num_epochs=None)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: fn_args.data_accessor.tf_dataset_factory(fn_args.train_files, options, schema)))

    @tf.function
    def read(per_worker):
        return _flat(next(per_worker))

    steps = [coordinator.schedule(read, args=(iterator,)) for _ in range(STEPS)]
    coordinator.join()
    with open(os.path.join(fn_args.model_run_dir, "batches.json"), "w", encoding="utf-8") as handle:
        json.dump([step.fetch().tolist() for step in steps], handle)
    tf.saved_model.save(tf.Module(), fn_args.serving_model_dir)  # the Trainer requires a model
