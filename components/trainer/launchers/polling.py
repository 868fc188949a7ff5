"""Polling a remote job's status: a day-long job must not be abandoned over one failed status read.

An API server that answers 503 once, or a connection reset during a control-plane upgrade, is retried
at the next poll, up to `MAX_READ_ERRORS` reads in a row; any other error (404: the job is gone; 403)
ends the wait at once.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Iterator, TypeVar

from components.errors import HpmlError

log = logging.getLogger("hpml.launcher")
T = TypeVar("T")

MAX_READ_ERRORS = 5


def poll(read: Callable[[], T], *, what: str, timeout_s: float, poll_s: float,
         transient: Callable[[Exception], bool]) -> Iterator[T]:
    """Yield `read()` every `poll_s` seconds; raise once `timeout_s` has passed. The caller returns when done."""
    deadline = time.monotonic() + timeout_s
    errors = 0
    while time.monotonic() < deadline:
        try:
            value = read()
        except Exception as err:
            errors += 1
            if not transient(err) or errors > MAX_READ_ERRORS:
                raise
            log.warning("%s: reading its status failed (%s: %s); retrying at the next poll (%d/%d)",
                        what, type(err).__name__, str(err).splitlines()[0] if str(err) else "", errors,
                        MAX_READ_ERRORS)
        else:
            errors = 0
            yield value
        time.sleep(poll_s)
    raise HpmlError(f"{what} did not finish within {timeout_s:.0f}s")
