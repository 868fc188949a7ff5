"""A serving destination in TF Serving's layout: `<destination>/<version>/` SavedModels, numbered from 1.

TF Serving serves the highest version in the folder; hpml takes that one as the champion. A rollback moves the
versions above the one it returns to into `_retired/`, where TF Serving does not look and where their numbers
stay taken: a version number is never given twice.

A version appears whole or not at all. In a local folder, the model is copied into a hidden folder beside the
versions, then renamed to its number; a rename onto a number another pusher took first fails, so two pushers
finishing together take the next free numbers in turn. On gs:// and s3://, which have no rename, a pusher first claims
its number with a create-only object `_claims/<version>` (one claimant wins, on any host), then uploads the version
with `saved_model.pb` last: a version counts, for hpml and for TF Serving's loader, once that file is there. The
folder of a pusher that died mid-upload is removed by a later push; its number stays taken.

A model is pushed once: a pusher retried after it published (its task lost, or cleared and run again) finds its
model already in service, by the SavedModel's own fingerprint, and takes that version instead of a new one.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable

from hpml.components import files
from hpml.components.errors import SpecError

log = logging.getLogger(__name__)

RETIRED_DIR = "_retired"
CLAIMS_DIR = "_claims"  # on an object store: one create-only object per version number taken
SAVED_MODEL_FILE = "saved_model.pb"
FINGERPRINT_FILE = "fingerprint.pb"  # TF writes it into every SavedModel: hashes of its graph and its variables
_VERSION_RE = re.compile(r"^[1-9][0-9]*$")
_TMP_PREFIX = ".tmp-push-"
_PROBE_PREFIX = ".hpml-write-check-"  # on an object store: the object that shows the destination can be written
_MAX_CLAIMS = 1000  # versions another pusher may take while this one retries
# An upload on another host still unfinished after this long is taken as abandoned (its pusher died).
ABANDONED_AFTER_S = 6 * 3600


def _numbers(folder: str) -> list[int]:
    # Listed, never checked first: on an object store another pusher's write check can make the folder exist and
    # then empty it again between the two calls.
    try:
        names = files.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(int(name) for name in names if _VERSION_RE.match(name))


def versions(destination: str) -> list[int]:
    """The versions in service, oldest first (on an object store, those whose upload finished)."""
    if not files.is_url(destination):
        return _numbers(destination)
    return [n for n in _numbers(destination) if files.isfile(os.path.join(version_path(destination, n),
                                                                          SAVED_MODEL_FILE))]


def retired(destination: str) -> list[int]:
    """The versions a rollback took out of service, oldest first."""
    return _numbers(os.path.join(destination, RETIRED_DIR))


def version_path(destination: str, version: int) -> str:
    return os.path.join(destination, str(version))


def champion(destination: str) -> int | None:
    """The version TF Serving serves (the highest in service), or None when nothing was pushed."""
    live = versions(destination)
    return live[-1] if live else None


def _fingerprint(model_dir: str) -> bytes | None:
    path = os.path.join(model_dir, FINGERPRINT_FILE)
    if not files.isfile(path):
        return None
    with files.open_file(path, "rb") as handle:
        return handle.read()


def holding(model_dir: str, destination: str) -> int | None:
    """The version in service that already holds the SavedModel at `model_dir` (the same fingerprint: the same
    graph and the same weights), newest first; None when there is none."""
    wanted = _fingerprint(model_dir)
    if wanted is None:
        return None
    for version in reversed(versions(destination)):
        if _fingerprint(version_path(destination, version)) == wanted:
            return version
    return None


def check_writable(destination: str) -> str | None:
    """A problem that stops a push to `destination`, found before any work is done; None when it can be written."""
    if files.is_url(destination):
        if not destination.startswith(("gs://", "s3://")):
            return (f"{destination}: a serving destination is a local folder, a gs:// or an s3:// folder; other "
                    "object stores are not supported")
        bucket = "/".join(destination.split("/", 3)[:3])
        try:
            found = files.exists(bucket)
        except Exception as err:  # noqa: BLE001 - any client failure is a destination that cannot be reached
            return f"{destination}: bucket {bucket} cannot be reached ({err})"
        if not found:
            return f"{destination}: bucket {bucket} does not exist or cannot be listed"
        # Only a write shows that these credentials may write there (a policy may allow some prefixes alone).
        probe = os.path.join(destination, f"{_PROBE_PREFIX}{uuid.uuid4().hex[:12]}")
        try:
            files.write_text(probe, "")
        except Exception as err:  # noqa: BLE001 - whatever the store says, the destination cannot be written
            return f"{destination}: cannot be written ({err})"
        try:
            files.remove(probe)
        except Exception as err:  # noqa: BLE001 - written but not removable: the push itself can still work
            log.warning("%s: the write check's object %s could not be removed (%s)", destination, probe, err)
        return None
    path = os.path.abspath(destination)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return f"{destination}: {path} is a file, not a folder"
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        return f"{destination}: {path} is on a read-only file system"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{destination}: {path} cannot be written by this user"
    return None


def publish(model_dir: str, destination: str, may_publish: Callable[[], None] = lambda: None) -> int:
    """Copy the SavedModel at `model_dir` into `destination` as its next version, whole; the version number.
    `may_publish()` is called once the copy is there and before it becomes a version; it stops the push by raising
    (this attempt of the push was taken over), which leaves no version."""
    problem = check_writable(destination)
    if problem:
        raise SpecError(problem)
    if files.is_url(destination):
        return _publish_to_store(model_dir, destination, may_publish)
    os.makedirs(destination, exist_ok=True)
    _remove_abandoned(destination)
    staging = os.path.join(destination, f"{_TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        files.copy_tree(model_dir, staging)
        _sync_tree(staging)
        may_publish()
        for _ in range(_MAX_CLAIMS):
            version = max([0, *versions(destination), *retired(destination)]) + 1
            try:
                os.rename(staging, version_path(destination, version))
            except OSError as err:
                if err.errno in (errno.ENOTEMPTY, errno.EEXIST):  # another pusher took this number first
                    continue
                raise
            _sync_dir(destination)
            return version
        raise SpecError(f"{destination}: no free version number after {_MAX_CLAIMS} tries")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish_to_store(model_dir: str, destination: str, may_publish: Callable[[], None]) -> int:
    """Claim the next number no pusher has claimed, then upload the version there with its saved_model.pb last.
    A pusher killed mid-upload leaves a numbered folder without saved_model.pb: never a version, its number
    never given again."""
    _remove_abandoned_uploads(destination)
    claims = os.path.join(destination, CLAIMS_DIR)
    claim = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "model": model_dir, "started": time.time()})
    for _ in range(_MAX_CLAIMS):
        taken = [*_numbers(destination), *retired(destination), *_numbers(claims)]
        version = max([0, *taken]) + 1
        if files.create_new(os.path.join(claims, str(version)), claim):
            break
    else:
        raise SpecError(f"{destination}: no free version number after {_MAX_CLAIMS} tries")
    files.copy_tree(model_dir, version_path(destination, version), last=(SAVED_MODEL_FILE,), before_last=may_publish)
    return version


def _remove_abandoned_uploads(destination: str) -> None:
    """Remove the numbered folders on an object store that never got their saved_model.pb and whose pusher is gone:
    on this host, its process has ended; on another, it started over ABANDONED_AFTER_S ago. Their numbers stay
    claimed, so none is given again."""
    for number in _numbers(destination):
        folder = version_path(destination, number)
        if files.isfile(os.path.join(folder, SAVED_MODEL_FILE)):
            continue
        try:
            claim = json.loads(files.read_text(os.path.join(destination, CLAIMS_DIR, str(number))))
        except (FileNotFoundError, ValueError):  # not a pusher's folder: leave it
            continue
        pid, started = claim.get("pid"), claim.get("started")
        ended_here = claim.get("host") == socket.gethostname() and isinstance(pid, int) and not _alive(pid)
        too_old = isinstance(started, (int, float)) and time.time() - started > ABANDONED_AFTER_S
        if ended_here or too_old:
            log.info("removing %s: its pusher (%s, pid %s) stopped before the upload finished", folder,
                     claim.get("host"), pid)
            files.rmtree(folder)


def retire_above(destination: str, version: int) -> list[int]:
    """Take every version above `version` out of service (into `_retired/`); the versions moved."""
    if version not in versions(destination):
        raise SpecError(f"{destination}: version {version} is not in service",
                        hint=f"versions in service: {versions(destination) or 'none'}")
    moved = []
    if files.is_url(destination):
        for newer in reversed([v for v in versions(destination) if v > version]):
            live, kept = version_path(destination, newer), os.path.join(destination, RETIRED_DIR, str(newer))
            files.copy_tree(live, kept, last=(SAVED_MODEL_FILE,))
            files.remove(os.path.join(live, SAVED_MODEL_FILE))  # out of service from here on
            files.rmtree(live)
            moved.append(newer)
        return moved
    os.makedirs(os.path.join(destination, RETIRED_DIR), exist_ok=True)
    for newer in reversed([v for v in versions(destination) if v > version]):
        os.rename(version_path(destination, newer), os.path.join(destination, RETIRED_DIR, str(newer)))
        moved.append(newer)
    _sync_dir(destination)
    return moved


def _remove_abandoned(destination: str) -> None:
    """Staging folders of pushers on this host that died mid-copy (their pid is gone)."""
    prefix = f"{_TMP_PREFIX}{socket.gethostname()}-"
    for name in os.listdir(destination):
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(destination, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sync_tree(root: str) -> None:
    """Flush every file of a staged version, so that the rename never publishes a file still in the page cache
    only."""
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as handle:
                os.fsync(handle.fileno())
        _sync_dir(folder)


def _sync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
