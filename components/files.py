"""File operations that work the same on a local path, gs:// and s3://.

Local paths use the standard library, so code that never sees a URL never imports TensorFlow; s3:// goes through
boto3 (`s3_files`: TensorFlow has no S3 file system); any other URL goes through `tf.io.gfile`, the client that TF's
readers and writers use too.
"""
from __future__ import annotations

import contextlib
import glob as _glob
import io
import os
import shutil
import uuid
from typing import IO
from collections.abc import Callable, Iterator

from hpml.components import s3_files
from hpml.components.s3_files import is_s3


def is_url(path: str) -> bool:
    """True for gs://, s3://, hdfs:// and other scheme-qualified paths; False for a local path."""
    return "://" in str(path)


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def absolute(path: str) -> str:
    """A local path made absolute; a URL as it is."""
    return path if is_url(path) else os.path.abspath(path)


def open_file(path: str, mode: str = "r") -> IO:
    """Open for reading or writing; text modes are UTF-8. On an object store a written file appears whole when
    closed."""
    if is_s3(path):
        if "r" in mode:
            stream = s3_files.open_stream(path)
            return stream if "b" in mode else io.TextIOWrapper(stream, encoding="utf-8")
        return s3_files.open_writer(path, text="b" not in mode)
    if is_url(path):
        if "r" in mode:
            stream = open_stream(path)
            return stream if "b" in mode else io.TextIOWrapper(stream, encoding="utf-8")
        return _gfile().GFile(path, mode)
    return open(path, mode, encoding=None if "b" in mode else "utf-8")


class _GFileReader(io.RawIOBase):
    """TF's GFile as a raw stream, so that io.BufferedReader, io.TextIOWrapper and gzip can read from it. It reads
    in pieces until the store says the file ended: GFile's own `read()` reads as many bytes as its cached size says,
    which TF keeps up to 5 s, so a file another process rewrote longer in that time came back cut short."""

    def __init__(self, gfile):
        self._gfile = gfile

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._gfile.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def tell(self) -> int:
        return self._gfile.tell()

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """To a byte offset, so that a reader can start at a piece of a large file."""
        self._gfile.seek(offset, whence)
        return self._gfile.tell()

    def close(self) -> None:
        self._gfile.close()
        super().close()


def open_stream(path: str) -> io.BufferedReader:
    """A buffered binary reader, for what wants a real stream (csv through io.TextIOWrapper, gzip)."""
    if is_s3(path):
        return s3_files.open_stream(path)
    if is_url(path):
        return io.BufferedReader(_GFileReader(_gfile().GFile(path, "rb")))
    return open(path, "rb")


def open_text(path: str, encoding: str = "utf-8", newline: str | None = None) -> io.TextIOWrapper:
    """A text reader in any encoding, streamed from any of a local disk, gs:// and s3://."""
    return io.TextIOWrapper(open_stream(path), encoding=encoding, newline=newline)


def tf_readable(path: str) -> str:
    """A path TensorFlow's readers can open (a file, or a folder such as a SavedModel): the path itself, or for
    s3:// (which TensorFlow cannot read) a local copy from the cache (`s3_cache`)."""
    if not is_s3(path):
        return path
    from hpml.components import s3_cache

    return s3_cache.local_tree(path) if s3_files.isdir(path) else s3_cache.local_file(path)


def read_text(path: str) -> str:
    """The whole file; FileNotFoundError where it is missing and OSError where it cannot be read, on an object
    store too."""
    if not is_url(path):
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    if is_s3(path):
        return s3_files.read_bytes(path).decode("utf-8")
    import tensorflow as tf

    try:
        with open_stream(path) as handle:
            return handle.read().decode("utf-8")
    except tf.errors.NotFoundError:
        raise FileNotFoundError(path) from None
    except tf.errors.OpError as err:  # e.g. the object was replaced while it was read
        raise OSError(f"{path}: {err.message}") from None


def write_text(path: str, text: str) -> None:
    """Replace the file whole: a reader never sees half of it, and a write that fails leaves the old file. Locally
    through a hidden sibling renamed into place; an object store's object appears whole when closed."""
    if is_s3(path):
        s3_files.write_bytes(path, text.encode("utf-8"))
        return
    if is_url(path):
        with _gfile().GFile(path, "w") as handle:
            handle.write(text)
        return
    write_texts({path: text})


def write_texts(texts: dict) -> None:
    """Write several local files (path -> text) all or none: each goes to a hidden sibling first, and only when
    every one is written are they renamed into place."""
    staged = []
    try:
        for path, text in texts.items():
            path = str(path)
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            folder, name = os.path.split(path)
            temporary = os.path.join(folder, f".{name}.tmp-{uuid.uuid4().hex[:12]}")
            staged.append((temporary, path))
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(text)
    except BaseException:
        for temporary, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        raise
    for temporary, path in staged:
        os.replace(temporary, path)


def exists(path: str) -> bool:
    if is_s3(path):
        return s3_files.exists(path)
    return _gfile().exists(path) if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    if is_s3(path):
        return s3_files.isdir(path)
    return _gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
    if is_s3(path):
        return s3_files.isfile(path)
    if is_url(path):
        gfile = _gfile()
        return gfile.exists(path) and not gfile.isdir(path)
    return os.path.isfile(path)


def size(path: str) -> int:
    if is_s3(path):
        return s3_files.stat(path)["size"]
    return _gfile().stat(path).length if is_url(path) else os.path.getsize(path)


def mtime(path: str) -> float:
    """When the file was last written, in seconds since the epoch."""
    if is_s3(path):
        return s3_files.stat(path)["mtime"]
    return _gfile().stat(path).mtime_nsec / 1e9 if is_url(path) else os.path.getmtime(path)


def makedirs(path: str) -> None:
    if is_s3(path):
        s3_files.makedirs(path)
    elif is_url(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def listdir(path: str) -> list[str]:
    """Entry names, without a trailing slash for folders; FileNotFoundError where there is no such folder (on an
    object store: nothing under that prefix)."""
    if is_s3(path):
        return s3_files.listdir(path)
    if is_url(path):
        import tensorflow as tf

        try:
            return sorted({name.rstrip("/") for name in _gfile().listdir(path)})
        except tf.errors.NotFoundError:
            raise FileNotFoundError(path) from None
    return sorted(os.listdir(path))


def glob(pattern: str) -> list[str]:
    if is_s3(pattern):
        return s3_files.glob(pattern)
    return sorted(_gfile().glob(pattern) if is_url(pattern) else _glob.glob(pattern))


def rename(source: str, target: str) -> None:
    """Move one file, replacing `target`; on an object store that is a copy and a delete."""
    if is_s3(source) or is_s3(target):
        copy_file(source, target)
        remove(source)
    elif is_url(source) or is_url(target):
        _gfile().rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


def rmtree(path: str) -> None:
    """Remove a folder and everything in it; nothing happens if it is not there."""
    if is_s3(path):
        s3_files.rmtree(path)
    elif is_url(path):
        gfile = _gfile()
        if gfile.exists(path):
            gfile.rmtree(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def remove(path: str) -> None:
    """Remove one file; nothing happens if it is not there."""
    if is_s3(path):
        s3_files.remove(path)
    elif is_url(path):
        with contextlib.suppress(FileNotFoundError):
            import tensorflow as tf

            try:
                _gfile().remove(path)
            except tf.errors.NotFoundError:
                raise FileNotFoundError(path) from None
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def walk_files(root: str) -> Iterator[tuple[str, int]]:
    """(path relative to `root` with '/' separators, size in bytes) of every file under `root`, sorted."""
    if is_s3(root):
        yield from s3_files.walk_files(root)
        return
    if is_url(root):
        gfile, prefix = _gfile(), root.rstrip("/") + "/"
        found = []
        for folder, _, names in gfile.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                if (size := _size_if_there(path)) is not None:
                    found.append((path[len(prefix):] if path.startswith(prefix) else name, size))
        yield from sorted(found)
        return
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if (size := _size_if_there(path)) is not None:
                found.append((os.path.relpath(path, root).replace(os.sep, "/"), size))
    yield from sorted(found)


def _size_if_there(path: str) -> int | None:
    """The size of a file just listed, or None if it went in the meantime (a writer's temporary file, renamed or
    removed while the folder is walked: a walk lists what is there, it does not fail on a concurrent writer)."""
    if not is_url(path):
        try:
            return os.path.getsize(path)
        except FileNotFoundError:
            return None
    import tensorflow as tf

    try:
        return _gfile().stat(path).length
    except tf.errors.NotFoundError:
        return None


def copy_tree(source: str, target: str, last: tuple[str, ...] = (),
              before_last: Callable[[], None] | None = None) -> int:
    """Copy every file under `source` to the same place under `target` (local or object store); the bytes copied.
    Files whose path relative to `source` is in `last` are copied after every other, so that a reader who waits
    for them finds the rest already there (an object store has no rename to publish a folder at once);
    `before_last()` is called between the two, and may stop the copy by raising."""
    if not is_url(source) and not is_url(target) and not last:
        shutil.copytree(source, target, dirs_exist_ok=True)
        return sum(size for _, size in walk_files(target))
    found = list(walk_files(source))
    each_in_threads(lambda relative: copy_file(os.path.join(source, relative), os.path.join(target, relative)),
                    [relative for relative, _ in found if relative not in last])
    if before_last is not None:
        before_last()
    for relative in sorted(relative for relative, _ in found if relative in last):
        copy_file(os.path.join(source, relative), os.path.join(target, relative))
    return sum(size for _, size in found)


COPY_THREADS = 8  # files in flight at once: each request to a store mostly waits on the network


def each_in_threads(action, items: list, threads: int = COPY_THREADS) -> None:
    """`action(item)` for every item, up to `threads` at a time; the first error is raised once all have ended."""
    if len(items) <= 1:
        for item in items:
            action(item)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="hpml-copy") as pool:
        for _ in pool.map(action, items):
            pass


def copy_file(source: str, target: str) -> None:
    """Copy one file between any two of a local disk, gs:// and s3://, replacing `target`."""
    if is_s3(source) and is_s3(target):
        s3_files.copy(source, target)
    elif is_s3(target) and not is_url(source):
        s3_files.upload_file(source, target)
    elif is_s3(source) and not is_url(target):
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        s3_files.download_file(source, target)
    elif is_s3(source) or is_s3(target):  # between two stores: streamed through this process
        with open_stream(source) as reader, open_file(target, "wb") as writer:
            shutil.copyfileobj(reader, writer, 1 << 20)
    elif not is_url(source) and not is_url(target):
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        shutil.copyfile(source, target)
    else:
        makedirs(os.path.dirname(target))
        _gfile().copy(source, target, overwrite=True)


def create_new(path: str, text: str = "") -> bool:
    """Create the file `path` holding `text` only if nothing is there: True for the one caller that created it,
    False when it existed, however many callers on however many hosts try at once. Locally an exclusive create; on
    gs:// a create-only precondition (ifGenerationMatch=0), which TensorFlow's file system cannot send; on s3://
    `If-None-Match: *`."""
    if not is_url(path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        return True
    if is_s3(path):
        return s3_files.create_new(path, text.encode("utf-8"))
    scheme = path.partition("://")[0]
    if scheme != "gs":
        raise ValueError(f"{path}: a create-only write needs a local path, gs:// or s3://, not {scheme}://")
    from hpml.components import gcs_files

    return gcs_files.create_new(path, text)
