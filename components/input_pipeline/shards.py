"""Finding corrupt TFRecord shards by name: tf.data's read errors do not say which file failed."""
from __future__ import annotations

import logging

from components.errors import InputDataError, op_error_message

log = logging.getLogger(__name__)


def check_shards(files: list[str], compression: str) -> dict[str, str]:
    """{shard: error} for every shard that cannot be read to the end; one full read pass."""
    import tensorflow as tf

    corrupt = {}
    for path in files:
        try:
            tf.data.TFRecordDataset(path, compression_type=compression).reduce(0, lambda n, _: n + 1)
        except tf.errors.OpError as err:
            corrupt[path] = op_error_message(err).splitlines()[-1][:300]
    return corrupt


def corrupt_shard_error(corrupt: dict[str, str]) -> InputDataError:
    names = "; ".join(f"{path}: {message}" for path, message in sorted(corrupt.items()))
    return InputDataError(f"corrupt TFRecord shard(s): {names}",
                          hint="re-run the component that wrote them, or set on_corrupt_shard='skip'")


def usable_shards(files: list[str], compression: str, on_corrupt: str) -> tuple[list[str], dict[str, str]]:
    """Under 'skip', the readable shards and the skipped ones; under 'error', the files unchecked."""
    if on_corrupt != "skip":
        return list(files), {}
    corrupt = check_shards(files, compression)
    for path, message in corrupt.items():
        log.warning("skipping corrupt shard %s: %s", path, message)
    return [f for f in files if f not in corrupt], corrupt


def explain_read_error(files: list[str], compression: str, error: BaseException) -> InputDataError | None:
    """After a tf.data read failure, the same failure with the corrupt shards named, if any are."""
    corrupt = check_shards(files, compression)
    if not corrupt:
        return None
    named = corrupt_shard_error(corrupt)
    named.__cause__ = error
    return named
