"""SIGTERM as an exception while a launcher waits on its job: real signals sent to this process."""
import signal

import pytest

from components.trainer.launchers.stopping import Stopped, sigterm_raises


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
