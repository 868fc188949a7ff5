"""Cache keys for on-disk tf.data caches: a fingerprint of the input, so stale data is never reused.

tf.data's own snapshot fingerprint covers the dataset graph (file names and functions) but not
the bytes in the files; the key adds each shard's size, modification time and leading bytes (on s3://,
its size and ETag).
"""
from __future__ import annotations

import hashlib
import os
import tempfile

from hpml.components import s3_files
from hpml.components.s3_files import is_s3

HEAD_BYTES = 64 * 1024


def input_fingerprint(files: list[str], *parts: str) -> str:
    """A short hash of the shards' names, sizes, mtimes and first 64 KiB, plus any extra parts."""
    import tensorflow as tf

    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    for path in sorted(files):
        if is_s3(path):  # a changed object has a new ETag
            info = s3_files.stat(path)
            digest.update(f"{path}\0{info['size']}\0{info['etag']}\0".encode())
            continue
        stat = tf.io.gfile.stat(path)
        digest.update(f"{path}\0{stat.length}\0{stat.mtime_nsec}\0".encode())
        with tf.io.gfile.GFile(path, "rb") as handle:
            digest.update(handle.read(HEAD_BYTES))
    return digest.hexdigest()[:20]


def default_cache_dir() -> str:
    """Local disk: HPML_CACHE_DIR, or a folder in the system temp directory."""
    return os.environ.get("HPML_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "hpml-tfdata-cache")


def cache_path(cache_dir: str | None, key: str) -> str:
    path = os.path.join(cache_dir or default_cache_dir(), key)
    os.makedirs(path, exist_ok=True)
    return path
