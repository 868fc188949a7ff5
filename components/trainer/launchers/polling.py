"""Polling a remote job's status: a day-long job must not be abandoned over one failed status read.

An API server that answers 503, or a connection reset during a control-plane upgrade, is retried at the
next poll for as long as the status has been unreadable for less than `MAX_OUTAGE_S`; any other error
(404: the job is gone; 403) ends the wait at once. The allowance is time, not a count of reads: a client
that retries each read itself for minutes (aiplatform: up to 2) would otherwise get several times the
allowance of one that fails fast (kubernetes).
"""
from __future__ import annotations

import logging
import time
from typing import TypeVar
from collections.abc import Callable, Iterator

from hpml.components.errors import HpmlError
from hpml.components.trainer.launchers.stopping import raise_if_stopped

log = logging.getLogger("hpml.launcher")
T = TypeVar("T")

MAX_OUTAGE_S = 300.0


def poll(read: Callable[[], T], *, what: str, timeout_s: float, poll_s: float,
         transient: Callable[[Exception], bool], outage_s: float = MAX_OUTAGE_S) -> Iterator[T]:
    """Yield `read()` every `poll_s` seconds; raise once `timeout_s` has passed, or once the reads have failed
    for longer than `outage_s` (counted from the start of the first failed read). The caller returns when done."""
    deadline = time.monotonic() + timeout_s
    unreadable_since = None
    while time.monotonic() < deadline:
        raise_if_stopped()
        started = time.monotonic()
        try:
            value = read()
        except Exception as err:
            unreadable_since = started if unreadable_since is None else unreadable_since
            down_s = time.monotonic() - unreadable_since
            if not transient(err) or down_s > outage_s:
                raise
            log.warning("%s: reading its status failed (%s: %s), unreadable for %.0fs; retrying at the next poll "
                        "(the wait ends after %.0fs)", what, type(err).__name__,
                        str(err).splitlines()[0] if str(err) else "", down_s, outage_s)
        else:
            unreadable_since = None
            yield value
        time.sleep(poll_s)
    raise HpmlError(f"{what} did not finish within {timeout_s:.0f}s")
