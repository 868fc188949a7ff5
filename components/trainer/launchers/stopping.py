"""How a launcher and its processes stop together, however the launcher is stopped.

Python's default SIGTERM action ends the process at once, without running `finally` blocks, and
Airflow 3's task runner installs a SIGTERM handler that only calls the operator's `on_kill()` and
returns, then sends SIGKILL 5 s later. Either way a launcher would leave its workers (or its cluster
job) running. While `sigterm_raises()` is active, the first SIGTERM raises `Stopped` instead, so the
launcher's `finally` takes its job down. Against SIGKILL, which no handler sees, each local worker
calls `die_with_launcher()`: the kernel kills it when the launcher goes.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import TypeVar
from collections.abc import Callable, Iterator

from hpml.components.errors import HpmlError

log = logging.getLogger("hpml.launcher")
T = TypeVar("T")


# Set by the local launcher in each worker's environment: the pid the worker must not outlive.
LAUNCHER_PID_ENV = "HPML_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Stopped(HpmlError):
    """The launcher was told to stop (SIGTERM) while its job ran."""


# The Stopped that a SIGTERM under sigterm_raises() asked for. Python runs a signal handler wherever the main
# thread happens to be, which may be a garbage-collection callback (a weakref callback, a __del__) whose
# exceptions it prints and drops: waiting loops call raise_if_stopped() so such a SIGTERM still ends them.
_requested: Stopped | None = None


def raise_if_stopped() -> None:
    """Raise the Stopped a SIGTERM asked for; a no-op when none came."""
    if _requested is not None:
        raise _requested


@contextmanager
def sigterm_raises(what: str) -> Iterator[None]:
    """In the main thread, the first SIGTERM raises `Stopped` there; a handler already installed (Airflow's)
    runs first, and later SIGTERMs only reach that handler so the clean-up is not cut short.

    A process that was started with SIGTERM ignored keeps ignoring it. Elsewhere than the main thread
    Python cannot handle signals, so this does nothing there.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        yield
        return
    global _requested

    def on_sigterm(signum, frame):
        global _requested
        if callable(previous):
            previous(signum, frame)
        if _requested is None:
            _requested = Stopped(f"{what} was stopped by SIGTERM",
                                 hint="what it started was stopped with it; a retry of this task resumes from the "
                                      "last backup")
            raise _requested

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        _requested = None


def die_with_launcher() -> None:
    """Ask Linux to SIGKILL this process when the launcher named in HPML_LAUNCHER_PID dies, and exit now if it
    is already gone. A no-op without that variable (remote workers) or off Linux.

    The kernel sends the signal when the thread that started this process exits; the local launcher
    starts every worker from the thread that runs it, and stops them all before it returns.
    """
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(launcher):  # it died before the request above: nothing will signal us now
        sys.stderr.write(f"the launcher (pid {launcher}) is gone; this worker exits\n")
        os._exit(1)


def wait_or_stop_job(job: str, wait: Callable[[], T], stop_job: Callable[[], None],
                     job_ended: type[BaseException], submit: Callable[[], object] | None = None,
                     refused: Callable[[BaseException], bool] = lambda err: False) -> T:
    """Wait for a remote job with SIGTERM raising. When the wait ends before the job does (a timeout,
    SIGTERM, Ctrl-C, an API error) `stop_job` runs before the error goes on, so the job cannot run on
    unwatched; `job_ended` (the job's own failure) leaves the job as it is, for its logs.

    `submit`, when given, is called first under the same watch: a SIGTERM, Ctrl-C or lost answer that cuts
    a submission short stops the job too, as the request may have created it. Only a submission the API
    `refused` (its answer said no) stops nothing: no job of ours exists."""
    with sigterm_raises(f"the Trainer waiting on {job}"):
        submitted = submit is None
        try:
            if submit is not None:
                submit()
                submitted = True
            return wait()
        except job_ended:
            raise
        except BaseException as err:
            if not submitted and refused(err):
                raise
            log.warning("stopping %s: the wait for it ended first (%s)", job, type(err).__name__)
            try:
                stop_job()
            except Exception:
                log.exception("could not stop %s: stop it by hand", job)
            raise
