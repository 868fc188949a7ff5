"""An exclusive lock between processes on this machine, for the one-time set-up of a shared
SQLite store: two runs started at once on a fresh HPML_HOME both tried to create the same tables."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from collections.abc import Iterator


@contextlib.contextmanager
def held(lock_file: Path) -> Iterator[None]:
    """Hold an flock on `lock_file` (created if missing) for the block; the OS frees it if we die."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
