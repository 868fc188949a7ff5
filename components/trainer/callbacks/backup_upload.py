"""Uploads each new backup of a Trainer whose working dir is on s3:// (see `backup_mirror`)."""
from __future__ import annotations

import os

import tf_keras

from hpml.components.trainer import backup_mirror


class BackupUpload(tf_keras.callbacks.Callback):
    """After BackupAndRestore (it runs after it in the callback list), upload the backup it just wrote: a change
    of the local checkpoint index says there is one."""

    def __init__(self, working_dir: str, backup_subdir: str, folder: str):
        super().__init__()
        self._working_dir, self._subdir, self._folder = working_dir, backup_subdir, folder
        self._index = os.path.join(backup_mirror.local_working_dir(working_dir), backup_subdir, folder,
                                   backup_mirror.INDEX_FILE)
        self._uploaded = self._stamp()

    def _stamp(self):
        try:
            info = os.stat(self._index)
        except FileNotFoundError:
            return None
        return info.st_mtime_ns, info.st_size, info.st_ino

    def _upload_if_new(self) -> None:
        stamp = self._stamp()
        if stamp is not None and stamp != self._uploaded:
            backup_mirror.upload(self._working_dir, self._subdir, self._folder)
            self._uploaded = stamp

    def on_train_batch_end(self, batch, logs=None):
        self._upload_if_new()

    def on_epoch_end(self, epoch, logs=None):
        self._upload_if_new()
