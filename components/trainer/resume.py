"""Where a resumed run picks its training data up: after the batches its newest backup already trained on.

tf_keras's BackupAndRestore puts back the weights, the optimizer and the epoch and step counters, but
`fit` then reads the training dataset from its first batch again, so a resumed run trains on other
batches than an uninterrupted one and ends with other weights. The backup also holds the model's
train counter (steps run, over all epochs): an endless training stream advanced by that many batches
is exactly where the uninterrupted run was. Under MultiWorkerMirrored every worker reads the same
global batches (DATA auto-sharding splits each one), so the same count serves every worker.
"""
from __future__ import annotations

import logging
import os

from hpml.components.errors import SpecError

log = logging.getLogger("hpml.trainer")

BACKUP_DIR = "backup"  # under fn_args.working_dir
CHIEF_BACKUP = "chief"  # where tf_keras's BackupAndRestore keeps the backup every worker restores
_TRAIN_COUNTER = "train_counter/.ATTRIBUTES/VARIABLE_VALUE"


def backup_dir(working_dir: str) -> str:
    """Where TensorFlow writes and reads the backups: on local disk where the working dir is on s3://
    (`backup_mirror` keeps the store's copy)."""
    from hpml.components.trainer.backup_mirror import local_working_dir

    return os.path.join(local_working_dir(working_dir), BACKUP_DIR)


def backed_up_steps(directory: str) -> int:
    """Training steps run when the newest backup under `directory` was written; 0 where there is none.

    That backup is the one BackupAndRestore restores: a save cut short never becomes the newest,
    as the checkpoint index names a checkpoint only once it is whole.
    """
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(os.path.join(directory, CHIEF_BACKUP))
    if not latest:
        return 0
    reader = tf.train.load_checkpoint(latest)
    if not reader.has_tensor(_TRAIN_COUNTER):
        raise SpecError(f"backup {latest} holds no train counter, so the step to resume the data at is unknown",
                        hint="it was not written by tf_keras's BackupAndRestore; remove the working dir to start over")
    return int(reader.get_tensor(_TRAIN_COUNTER))


def resume_training_data(dataset, fn_args):
    """The endless training `dataset`, started after the batches the newest backup trained on.

    Call it on the dataset passed to `fit` (built with `num_epochs=None` and `steps_per_epoch` set, so
    that one iterator serves every epoch). Without a backup, or a working dir, it is `dataset` itself.
    """
    if not fn_args.working_dir:
        return dataset
    steps = backed_up_steps(backup_dir(fn_args.working_dir))
    if not steps:
        return dataset
    log.info("resuming from the backup after %d training steps: the training data starts at batch %d", steps,
             steps + 1)
    return dataset.skip(steps)
