"""Keras callbacks shared by run_fns: per-epoch metrics with throughput, as JSON lines and log lines."""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time

import tf_keras

from hpml.components import files
from hpml.components.trainer.progress_reporter import ProgressReporter
from hpml.components.trainer.progress_state import progress_dir

log = logging.getLogger("hpml.trainer")

METRICS_FILE = "metrics.jsonl"


class EpochMetricsLogger(tf_keras.callbacks.Callback):
    """Writes one JSON line and one plain log line per epoch: loss, metrics, examples/s, step time, ETA.

    Throughput and step time are of training alone: validation is timed apart as val_seconds and left
    out, whether it is fit's own (from on_test_begin to on_test_end) or CoordinatorValidation's (which
    puts its time in the logs; the end-of-epoch callbacks before this one, such as a backup, then count
    as training). `seconds` is the whole epoch, callbacks included. Examples are steps x batch_size, at most
    `examples_per_epoch` where the run_fn knows it: an epoch's last batch may be short.
    """

    def __init__(self, out_dir: str, batch_size: int, total_epochs: int, examples_per_epoch: int | None = None):
        super().__init__()
        self._path = os.path.join(out_dir, METRICS_FILE)
        self._batch_size = batch_size
        self._examples_per_epoch = examples_per_epoch
        self._total = total_epochs
        self._started = None

    # Steps come from the optimizer's counter, not batch hooks, which ParameterServerStrategy forbids.
    def _iterations(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()
        self._started = self._started or self._epoch_start
        self._first_step = self._iterations()
        self._validation = None  # fit's validation: [start, end]

    def on_test_begin(self, logs=None):  # the epoch's training is over
        if self._validation is None:
            self._validation = [time.perf_counter()] * 2

    def on_test_end(self, logs=None):
        if self._validation is not None:
            self._validation[1] = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        now = time.perf_counter()
        seconds = now - self._epoch_start
        steps = max(self._iterations() - self._first_step, 1)
        record = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float)) or hasattr(v, "__float__")}
        if self._validation is not None:
            record["val_seconds"] = self._validation[1] - self._validation[0]
            train_seconds = self._validation[0] - self._epoch_start
        else:
            train_seconds = seconds - record.get("val_seconds", 0.0)
        record.update(
            epoch=epoch + 1,
            seconds=seconds,
            step_time_ms=1000.0 * train_seconds / steps,
            examples_per_sec=self._examples(steps) / train_seconds if train_seconds > 0 else math.nan,
        )
        with files.open_file(self._path, "a") as handle:  # an object store's file is written again whole
            handle.write(json.dumps(record) + "\n")
        eta = (time.perf_counter() - self._started) / (epoch + 1) * (self._total - epoch - 1)
        shown = " ".join(f"{k}={_shown(k, v)}" for k, v in sorted(record.items())
                         if k not in ("epoch", "seconds", "val_seconds"))
        log.info("epoch %d/%d %s eta=%.1fs", epoch + 1, self._total, shown, eta)


    def _examples(self, steps: int) -> int:
        examples = steps * self._batch_size
        return examples if self._examples_per_epoch is None else min(examples, self._examples_per_epoch)


def _shown(name: str, value: float) -> str:
    """A metric as the epoch line shows it: whole examples per second, step time to 10 µs, and losses and
    metrics to 4 decimals, or in 4 significant digits under 0.001, where 4 decimals keep one digit or none."""
    if name == "examples_per_sec":
        return f"{value:.0f}"
    if name == "step_time_ms":
        return f"{value:.2f}"
    return f"{value:.3e}" if 0 < abs(value) < 1e-3 else f"{value:.4f}"


class CoordinatorValidation(tf_keras.callbacks.Callback):
    """Exact validation under ParameterServerStrategy, run by the coordinator after each epoch.

    fit's own validation there is either inexact (each worker reads its own copy of the eval data, so
    some examples count twice and others never) or, with exact evaluation, needs several eval files
    per worker. Instead the weights are copied into `local_model` (the same architecture, compiled
    outside the strategy) and it scores the whole `dataset`; the results join the epoch's logs as
    val_*, so this callback must come before any that reads them. The evaluation runs on its own
    thread: fit's strategy scope is thread-local, and inside it the local model would hand its
    evaluation to the workers as well.
    """

    def __init__(self, local_model, dataset, steps: int | None = None):
        super().__init__()
        self._local, self._dataset, self._steps = local_model, dataset, steps

    def on_epoch_end(self, epoch, logs=None):
        from concurrent.futures import ThreadPoolExecutor

        started = time.perf_counter()
        self._local.set_weights([v.numpy() for v in self.model.weights])
        with ThreadPoolExecutor(1, thread_name_prefix="coordinator-validation") as pool:
            results = pool.submit(self._local.evaluate, self._dataset, steps=self._steps, verbose=0,
                                  return_dict=True).result()
        if logs is not None:
            logs.update({f"val_{name}": float(value) for name, value in results.items()})
            logs["val_seconds"] = time.perf_counter() - started  # EpochMetricsLogger leaves it out of throughput


class StopOnDivergence(tf_keras.callbacks.Callback):
    """Raises TrainingDiverged at the end of the first epoch whose loss or validation loss is NaN or
    infinite. tf_keras's TerminateOnNaN only ends fit, and the run would then publish the diverged model
    as if it had trained. Put it first, so that no backup is taken once the loss is seen to be non-finite.
    """

    def __init__(self, total_epochs: int):
        super().__init__()
        self._total = total_epochs
        self._epoch = 0
        self._last_loss = None  # the last finished epoch's loss, for the message

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self._check(logs, f"at the end of epoch {epoch + 1}/{self._total}", ("loss", "val_loss"))
        if logs and "loss" in logs:
            self._last_loss = float(logs["loss"])

    def _check(self, logs, where: str, names) -> None:
        from hpml.components.errors import TrainingDiverged

        for name in names:
            value = (logs or {}).get(name)
            if value is None or math.isfinite(float(value)):
                continue
            before = "" if self._last_loss is None else \
                f" (epoch {self._epoch}/{self._total} ended at loss {self._last_loss:.4g})"
            if name == "val_loss":
                hint = ("the training loss is finite: look for extreme values in the eval split, which the "
                        "model meets only in validation")
            else:
                hint = ("lower the learning rate, or look for extreme values in the data: one far outside the "
                        "rest makes its column's z-scores huge")
            raise TrainingDiverged(f"training diverged: {name} is {float(value)} {where}{before}",
                                   hint=hint + "; the model is not published")


class StopOnDivergenceEveryStep(StopOnDivergence):
    """StopOnDivergence that also reads the running loss after every step, so a long epoch is not spent on
    diverged weights. Batch hooks make fit read each step's logs on the host, and ParameterServerStrategy
    allows none: use it only where a batch-level callback runs anyway (the progress display)."""

    def on_train_batch_end(self, batch, logs=None):
        self._check(logs, f"after step {batch + 1} of epoch {self._epoch + 1}/{self._total}", ("loss",))


def read_metrics(model_run_dir: str) -> list[dict]:
    path = os.path.join(model_run_dir, METRICS_FILE)
    if not files.exists(path):
        return []
    rows = [json.loads(line) for line in files.read_text(path).splitlines() if line.strip()]
    # After a restart from a mid-epoch backup an epoch can be logged twice: keep the latest.
    latest = {int(row["epoch"]): row for row in rows}
    return [latest[epoch] for epoch in sorted(latest)]


def progress_mode(stream=None) -> str:
    """'bar' on an interactive terminal, 'plain' in logs and CI; HPML_PROGRESS=bar|plain overrides."""
    forced = os.environ.get("HPML_PROGRESS", "").lower()
    if forced in ("bar", "plain"):
        return forced
    stream = stream or sys.stderr
    return "bar" if hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("CI") else "plain"


class TerminalProgress(tf_keras.callbacks.Callback):
    """A rich progress bar over all training steps, with rate and ETA, for people at a terminal.

    Logs and CI get the plain per-epoch lines of EpochMetricsLogger instead. While the bar is live, log
    handlers that write to the terminal write through rich, which prints their lines above the bar rather
    than letting its next redraw erase them.
    """

    def __init__(self, epochs: int, console=None):
        super().__init__()
        self._epochs = epochs
        self._console = console
        self._progress = None
        self._rerouted = []

    def on_train_begin(self, logs=None):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        steps = (self.params or {}).get("steps") or 0
        self._progress = Progress(TextColumn("[bold]training[/] {task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TextColumn("steps"), TimeRemainingColumn(),
                                  console=self._console, transient=False)
        before = (sys.stderr, sys.stdout)
        self._progress.start()  # on a terminal, swaps sys.stderr and sys.stdout for rich's proxies
        self._rerouted = _reroute_log_handlers({id(old): new for old, new in zip(before, (sys.stderr, sys.stdout))
                                                if new is not old})
        _LIVE.add(self)
        self._task = self._progress.add_task(f"epoch 1/{self._epochs}", total=steps * self._epochs or None)

    def on_epoch_begin(self, epoch, logs=None):
        self._progress.update(self._task, description=f"epoch {epoch + 1}/{self._epochs}")

    def on_train_batch_end(self, batch, logs=None):
        self._progress.advance(self._task)

    def on_epoch_end(self, epoch, logs=None):
        # The epoch's full line is logged above the bar; the bar keeps to what fits beside it.
        loss = (logs or {}).get("loss")
        shown = f" loss={_shown('loss', float(loss))}" if loss is not None else ""
        self._progress.update(self._task, description=f"epoch {epoch + 1}/{self._epochs}{shown}")

    def on_train_end(self, logs=None):
        self.close()

    def close(self) -> None:
        """Stop the bar and give the log handlers their streams back; a second call does nothing."""
        if self._progress is None:
            return
        self._progress.stop()
        for handler, stream in self._rerouted:
            handler.setStream(stream)
        self._rerouted, self._progress = [], None
        _LIVE.discard(self)


# Bars started and not yet closed: a fit that raises calls no further callback, not even on_train_end.
_LIVE: set[TerminalProgress] = set()


def close_terminal_progress() -> None:
    """Close any bar that a failed fit left live. Left alone, it keeps redrawing itself among the error's
    lines, and the terminal's cursor stays hidden after the process ends."""
    for bar in list(_LIVE):
        bar.close()


def _reroute_log_handlers(proxies: dict) -> list:
    """Points every logging StreamHandler that writes to a stream in `proxies` (by id) at its proxy;
    returns [(handler, its stream before)] to put back."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    rerouted = []
    for handler in {h for lg in loggers for h in lg.handlers}:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            proxy = proxies.get(id(handler.stream))
            if proxy is not None:
                rerouted.append((handler, handler.setStream(proxy)))
    return rerouted


class BackupAndRestore(tf_keras.callbacks.BackupAndRestore):
    """tf_keras's BackupAndRestore, allowed under CentralStorage too.

    tf_keras checks the strategy against a fixed list that leaves CentralStorage out, but its
    checkpoint (one worker, variables on the host) saves and restores like Mirrored's: a run
    stopped after a backup and started again ends with the uninterrupted run's weights (tested).
    """

    def __init__(self, *args, **kwargs):
        import tensorflow as tf

        super().__init__(*args, **kwargs)
        self._supported_strategies = (*self._supported_strategies,
                                      tf.distribute.experimental.CentralStorageStrategy)
        self._call_begin = 0

    def on_train_batch_begin(self, batch, logs=None):
        self._call_begin = batch
        super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        # tf_keras counts calls toward save_freq; with steps_per_execution > 1 a call runs steps `_call_begin` to
        # `batch`, so the steps beyond the first are counted here: save_freq stays in steps.
        steps = batch - self._call_begin + 1
        if self.save_freq not in (False, None, "epoch") and steps > 1:
            self._batches_count += steps - 1
        super().on_train_batch_end(batch, logs)


class TensorBoard(tf_keras.callbacks.TensorBoard):
    """tf_keras's TensorBoard without its per-step work where it writes only per epoch.

    It says it needs no batch hooks then, but once another callback has them fit calls its hooks too, and
    each step they call tf.summary.scalar for every log: about 0.25 ms of no-op summaries per step, a fifth
    of a small model's step (benchmarks/callbacks.py). It also wrote the train graph inside the first step's
    hook; that moves to the end of the first epoch, where it is timed as neither training nor validation.
    """

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._graph_due = False  # set once a step's hook runs, where stock TensorBoard writes the graph

    def on_train_batch_begin(self, batch, logs=None):
        if self._implements_train_batch_hooks():
            super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self._implements_train_batch_hooks():
            super().on_train_batch_end(batch, logs)
        else:
            self._graph_due = self._should_write_train_graph

    def on_epoch_end(self, epoch, logs=None):
        if self._graph_due and self._should_write_train_graph:
            self._write_keras_model_train_graph()
            self._should_write_train_graph = False
        super().on_epoch_end(epoch, logs)


def epoch_size(dataset) -> tuple[int, int]:
    """(batches, examples) in one pass over a batched dataset: steps_per_epoch for fit, and standard_callbacks'
    examples_per_epoch, as the last batch may be short."""
    import tensorflow as tf

    def count(totals, batch):
        return totals[0] + 1, totals[1] + tf.shape(tf.nest.flatten(batch)[0])[0]

    batches, examples = dataset.reduce((0, 0), count)
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
    from hpml.components.trainer.resume import backup_dir
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
    else:
        log.warning("BackupAndRestore does not support strategy %s; this run has no backups", strategy_name)
    callbacks += [
        TensorBoard(fn_args.model_run_dir),
        EpochMetricsLogger(fn_args.model_run_dir, batch_size, epochs, examples_per_epoch),
    ]
    # Under parameter servers the coordinator reschedules a failed worker's steps itself, and
    # batch-level callbacks are not allowed.
    if every_step:
        if fn_args.working_dir:
            callbacks.append(ProgressReporter(progress_dir(fn_args.working_dir)))
        if progress_mode() == "bar":
            callbacks.append(TerminalProgress(epochs))
    return callbacks
