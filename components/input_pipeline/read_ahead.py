"""TFRecord shards on s3:// fetched a few shards ahead of tf.data's reader.

TensorFlow 2.21 cannot open s3://, so a shard there is read from a whole local copy in the cache
(`s3_cache.local_file`, downloaded once while its ETag is unchanged). The copies are downloaded by a small pool of
threads in the order the reader opens the shards, at most `ahead` shards past the one it opened last: training
starts once its first shards are here, the rest arrive while it reads, and the download never runs far ahead of
the reader (the copies are on disk, within the cache's budget, not in memory). A copy stays held
(`s3_cache.in_use`) until `release()` or the process ends, so a later epoch, or another dataset over the same
shards, reads it again without a download, and another task's eviction leaves it alone.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from hpml.components import artifacts, files, s3_cache, s3_files
from hpml.components.input_pipeline.shards import check_shards, corrupt_shard_error, stream_problems
from hpml.components.s3_files import is_s3
from hpml.components.zlib_streams import stream_problem

log = logging.getLogger(__name__)

AHEAD = 4  # shards downloaded past the last one the reader opened, beyond the reader's own parallel opens
THREADS = 4

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_downloads: dict[str, Future] = {}  # shard URL -> its local copy's path, held
_holds = contextlib.ExitStack()
_failures: list[BaseException] = []


def _fetch(url: str, check) -> str:
    """Download (or find) the copy of `url`, hold it, and run `check(url, path)` on it once."""
    for _ in range(3):
        path = s3_cache.local_file(url)
        try:
            hold = s3_cache.in_use(path)
            hold.__enter__()
        except FileNotFoundError:  # evicted by another process since: found or downloaded again
            continue
        with _lock:
            _holds.push(hold)
        if check is not None:
            check(url, path)
        return path
    raise FileNotFoundError(f"{url}: other processes removed its local copy each of 3 times it was downloaded")


def _start(url: str, check) -> Future:
    global _pool
    with _lock:
        future = _downloads.get(url)
        if future is None:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="hpml-read-ahead")
            future = _downloads[url] = _pool.submit(_fetch, url, check)
        return future


class Shards:
    """The shards one dataset reads, in its reader's order: `local(url)` is the path of a copy of `url`, once it is
    downloaded, and starts the downloads of the next `ahead` shards. Paths not on s3:// are their own copy."""

    def __init__(self, urls: Sequence[str], ahead: int = AHEAD, check=None):
        self.urls = list(urls)
        self.ahead = max(1, ahead)
        self.check = check  # check(url, local path) -> None, raising where the copy is damaged
        self._index = {url: i for i, url in enumerate(self.urls)}

    def local(self, url: str) -> str:
        if not is_s3(url):
            return url
        index = self._index[url]
        future = _start(url, self.check)
        for later in self.urls[index + 1:index + 1 + self.ahead]:
            if is_s3(later):
                _start(later, self.check)
        try:
            return future.result()
        except BaseException as err:
            with _lock:
                _failures.append(err)
            raise

    def all_local(self) -> list[str]:
        """Every shard's copy, downloaded at once (for readers that must see every file before they start)."""
        for url in self.urls:
            if is_s3(url):
                _start(url, self.check)
        return [self.local(url) for url in self.urls]

    def op(self, url):
        """The local path of the shard `url` (a string tensor), for the reader inside tf.data."""
        import tensorflow as tf

        path = tf.numpy_function(lambda name: self.local(name.decode()).encode(), [url], tf.string, stateful=True)
        return tf.reshape(path, [])


def usable_shards(urls: list[str], compression: str, on_corrupt: str,
                  ahead: int = AHEAD) -> tuple[Shards, list[str], dict[str, str]]:
    """`shards.usable_shards` for shards that may be on s3://: (their reader, the usable ones, the skipped ones).

    Under 'error', shards whose artifact recorded their sizes are checked against the store's listing before
    anything is downloaded; other GZIP and ZLIB shards have their stream checked as each copy arrives. Under
    'skip' every copy is downloaded and read through first, as a local shard is."""
    if on_corrupt == "skip":
        reader = Shards(urls, ahead)
        copies = reader.all_local()
        named = dict(zip(copies, urls))
        skipped = {named[path]: message for path, message in check_shards(copies, compression).items()}
        for url, message in skipped.items():
            log.warning("skipping corrupt shard %s: %s", url, message)
        return reader, [url for url in urls if url not in skipped], skipped
    remote = [url for url in urls if is_s3(url)]
    sizes = {}
    for folder in sorted({os.path.dirname(url) for url in remote}):
        sizes.update({f"{folder}/{name}": size for name, size in s3_files.walk_files(folder)})
    recorded = artifacts.recorded_shard_sizes(remote)
    cut = artifacts.shard_size_problems(remote, recorded, {url: sizes.get(url, -1) for url in remote})
    cut.update(stream_problems([url for url in urls if not is_s3(url)], compression))
    if cut:
        raise corrupt_shard_error(cut)

    def check(url: str, path: str) -> None:
        problem = stream_problem(path, compression) if url not in recorded else None
        if problem:
            raise corrupt_shard_error({url: problem})

    return Shards(urls, ahead, check if compression in ("GZIP", "ZLIB") else None), list(urls), {}


def local_copies(patterns: Sequence[str] | str) -> list[str]:
    """The files that `patterns` match, with a local copy in place of each one on s3://, every copy downloaded:
    for readers that open the files themselves (TFXIO, or a dataset run on other processes)."""
    if isinstance(patterns, str):
        patterns = [patterns]
    if not any(is_s3(pattern) for pattern in patterns):
        return list(patterns)
    matched = sorted({path for pattern in patterns for path in files.glob(pattern)})
    return Shards(matched).all_local()


def copy_of(url: str) -> str | None:
    """The local copy of `url` this process downloaded, if it has finished."""
    with _lock:
        future = _downloads.get(url)
    if future is None or not future.done() or future.exception() is not None:
        return None
    return future.result()


def failure() -> BaseException | None:
    """The first error a reader met downloading a shard (tf.data passes it on as a bare op error), if any."""
    with _lock:
        return _failures[0] if _failures else None


def release() -> None:
    """Let go of every copy this process holds, and forget the downloads: a new reader checks the store again.
    Downloads not yet started are cancelled; one under way finishes. The threads end (none is left to a fork)."""
    global _pool
    with _lock:
        pending = list(_downloads.values())
        _downloads.clear()
        _failures.clear()
        pool, _pool = _pool, None
    for future in pending:
        future.cancel()
    if pool is not None:
        pool.shutdown(wait=True)
    with _lock:
        _holds.close()
