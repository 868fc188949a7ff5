"""Build a tf.distribute strategy by name, on this process's devices and cluster.

`register` is the seam for strategies that live elsewhere (the GPipe trainer).
"""
from __future__ import annotations

from collections.abc import Callable

from hpml.components.errors import SpecError

STRATEGIES = (
    "auto", "one_device", "mirrored", "central_storage",
    "multi_worker_mirrored", "parameter_server", "tpu", "gpipe",
)
# Strategies that span several worker processes: the only ones a multi-worker or remote job can run.
CLUSTER_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
# Strategies our BackupAndRestore (callbacks.py) accepts: tf_keras's list plus CentralStorage. tf_keras
# refuses OneDevice, which is why one_device runs under the default strategy.
BACKUP_CAPABLE = ("one_device", "mirrored", "central_storage", "multi_worker_mirrored", "parameter_server", "tpu",
                  "gpipe")

_EXTRA_BUILDERS: dict[str, Callable] = {}


def register(name: str, builder: Callable) -> None:
    """Plug in a strategy builder, e.g. the GPipe trainer's."""
    if name not in STRATEGIES:
        raise SpecError(f"unknown strategy {name!r}")
    _EXTRA_BUILDERS[name] = builder


def local_devices() -> list[str]:
    """GPUs if there are any, else the logical CPUs (more than one only when configured so)."""
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]


_CLUSTER_STRATEGY: dict[str, object] = {}


def _cpu_reduction(tf):
    """On CPU devices, reduce through one device instead of collectives. Collective all-reduce
    gains nothing there, and two MirroredStrategy instances with different device counts in one
    process collide on collective group keys (TF 2.21). GPUs keep TF's default (NCCL)."""
    return None if tf.config.list_logical_devices("GPU") else tf.distribute.ReductionToOneDevice()


def make_strategy(name: str):
    """The strategy for `name`; `auto` must have been resolved by a Plan before this.

    Cluster strategies are made once per process (collective ops must be configured before
    any TF op runs), so the worker entry point creates them first and run_fn gets the same one.
    """
    import tensorflow as tf

    if name in _CLUSTER_STRATEGY:
        return _CLUSTER_STRATEGY[name]
    if name in ("multi_worker_mirrored", "parameter_server"):
        _CLUSTER_STRATEGY[name] = _make(name, tf)
        return _CLUSTER_STRATEGY[name]
    return _make(name, tf)


def _make(name: str, tf):
    if name in _EXTRA_BUILDERS:
        return _EXTRA_BUILDERS[name]()
    if name in ("one_device", "gpipe"):
        # gpipe is model parallelism inside one process: the PipelineModel places its stages
        # itself, so the surrounding strategy is the default one.
        # tf_keras's BackupAndRestore refuses OneDeviceStrategy, and backups are always on.
        # The default strategy places everything on one device (GPU:0 when there is one),
        # which is what OneDeviceStrategy would do here.
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(local_devices(), cross_device_ops=_cpu_reduction(tf))
    if name == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy(local_devices(), parameter_device="/cpu:0")
    if name == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "parameter_server":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.experimental.ParameterServerStrategy(resolver)
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise SpecError(f"strategy {name!r} is not available", hint=f"choose one of {', '.join(STRATEGIES)}")


def is_chief() -> bool:
    """True in a single process, and in the chief (or worker 0 without a chief) of a cluster."""
    import json
    import os

    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    if not task:
        return True
    has_chief = bool(config.get("cluster", {}).get("chief"))
    return task.get("type") == "chief" or (not has_chief and task.get("type") == "worker" and task.get("index") == 0)
