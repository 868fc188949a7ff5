"""What gs:// needs beyond `tf.io.gfile`: requests with preconditions, which TensorFlow's file system cannot send,
through google-cloud-storage (it finds credentials as every Google client does). `files` is the way in."""
from __future__ import annotations

import os

_CLIENTS: dict[int, object] = {}


def create_new(path: str, text: str) -> bool:
    """Create the object at gs:// `path` holding `text` only if none is there (ifGenerationMatch=0): True for the one
    caller that created it, False for every other."""
    from google.api_core.exceptions import PreconditionFailed

    bucket, _, name = path.partition("://")[2].partition("/")
    try:
        _client().bucket(bucket).blob(name).upload_from_string(text, if_generation_match=0)
    except PreconditionFailed:
        return False
    return True


def _client():
    """One client per process: a forked child makes its own."""
    if os.getpid() not in _CLIENTS:
        from google.cloud import storage

        _CLIENTS[os.getpid()] = storage.Client()
    return _CLIENTS[os.getpid()]
