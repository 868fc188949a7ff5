"""Build a tf.distribute strategy by name."""
from __future__ import annotations

from components.errors import SpecError

STRATEGIES = (
    "auto", "one_device", "mirrored", "central_storage",
    "multi_worker_mirrored", "parameter_server", "tpu", "gpipe",
)


def make_strategy(name: str):
    """The strategy for `name` on this process's devices."""
    import tensorflow as tf

    if name in ("auto", "one_device"):
        # tf_keras's BackupAndRestore refuses OneDeviceStrategy, and backups are always on.
        # The default strategy places everything on one device (GPU:0 when there is one),
        # which is what OneDeviceStrategy would do here.
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "central_storage":
        return tf.distribute.experimental.CentralStorageStrategy()
    if name == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise SpecError(
        f"strategy {name!r} is not available in a single Trainer process",
        hint=f"choose one of {', '.join(STRATEGIES)}",
    )
