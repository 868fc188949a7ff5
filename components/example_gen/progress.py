"""ExampleGen's log and counter of the bad rows it skips."""
from __future__ import annotations

import logging

import apache_beam as beam


NAMESPACE = "hpml.example_gen"
log = logging.getLogger(NAMESPACE)

# How many skipped rows each reader names in the log; the rest are counted only.
LOGGED_BAD_ROWS = 5


class SkippedRows:
    """Counts the rows skip_bad_rows drops, and logs the first LOGGED_BAD_ROWS with where and why: a count
    alone leaves the user to turn skipping off again to find them."""

    def __init__(self):
        self._counter = beam.metrics.Metrics.counter(NAMESPACE, "bad_rows")
        self._logged = 0

    def skip(self, where: str, problem: str) -> None:
        self._counter.inc()
        if self._logged < LOGGED_BAD_ROWS:
            self._logged += 1
            log.warning("skipped bad row %s: %s", where, problem)
