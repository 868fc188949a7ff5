"""Local copies of s3:// objects for what only TensorFlow reads (TFRecord files, SavedModels): TensorFlow 2.21 has
no S3 file system.

The cache is a folder of whole files, each named by its object's URL and ETag: an object that has not changed is
never downloaded twice, and a changed one gets a new name, so a reader never sees a file change under it. A copy
appears by rename once downloaded. The folder stays within a disk budget: before a download, the least recently
used copies are removed until the new one fits.

Where: `s3/` in `HPML_CACHE_DIR`, else in `$XDG_CACHE_HOME/hpml`, else in `~/.cache/hpml`. Budget: `HPML_CACHE_BYTES`,
else half the free space of that disk when the cache is used, at most 20 GiB.

A copy a running task works on (`held_tree`) and a local folder a task works in (`in_use`) carry a shared lock
for as long as the task uses them: eviction passes them over, and `sweep` removes only folders that no live process
holds, the leftovers of a killed task. The lock is the kernel's (flock), so a process that dies lets go of it.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator

from hpml.components import s3_files
from hpml.components.errors import SpecError

log = logging.getLogger(__name__)

MAX_DEFAULT_BUDGET = 20 << 30
_PARTIAL = ".partial-"


def _base() -> str:
    configured = os.environ.get("HPML_CACHE_DIR")
    if configured:
        return configured
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hpml")


def folder() -> str:
    """Where the copies are kept."""
    return os.path.join(_base(), "s3")


def staging_folder() -> str:
    """Where components write the outputs they upload to s3:// (`staging`): beside the cache, on the same disk."""
    return os.path.join(_base(), "s3-staging")


def budget(where: str) -> int:
    configured = os.environ.get("HPML_CACHE_BYTES")
    if configured:
        try:
            return int(configured)
        except ValueError:
            raise SpecError(f"HPML_CACHE_BYTES={configured!r} is not a number of bytes") from None
    return min(MAX_DEFAULT_BUDGET, shutil.disk_usage(where).free // 2)


def _name(url: str, etag: str) -> str:
    key = hashlib.sha256(url.encode()).hexdigest()[:32]
    return f"{key}-{hashlib.sha256(etag.encode()).hexdigest()[:16]}{os.path.splitext(url)[1][:12]}"


def _tree_size(path: str) -> int:
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(FileNotFoundError):  # removed by another process meanwhile
                total += os.path.getsize(os.path.join(folder, name))
    return total


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a reader that has the file open keeps reading it


def _entries(where: str) -> list[tuple[float, int, str]]:
    """(last used, size, path) of the whole copies (files and folders), least recently used first. Partial
    downloads an hour old were left by a killed process: they are removed. Other processes share the folder: an
    entry they removed or renamed since the listing is passed over."""
    found, stale = [], time.time() - 3600
    with os.scandir(where) as entries:
        for entry in entries:
            try:
                info = entry.stat()
                if _PARTIAL in entry.name:
                    if info.st_mtime < stale:
                        _remove(entry.path)
                    continue
                found.append((info.st_mtime, _tree_size(entry.path) if entry.is_dir() else info.st_size,
                              entry.path))
            except FileNotFoundError:
                continue
    return sorted(found)


def _make_room(where: str, needed: int, limit: int, keep: str) -> None:
    """Remove the least recently used copies until `needed` more bytes fit in `limit`."""
    if needed > limit:
        raise SpecError(f"an object of {needed} bytes does not fit the local cache's budget of {limit} bytes",
                        hint="raise HPML_CACHE_BYTES, or point HPML_CACHE_DIR at a larger disk")
    entries = _entries(where)
    used = sum(size for _, size, _ in entries)
    for _, size, path in entries:
        if used + needed <= limit:
            break
        if path != keep and _remove_unless_held(path):
            used -= size
    if used + needed > limit:
        log.warning("the local cache %s goes over its budget of %d bytes: %d bytes of its copies are in use by "
                    "running tasks", where, limit, used)


def _remove_unless_held(path: str) -> bool:
    """Remove `path` unless a live process holds it (`in_use`); whether it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # another process removed it
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        _remove(path)
        return True
    finally:
        os.close(fd)


@contextlib.contextmanager
def in_use(path: str) -> Iterator[str]:
    """Hold the file or folder `path` for the block (a shared lock): eviction and `sweep` leave it alone."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield path
    finally:
        os.close(fd)


def sweep(parent: str, grace_s: float = 60.0) -> list[str]:
    """Remove the folders and files in `parent` that no live process holds and that have not changed for
    `grace_s` (one just made is not held yet): those of tasks that were killed. The paths removed."""
    removed = []
    with contextlib.suppress(FileNotFoundError), os.scandir(parent) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - entry.stat().st_mtime > grace_s and _remove_unless_held(entry.path):
                    removed.append(entry.path)
    for path in removed:
        log.info("removed %s: left by a task that stopped without cleaning up", path)
    return removed


def local_file(url: str) -> str:
    """The path of a local copy of the s3:// object `url` as it is now (its ETag), downloaded only where the cache
    has none; FileNotFoundError where there is no such object."""
    where = folder()
    os.makedirs(where, exist_ok=True)
    for _ in range(3):  # an object replaced during its download is downloaded again
        info = s3_files.stat(url)
        path = os.path.join(where, _name(url, info["etag"]))
        with contextlib.suppress(FileNotFoundError):  # not there, or just removed by another process
            os.utime(path)  # recently used: the last to be removed
            return path
        _make_room(where, info["size"], budget(where), keep=path)
        partial = f"{path}{_PARTIAL}{uuid.uuid4().hex[:12]}"
        try:
            s3_files.download_file(url, partial)
            if s3_files.stat(url)["etag"] == info["etag"]:
                os.replace(partial, path)
                return path
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    raise SpecError(f"{url}: the object changed during each of 3 downloads", hint="is something rewriting it?")


@contextlib.contextmanager
def held_tree(url: str) -> Iterator[str]:
    """`local_tree(url)`, held for the block (`in_use`): a task's input stays while the task runs."""
    for _ in range(3):
        path = local_tree(url)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # evicted by another process since: downloaded again
            continue
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an evicting process removes it
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    else:
        raise SpecError(f"{url}: other processes removed its local copy each of 3 times it was downloaded",
                        hint="raise HPML_CACHE_BYTES, or point HPML_CACHE_DIR at a larger disk")
    try:
        yield path
    finally:
        os.close(fd)


def local_tree(url: str) -> str:
    """The path of a local copy of every object under the s3:// folder `url`, as they are now: a folder named by
    the URL and every object's ETag, so an unchanged folder (a published artifact) is downloaded once."""
    where = folder()
    os.makedirs(where, exist_ok=True)
    listing = s3_files.list_etags(url)
    if not listing:
        raise FileNotFoundError(url)
    path = os.path.join(where, _name(url, json.dumps(listing, sort_keys=True)))
    if os.path.isdir(path):
        with contextlib.suppress(FileNotFoundError):  # just removed by another process: downloaded again
            os.utime(path)
            return path
    _make_room(where, sum(size for size, _ in listing.values()), budget(where), keep=path)
    partial = f"{path}{_PARTIAL}{uuid.uuid4().hex[:12]}"
    try:
        from hpml.components.files import each_in_threads

        each_in_threads(lambda relative: s3_files.download_file(f"{url.rstrip('/')}/{relative}",
                                                                os.path.join(partial, relative)), list(listing))
        if s3_files.list_etags(url) != listing:
            raise SpecError(f"{url}: objects changed while the folder was downloaded",
                            hint="a published artifact never changes: is a task still writing it?")
        try:
            os.rename(partial, path)
        except OSError:  # another process put the same folder there first
            if not os.path.isdir(path):
                raise
    finally:
        _remove(partial)
    return path
