"""The callbacks every run_fn wants, chosen for its strategy, and the size of an epoch."""
from __future__ import annotations

import logging

from hpml.components.trainer.callbacks.backup_and_restore import BackupAndRestore
from hpml.components.trainer.callbacks.divergence import StopOnDivergence, StopOnDivergenceEveryStep
from hpml.components.trainer.callbacks.epoch_metrics import EpochMetricsLogger
from hpml.components.trainer.callbacks.fit_window import FitWindow
from hpml.components.trainer.callbacks.tensorboard import TensorBoard
from hpml.components.trainer.callbacks.terminal_progress import TerminalProgress, progress_mode
from hpml.components.trainer.progress_reporter import EpochProgressReporter, ProgressReporter
from hpml.components.trainer.progress_state import progress_dir

log = logging.getLogger("hpml.trainer")


def epoch_size(dataset, files: list[str] | None = None, batch_size: int | None = None) -> tuple[int, int]:
    """(batches, examples) in one pass over a batched dataset: steps_per_epoch for fit, and standard_callbacks'
    examples_per_epoch, as the last batch may be short. Given the dataset's file patterns (fn_args.train_files) and
    its batch size, the count that ExampleGen or Transform recorded answers at once; otherwise a pass counts. A
    dataset that drops or adds examples must not pass `files`. `dataset` may be a function that builds it, called
    only where a pass must count: building a tuned pipeline traces its parsing, a few tenths of a second."""
    import math

    import tensorflow as tf

    from hpml.components.artifacts import recorded_examples

    recorded = recorded_examples(files) if files and batch_size else None
    if recorded is not None and batch_size:
        return math.ceil(recorded / batch_size), recorded

    def count(totals, batch):
        return totals[0] + 1, totals[1] + tf.shape(tf.nest.flatten(batch)[0])[0]

    batches, examples = (dataset() if callable(dataset) else dataset).reduce((0, 0), count)
    return int(batches), int(examples)


def _warn_of_one_short_batch(batch_size: int, examples_per_epoch: int | None) -> None:
    """A batch_size above the training split trains without complaint, one short step per epoch: say so, as
    the usual cause is a batch_size meant for a larger data set."""
    if examples_per_epoch is not None and 0 < examples_per_epoch < batch_size:
        log.warning("batch_size %d is larger than the %d training examples: each epoch is one step of %d "
                    "examples; lower batch_size for more than one step per epoch", batch_size,
                    examples_per_epoch, examples_per_epoch)


def standard_callbacks(fn_args, strategy_name: str, batch_size: int, epochs: int,
                       save_freq: int | str = "epoch", examples_per_epoch: int | None = None) -> list:
    """A divergence check, BackupAndRestore (under every strategy that supports it), TensorBoard, per-epoch
    metrics, progress. `examples_per_epoch`, where known, keeps a short last batch from inflating examples/s."""
    from hpml.components.s3_files import is_s3
    from hpml.components.trainer.callbacks.backup_upload import BackupUpload
    from hpml.components.trainer.resume import BACKUP_DIR, CHIEF_BACKUP, backup_dir
    from hpml.components.trainer.strategies import BACKUP_CAPABLE, is_chief

    _warn_of_one_short_batch(batch_size, examples_per_epoch)
    every_step = is_chief() and strategy_name != "parameter_server"  # where batch-level callbacks run
    # First, so that no later callback (the backup above all) runs once the loss is seen to be non-finite.
    callbacks = [StopOnDivergenceEveryStep(epochs) if every_step else StopOnDivergence(epochs)]
    if strategy_name == "parameter_server" and save_freq != "epoch":
        # Under parameter servers tf_keras allows no batch-level callback, which a step-based
        # BackupAndRestore is; the coordinator reschedules a failed worker's steps itself.
        log.warning("parameter_server backs up once per epoch, not every %s steps", save_freq)
        save_freq = "epoch"
    if not fn_args.working_dir:
        # TFX's own Trainer gives run_fn no working dir; hpml's gives a run-scoped one that survives a retry.
        log.info("fn_args.working_dir is not set (TFX's Trainer leaves it None): this run has no backups")
    elif strategy_name in BACKUP_CAPABLE:
        # The backup outlives fit: the Trainer removes the working dir once the model is published. A process
        # killed between the end of fit and the publish then resumes with nothing left to train; deleted at the
        # end of fit, as tf_keras does by default, the retry trained every epoch again from scratch.
        callbacks.append(BackupAndRestore(backup_dir(fn_args.working_dir), save_freq=save_freq,
                                          delete_checkpoint=False))
        if is_s3(fn_args.working_dir) and is_chief():  # the store keeps each backup for a retry elsewhere
            callbacks.append(BackupUpload(fn_args.working_dir, BACKUP_DIR, CHIEF_BACKUP))
    else:
        log.warning("BackupAndRestore does not support strategy %s; this run has no backups", strategy_name)
    callbacks += [
        TensorBoard(fn_args.model_run_dir),
        EpochMetricsLogger(fn_args.model_run_dir, batch_size, epochs, examples_per_epoch),
        FitWindow(fn_args.model_run_dir),
    ]
    # Under parameter servers the coordinator reschedules a failed worker's steps itself, and batch-level
    # callbacks are not allowed: its progress is published as each epoch begins and ends.
    if every_step:
        if fn_args.working_dir:
            callbacks.append(ProgressReporter(progress_dir(fn_args.working_dir)))
        if progress_mode() == "bar":
            callbacks.append(TerminalProgress(epochs))
    elif is_chief() and fn_args.working_dir:
        callbacks.append(EpochProgressReporter(progress_dir(fn_args.working_dir)))
    return callbacks
