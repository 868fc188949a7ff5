"""Components whose artifacts are on s3://, which TensorFlow cannot open: the executor runs on local folders.

Each s3:// input is a local copy from the cache (`s3_cache.local_tree`, downloaded once per published version),
except those the component reads from the store itself (the Trainer's examples, fetched ahead of its reader);
each s3:// output is a fresh local folder, uploaded when the executor succeeds and published the way every
object-store artifact is: the earlier attempt's objects removed first, the manifest (`_hpml_published.json`)
written last. A reader takes an artifact only once its manifest is there, so an upload cut short, or a retried
task's leftovers, never count. Nothing is uploaded when the executor fails, nor by an attempt that finds its output
published (or being uploaded) by an attempt that began after it: a task cut off from the store, say, whose retry
finished first.

While the executor runs, its input copies and its output folder are held (`s3_cache.in_use`): another task's
download does not evict them, and the output folders a killed task left behind are removed by the next task.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping

from hpml.components import files, publishing, s3_cache
from hpml.components.s3_files import is_s3


_ACTIVE = threading.local()


def published_uri(path: str) -> str:
    """The s3:// URI a staged output folder is uploaded to; any other path as it is."""
    return getattr(_ACTIVE, "published", {}).get(path, path)


def source_uri(path: str) -> str:
    """The s3:// URI of what a local input copy (or a path inside it) was downloaded from; any other path as it is."""
    for local, uri in getattr(_ACTIVE, "sources", {}).items():
        if path == local or path.startswith(local + os.sep):
            return uri.rstrip("/") + path[len(local):]
    return path


def active() -> bool:
    """Whether the executor running in this thread works on local copies of s3:// artifacts: what it hands to
    another machine (a remote launcher's workers) would not be there."""
    return getattr(_ACTIVE, "staged", False)


def _any_s3(uris: Mapping) -> bool:
    return any(is_s3(one) for uri in uris.values() for one in (uri if isinstance(uri, (list, tuple)) else [uri])
               if one is not None)


def _local_input(uri, held: contextlib.ExitStack):
    if isinstance(uri, (list, tuple)):
        return [_local_input(one, held) for one in uri]
    return held.enter_context(s3_cache.held_tree(uri)) if uri is not None and is_s3(uri) else uri


def _sources(inputs: Mapping, local_inputs: Mapping) -> dict[str, str]:
    """{local copy: s3:// URI} of the inputs that were downloaded."""
    pairs: list[tuple[str, str]] = []
    for name, uri in inputs.items():
        many = isinstance(uri, (list, tuple))
        pairs += zip(uri if many else [uri], local_inputs[name] if many else [local_inputs[name]])
    return {local: uri for uri, local in pairs if uri is not None and is_s3(uri) and local != uri}


@contextlib.contextmanager
def staged(inputs: Mapping, outputs: Mapping[str, str], streamed: frozenset[str] = frozenset(),
           started_at: float | None = None) -> Iterator[tuple[dict, dict]]:
    """(inputs, outputs) for the executor: local folders in place of s3:// URIs, uploaded on success. The inputs
    named in `streamed` keep their s3:// URIs: the executor reads them from the store itself. `started_at`: when
    this attempt began (default: now); each s3:// output is signed as this attempt's from the start
    (`publishing.announce`), and a retry begun after it, signed or published first, is not replaced by it."""
    if not _any_s3(inputs) and not _any_s3(outputs):
        yield dict(inputs), dict(outputs)
        return
    started_at = time.time() if started_at is None else started_at
    with contextlib.ExitStack() as held:
        for uri in outputs.values():  # signed on the store now, though uploaded at the end
            if is_s3(uri):
                held.callback(publishing.announce(uri, started_at))
        local_inputs = {name: uri if name in streamed else _local_input(uri, held) for name, uri in inputs.items()}
        os.makedirs(s3_cache.staging_folder(), exist_ok=True)
        s3_cache.sweep(s3_cache.staging_folder())
        work = tempfile.mkdtemp(prefix="hpml-staged-", dir=s3_cache.staging_folder())
        held.callback(shutil.rmtree, work, ignore_errors=True)
        held.enter_context(s3_cache.in_use(work))
        local_outputs = {name: os.path.join(work, name) if is_s3(uri) else uri for name, uri in outputs.items()}
        _ACTIVE.staged = True
        _ACTIVE.published = {local_outputs[name]: uri for name, uri in outputs.items() if is_s3(uri)}
        _ACTIVE.sources = _sources(inputs, local_inputs)
        try:
            yield local_inputs, local_outputs
        finally:
            _ACTIVE.staged, _ACTIVE.published, _ACTIVE.sources = False, {}, {}
        for name, uri in outputs.items():
            if is_s3(uri):
                with publishing.publish(uri, started_at) as target:
                    files.copy_tree(local_outputs[name], target)
