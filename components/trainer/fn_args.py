"""FnArgs: the fields TFX's Trainer hands to `run_fn`, so TFX run_fn modules run unchanged."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple
from collections.abc import Callable


class DataAccessor(NamedTuple):
    """TFX's DataAccessor: factories that read the Trainer's input examples."""

    tf_dataset_factory: Callable
    record_batch_factory: Callable
    data_view_decode_fn: Callable | None


def tfxio_data_accessor() -> DataAccessor:
    """A DataAccessor backed by tfx_bsl's TFXIO, as TFX builds it for tf.Example records."""
    from tfx_bsl.public import tfxio

    from hpml.components.input_pipeline.read_ahead import local_copies

    def _tfxio(file_pattern, schema):  # TFXIO opens the files itself: shards on s3:// are downloaded first
        return tfxio.TFExampleRecord(file_pattern=local_copies(file_pattern), schema=schema,
                                     telemetry_descriptors=["hpml"])

    def tf_dataset_factory(file_pattern, dataset_options, schema=None):
        return _tfxio(file_pattern, schema).TensorFlowDataset(dataset_options)

    def record_batch_factory(file_pattern, dataset_options, schema=None):
        return _tfxio(file_pattern, schema).RecordBatches(dataset_options)

    return DataAccessor(tf_dataset_factory, record_batch_factory, None)


def for_epochs(spec, epochs: int | None):
    """The tuned spec for a Trainer that runs `epochs` epochs. One epoch reads the training data once, so nothing
    is cached: a cache would be filled and never read, and it grows with the data (about 90 bytes a row parsed)."""
    if epochs == 1 and spec.cache != "none":
        import dataclasses

        return dataclasses.replace(spec, cache="none")
    return spec


def training_epochs(epochs: int | None, train_steps: int | None, strategy: str | None) -> int | None:
    """fit's epochs where each is one pass over the training data, read by this one process: no `train_steps` of
    the user's, and not a cluster's workers (parameter_server's coordinator hands steps to any of them). None
    where an epoch is not known to be a pass."""
    from hpml.components.trainer.strategies import CLUSTER_STRATEGIES

    if not epochs or train_steps or strategy in CLUSTER_STRATEGIES:
        return None
    return int(epochs)


def training_passes(epochs: int | None, rows: int | None, batch_size: int) -> int | None:
    """The passes over `rows` training examples that `epochs` (see `training_epochs`) of ceil(rows / batch_size)
    steps take in full, as `epoch_size` counts an epoch: each epoch's last batch reaches into the next pass, so
    after many epochs their batches have read more than that many passes. None where either is unknown."""
    if not epochs or not rows:
        return None
    steps = -(-rows // batch_size)
    return epochs * steps * batch_size // rows


def input_pipeline_data_accessor(spec, skipped_shards: dict | None = None, epochs: int | None = None,
                                 pass_epochs: int | None = None) -> DataAccessor:
    """A DataAccessor whose tf.data datasets are built by the tuned InputPipeline spec (see `for_epochs`).

    TFX's TensorFlowDatasetOptions map onto `build_dataset`; record batches still come from
    TFXIO. Shards skipped as corrupt are added to `skipped_shards`. An endless shuffled dataset, as the training
    data is, reads past the passes that `pass_epochs` (see `training_epochs`) take in full only small windows.
    """
    from hpml.components.artifacts import recorded_examples
    from hpml.components.input_pipeline import build_dataset

    spec = for_epochs(spec, epochs)

    def tf_dataset_factory(file_pattern, dataset_options, schema=None):
        if schema is None:
            raise ValueError("the tuned input pipeline needs the schema of the examples it reads")
        report: dict = {}
        patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
        dataset = build_dataset(
            spec, file_pattern, schema, label_key=dataset_options.label_key,
            batch_size=dataset_options.batch_size, shuffle=dataset_options.shuffle,
            num_epochs=dataset_options.num_epochs, seed=dataset_options.shuffle_seed, report=report,
            passes=training_passes(pass_epochs, recorded_examples(patterns), dataset_options.batch_size)
            if dataset_options.num_epochs is None and dataset_options.shuffle else None,
        )
        if skipped_shards is not None:
            skipped_shards.update(report["skipped_shards"])
        return dataset

    return DataAccessor(tf_dataset_factory, tfxio_data_accessor().record_batch_factory, None)


def worker_drawn_seed():
    """A shuffle seed that the op draws from the OS where it runs, not from TF's global seed.

    The raw op with seeds 0, 0 seeds itself at random; the public random ops would derive their
    seed from the global seed, which a traced dataset function carries to every worker alike.
    """
    import tensorflow as tf

    return tf.raw_ops.RandomUniformInt(shape=tf.constant([], tf.int32), minval=tf.constant(1, tf.int64),
                                       maxval=tf.constant(2**31 - 1, tf.int64), seed=0, seed2=0)


def distinct_worker_shuffles(accessor: DataAccessor) -> DataAccessor:
    """The accessor with each shuffled dataset's seed drawn anew wherever the dataset is made.

    ParameterServerStrategy traces the dataset function once and runs it on every worker, so a
    fixed seed gives every worker the same batches in the same order (2 workers, 100 one-example
    steps over 217 rows: 54-57 distinct examples). Drawn per worker, each has its own order. The
    order is then not reproducible, as the asynchronous updates already are not. The workers run the traced
    dataset without this process's Python, so shards on s3:// are downloaded before it is traced.
    """
    from hpml.components.input_pipeline.read_ahead import local_copies

    def tf_dataset_factory(file_pattern, dataset_options, schema=None):
        if dataset_options.shuffle:
            dataset_options = dataset_options._replace(shuffle_seed=worker_drawn_seed())
        return accessor.tf_dataset_factory(local_copies(file_pattern), dataset_options, schema)

    return accessor._replace(tf_dataset_factory=tf_dataset_factory)


def make_data_accessor(input_pipeline_dir: str | None, skipped_shards: dict | None = None,
                       strategy: str | None = None, epochs: int | None = None,
                       train_steps: int | None = None) -> DataAccessor:
    """The tuned accessor when an InputPipeline artifact is wired in, else TFX's TFXIO one.

    Under parameter_server its shuffled datasets take a seed drawn on each worker.
    """
    if not input_pipeline_dir:
        accessor = tfxio_data_accessor()
    else:
        from hpml.components.input_pipeline import read_spec

        accessor = input_pipeline_data_accessor(read_spec(input_pipeline_dir), skipped_shards, epochs,
                                                training_epochs(epochs, train_steps, strategy))
    return distinct_worker_shuffles(accessor) if strategy == "parameter_server" else accessor


@dataclass
class FnArgs:
    """TFX's FnArgs fields (tfx.components.trainer.fn_args_utils.FnArgs)."""

    working_dir: str
    train_files: list[str]
    eval_files: list[str]
    train_steps: int | None
    eval_steps: int | None
    schema_path: str | None
    transform_graph_path: str | None
    data_accessor: DataAccessor
    serving_model_dir: str
    eval_model_dir: str
    model_run_dir: str
    base_model: str | None = None
    hyperparameters: dict[str, Any] | None = None
    custom_config: dict[str, Any] = field(default_factory=dict)

    # TFX's older names for the same two paths.
    @property
    def schema_file(self) -> str | None:
        return self.schema_path

    @property
    def transform_output(self) -> str | None:
        return self.transform_graph_path
