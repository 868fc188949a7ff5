"""Keras callbacks for run_fns, one job per module; `standard_callbacks` picks the set a strategy supports."""
from hpml.components.trainer.callbacks.backup_and_restore import BackupAndRestore
from hpml.components.trainer.callbacks.coordinator_validation import CoordinatorValidation
from hpml.components.trainer.callbacks.divergence import StopOnDivergence, StopOnDivergenceEveryStep
from hpml.components.trainer.callbacks.epoch_metrics import METRICS_FILE, EpochMetricsLogger, read_metrics
from hpml.components.trainer.callbacks.fit_window import FitWindow
from hpml.components.trainer.callbacks.serving_export import ServingExport
from hpml.components.trainer.callbacks.standard import epoch_size, standard_callbacks
from hpml.components.trainer.callbacks.tensorboard import TensorBoard
from hpml.components.trainer.callbacks.terminal_progress import (TerminalProgress, close_terminal_progress,
                                                                 progress_mode)
from hpml.components.trainer.callbacks.validation_confusion import ValidationConfusion

__all__ = ["BackupAndRestore", "CoordinatorValidation", "EpochMetricsLogger", "FitWindow", "METRICS_FILE",
           "ServingExport", "StopOnDivergence", "StopOnDivergenceEveryStep", "TensorBoard", "TerminalProgress",
           "close_terminal_progress", "epoch_size", "progress_mode", "read_metrics", "standard_callbacks",
           "ValidationConfusion"]
