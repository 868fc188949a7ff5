"""SIGTERM as an exception while a launcher waits on its job: real signals sent to this process."""
import gc
import os
import signal
import sys
import time

import pytest

from hpml.components.trainer.launchers.polling import poll
from hpml.components.trainer.launchers.stopping import Stopped, raise_if_stopped, sigterm_raises


@pytest.fixture
def restore_sigterm():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def test_the_first_sigterm_raises_after_the_handler_already_installed(restore_sigterm):
    seen = []
    airflow_like = lambda signum, frame: seen.append(signum)  # noqa: E731 - calls on_kill() and returns
    signal.signal(signal.SIGTERM, airflow_like)
    cleaned_up = []
    with pytest.raises(Stopped, match="the job was stopped by SIGTERM"):
        with sigterm_raises("the job"):
            try:
                signal.raise_signal(signal.SIGTERM)
                pytest.fail("SIGTERM did not interrupt the wait")
            finally:
                signal.raise_signal(signal.SIGTERM)  # a second one must not cut the clean-up short
                cleaned_up.append(True)
    assert seen == [signal.SIGTERM, signal.SIGTERM], "the earlier handler (Airflow's on_kill) still runs"
    assert cleaned_up == [True]
    assert signal.getsignal(signal.SIGTERM) is airflow_like, "the earlier handler is back afterwards"


def test_a_process_started_with_sigterm_ignored_keeps_ignoring_it(restore_sigterm):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with sigterm_raises("the job"):
        signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_a_sigterm_whose_raise_python_drops_still_ends_the_wait(restore_sigterm, monkeypatch):
    """Python runs the handler wherever the main thread is. Inside a garbage-collection callback (here a __del__;
    in CI it was importlib's module-lock weakref callback) the raise is reported as unraisable and dropped: the
    Trainer went on polling its TFJob after the SIGTERM, and the job would have run on after SIGKILL."""
    class DiesDuringSigterm:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs here, and its Stopped dies with this __del__

    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(unraisable.exc_value))
    with sigterm_raises("the job"):
        DiesDuringSigterm()
        gc.collect()
        assert [type(e) for e in dropped] == [Stopped], "the raise was meant to be dropped"
        started = time.monotonic()
        with pytest.raises(Stopped, match="the job was stopped by SIGTERM"):
            for _ in poll(lambda: "RUNNING", what="job", timeout_s=10, poll_s=0.01, transient=lambda e: False):
                pass
        assert time.monotonic() - started < 1
    raise_if_stopped()  # the request ends with the context: a later wait is not stopped by it
