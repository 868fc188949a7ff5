"""Backups of a Trainer whose working dir is on s3://: TensorFlow writes and reads them on local disk, and the
store keeps the last whole one, so a retried task on another machine resumes where this one stopped.

TensorFlow's checkpoint index (`checkpoint`) names a checkpoint only once it is whole; the upload keeps that
rule on the store: the new checkpoint's files go first, the index last, and the files of the older checkpoint are
removed after. A download reads the index first and takes the checkpoint it names, so it never sees half of
one, however an upload was cut short.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
from collections.abc import Iterator

from hpml.components import files, s3_cache
from hpml.components.s3_files import is_s3

log = logging.getLogger("hpml.trainer")

INDEX_FILE = "checkpoint"  # TensorFlow's checkpoint index


def local_working_dir(working_dir: str) -> str:
    """Where TensorFlow keeps what it writes under `working_dir`: the folder itself, or for s3:// a local folder
    named by the URL (the same for every process on this machine)."""
    if not is_s3(working_dir):
        return working_dir
    name = hashlib.sha256(working_dir.encode()).hexdigest()[:24]
    return os.path.join(os.path.dirname(s3_cache.staging_folder()), "s3-work", name)


def _checkpoint_files(folder: str, index_text: str) -> list[str]:
    """The files (relative to `folder`) of the checkpoint an index names, the index last."""
    for line in index_text.splitlines():
        if line.startswith("model_checkpoint_path:"):
            prefix = line.split(":", 1)[1].strip().strip('"')
            names = [name for name in files.listdir(folder) if name.startswith(f"{prefix}.")]
            return [*sorted(names), INDEX_FILE]
    return []


def restore(working_dir: str, backup_subdir: str) -> int:
    """Put the store's last whole backup under the local working dir, where it is not there already; the bytes
    downloaded. Nothing happens for a working dir that is not on s3://.

    Every process that trains calls it: the Trainer before it launches, and each task of a remote job on its own
    machine, since only the store outlives a machine. Tasks of one job on one machine take turns (a lock beside the
    folder), and a folder whose every index names what the store's does is left as it is: the first task's copy
    serves the rest, and a task never replaces a backup another is reading. A local checkpoint the store does not
    hold (an upload cut short on a machine that went on) is removed: every task resumes from the same backup."""
    if not is_s3(working_dir):
        return 0
    local_root = os.path.join(local_working_dir(working_dir), backup_subdir)
    remote_root = os.path.join(working_dir, backup_subdir)
    os.makedirs(os.path.dirname(local_root), exist_ok=True)
    with open(f"{local_root}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        indexes = _remote_indexes(remote_root)
        if _local_indexes(local_root) <= set(indexes) and all(
                _is_local(os.path.join(local_root, folder), index) for folder, index in indexes.items()):
            return 0
        shutil.rmtree(local_root, ignore_errors=True)
        copied = 0
        for folder, index in indexes.items():
            remote, local = os.path.join(remote_root, folder), os.path.join(local_root, folder)
            for name in _checkpoint_files(remote, index):
                files.copy_file(os.path.join(remote, name), os.path.join(local, name))
                copied += files.size(os.path.join(local, name))
    if copied:
        log.info("restored the backup from %s (%.1f MB)", remote_root, copied / 1e6)
    return copied


def _remote_indexes(remote_root: str) -> dict[str, str]:
    """{folder (relative to `remote_root`): the text of its checkpoint index} for each folder the store holds a
    backup in."""
    indexes = {}
    for folder in sorted({os.path.dirname(path) for path, _ in files.walk_files(remote_root)}):
        with contextlib.suppress(FileNotFoundError):
            indexes[folder] = files.read_text(os.path.join(remote_root, folder, INDEX_FILE))
    return indexes


def _local_indexes(local_root: str) -> set[str]:
    """The folders (relative to `local_root`) that hold a checkpoint index on local disk."""
    return {os.path.relpath(folder, local_root) for folder, _, names in os.walk(local_root) if INDEX_FILE in names}


def _is_local(folder: str, index: str) -> bool:
    """Whether the local `folder` holds the checkpoint the store's `index` names, under the same index."""
    try:
        with open(os.path.join(folder, INDEX_FILE), encoding="utf-8") as handle:
            if handle.read() != index:
                return False
        return all(os.path.exists(os.path.join(folder, name)) for name in _checkpoint_files(folder, index))
    except FileNotFoundError:
        return False


def upload(working_dir: str, backup_subdir: str, folder: str) -> None:
    """Upload the checkpoint the local index in `folder` (relative to the backup dir) names, index last, then
    remove the store's files of older checkpoints."""
    local = os.path.join(local_working_dir(working_dir), backup_subdir, folder)
    remote = os.path.join(working_dir, backup_subdir, folder)
    index_path = os.path.join(local, INDEX_FILE)
    if not os.path.exists(index_path):
        return
    wanted = _checkpoint_files(local, open(index_path, encoding="utf-8").read())
    for name in wanted:
        files.copy_file(os.path.join(local, name), os.path.join(remote, name))
    for name in files.listdir(remote):
        if name not in wanted:
            files.remove(os.path.join(remote, name))


@contextlib.contextmanager
def claimed(working_dir: str) -> Iterator[None]:
    """Hold the local folder of an s3:// working dir while this process trains in it (`s3_cache.in_use`), after
    removing the folders that Trainers killed on this machine left (`s3_cache.sweep`). The store keeps their
    backups: `restore` puts the last one back."""
    if not is_s3(working_dir):
        yield
        return
    local = local_working_dir(working_dir)
    s3_cache.sweep(os.path.dirname(local))
    os.makedirs(local, exist_ok=True)
    with s3_cache.in_use(local):
        yield


def remove(working_dir: str) -> None:
    """Remove the local folder of an s3:// working dir (the store's side is removed with the working dir)."""
    if is_s3(working_dir):
        shutil.rmtree(local_working_dir(working_dir), ignore_errors=True)
