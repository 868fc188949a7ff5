"""Progress lines of a long stage in a component's log: how far it is, its rate, and its share of the whole."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

# Seconds between two progress lines of one stage; a stage done sooner logs none.
PROGRESS_EVERY_S = 15.0


class Progress:
    """Logs how far a long stage of a component is, at most every PROGRESS_EVERY_S: what
    it has done so far, its rate and, where `share` can tell, the share of the whole. A large input otherwise runs
    for minutes with no line in the task log. Called once a chunk of rows, so a look at the clock costs nothing."""

    def __init__(self, what: str, unit: str, share: Callable[[], float] | None = None, *,
                 component: str, logger: logging.Logger):
        self._what, self._unit, self._share = what, unit, share
        self._component, self._log = component, logger
        self._start = self._last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        share = f" ({100 * min(self._share(), 1.0):.0f}%)" if self._share else ""
        seconds = max(now - self._start, 1e-9)
        self._log.info("%s: %s: %s %s%s in %.0f s, %s %s/s", self._component, self._what, f"{done:,}", self._unit,
                       share, seconds, f"{done / seconds:,.0f}", self._unit)
