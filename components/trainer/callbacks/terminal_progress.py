"""A progress bar over all training steps for people at a terminal."""
from __future__ import annotations

import logging
import os
import sys

import tf_keras

from hpml.components.trainer.callbacks.epoch_metrics import shown


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
        self._rerouted: list = []

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
        text = f" loss={shown('loss', float(loss))}" if loss is not None else ""
        self._progress.update(self._task, description=f"epoch {epoch + 1}/{self._epochs}{text}")

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
