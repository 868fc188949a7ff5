"""Finding corrupt TFRecord shards by name: tf.data's read errors do not say which file failed.

A shard cut short is worse: TF's reader ends it at its last whole record without an error. So before
they are read, shards that an hpml component wrote are checked against the sizes it recorded (a stat
each), and other GZIP and ZLIB shards have their stream inflated, concurrently, and once per process
for a file that has not changed since.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from hpml.components import artifacts
from hpml.components.errors import InputDataError, op_error_message
from hpml.components.input_pipeline.measure import machine
from hpml.components.zlib_streams import stream_problem

log = logging.getLogger(__name__)

# (path, size, mtime in ns, compression) -> the stream's problem or None, for the shards checked in this process.
_checked: dict[tuple[str, int, int, str], str | None] = {}
_checked_lock = threading.Lock()


def _identity(path: str, compression: str) -> tuple[str, int, int, str]:
    import tensorflow as tf

    stat = tf.io.gfile.stat(path)
    return path, stat.length, stat.mtime_nsec, compression


def stream_problems(files: list[str], compression: str) -> dict[str, str]:
    """{shard: problem} for the shards cut short: by their recorded size where their writer recorded it,
    else, for GZIP and ZLIB shards, by inflating their stream. An uncompressed shard without a record is
    left to TF's reader, which reports a record cut short (though not a shard cut between records)."""
    if not files:
        return {}
    keys = {path: _identity(path, compression) for path in files}
    recorded = artifacts.recorded_shard_sizes(files)
    problems = artifacts.shard_size_problems(files, recorded, sizes={path: key[1] for path, key in keys.items()})
    if compression in ("GZIP", "ZLIB"):
        problems.update(_inflate_problems({path: key for path, key in keys.items() if path not in recorded}))
    return problems


def _inflate_problems(keys: dict[str, tuple[str, int, int, str]]) -> dict[str, str]:
    """{shard: problem} for the compressed shards whose stream is cut short or damaged, keyed as `_identity`."""
    if not keys:
        return {}
    compression = next(iter(keys.values()))[3]
    with _checked_lock:
        todo = [path for path, key in keys.items() if key not in _checked]
    if todo:
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=min(len(todo), machine()["cores"])) as pool:
            found = dict(zip(todo, pool.map(lambda path: stream_problem(path, compression), todo)))
        with _checked_lock:
            _checked.update({keys[path]: problem for path, problem in found.items()})
        log.info("checked the %s stream of %d shard(s) in %.2f s", compression, len(todo), time.perf_counter() - start)
    with _checked_lock:
        problems = {path: _checked[key] for path, key in keys.items()}
    return {path: problem for path, problem in problems.items() if problem is not None}


def check_shards(files: list[str], compression: str) -> dict[str, str]:
    """{shard: error} for every shard that cannot be read to the end, or that is cut short."""
    import tensorflow as tf

    corrupt = {}
    for path in files:
        try:
            tf.data.TFRecordDataset(path, compression_type=compression).reduce(0, lambda n, _: n + 1)
        except tf.errors.OpError as err:
            corrupt[path] = op_error_message(err).splitlines()[-1][:300]
    corrupt.update(stream_problems([path for path in files if path not in corrupt], compression))
    return corrupt


def corrupt_shard_error(corrupt: dict[str, str]) -> InputDataError:
    names = "; ".join(f"{path}: {message}" for path, message in sorted(corrupt.items()))
    return InputDataError(f"corrupt TFRecord shard(s): {names}",
                          hint="re-run the component that wrote them, or set on_corrupt_shard='skip'")


def usable_shards(files: list[str], compression: str, on_corrupt: str) -> tuple[list[str], dict[str, str]]:
    """Under 'skip', the readable shards and the skipped ones. Under 'error', the files, once none is cut
    short; other damage surfaces as a read error that `explain_read_error` names."""
    if on_corrupt != "skip":
        cut = stream_problems(list(files), compression)
        if cut:
            raise corrupt_shard_error(cut)
        return list(files), {}
    corrupt = check_shards(files, compression)
    for path, message in corrupt.items():
        log.warning("skipping corrupt shard %s: %s", path, message)
    return [f for f in files if f not in corrupt], corrupt


def explain_read_error(files: list[str], compression: str, error: BaseException,
                       names: dict[str, str] | None = None) -> InputDataError | None:
    """After a tf.data read failure, the same failure with the corrupt shards named, if any are; `names` gives
    the name to show for a file read from a copy (an s3:// shard's URL)."""
    corrupt = {(names or {}).get(path, path): message for path, message in check_shards(files, compression).items()}
    if not corrupt:
        return None
    named = corrupt_shard_error(corrupt)
    named.__cause__ = error
    return named
