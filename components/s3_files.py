"""s3:// for hpml's own files, through boto3: TensorFlow 2.21 has no S3 file system (see docs/aws.md).

Configured the way every AWS tool is: credentials, region and an S3-compatible endpoint come from boto3's chain
(`AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, instance and IRSA roles, `AWS_REGION`, `AWS_ENDPOINT_URL_S3` or
`AWS_ENDPOINT_URL`). Every call is bounded in time: a store that is down or slow fails within about a minute with
an error naming the path, never after boto3's default of endless-seeming retries.

Folders are key prefixes. `makedirs` writes the empty `<folder>/` object that TensorFlow's GCS file system writes
too, so that an empty folder exists; every listing leaves such markers out.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import IO

from hpml.components.errors import SpecError

SCHEME = "s3://"
# Seconds: to open a connection, and between two bytes of an answer. boto3's defaults are 60 and 60.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 30
# Attempts per call where AWS_MAX_ATTEMPTS does not say: with connect and read timeouts above, a dead store fails
# a call within about a minute.
MAX_ATTEMPTS = 3
_SPOOL_BYTES = 8 << 20  # a file being written stays in memory up to this size, then on local disk


def is_s3(path: str) -> bool:
    return str(path).startswith(SCHEME)


def split(url: str) -> tuple[str, str]:
    """(bucket, key) of an s3:// URL; the key has no leading slash."""
    bucket, _, key = url[len(SCHEME):].partition("/")
    if not bucket:
        raise SpecError(f"{url}: an s3:// URL names a bucket (s3://BUCKET/KEY)")
    return bucket, key.lstrip("/")


_CLIENTS: dict[int, object] = {}
_CLIENTS_LOCK = threading.Lock()
os.register_at_fork(after_in_child=lambda: globals().update(_CLIENTS_LOCK=threading.Lock()))


def client():
    """One boto3 S3 client per process (a client is thread-safe; a forked child makes its own). Made under a lock:
    the first call may come from several copying threads at once, and boto3 makes clients unsafely in parallel."""
    with _CLIENTS_LOCK:
        if os.getpid() not in _CLIENTS:
            import boto3
            from botocore.config import Config

            retries = {"mode": os.environ.get("AWS_RETRY_MODE", "standard")}
            if "AWS_MAX_ATTEMPTS" not in os.environ:
                retries["total_max_attempts"] = MAX_ATTEMPTS
            config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S, retries=retries,
                            max_pool_connections=32)
            _CLIENTS[os.getpid()] = boto3.session.Session().client("s3", config=config)
        return _CLIENTS[os.getpid()]


def forget_clients() -> None:
    """Drop the clients made so far: the next call reads the environment (credentials, endpoint) again."""
    _CLIENTS.clear()


_HINTS = {
    "NoSuchBucket": "check the bucket's name, and that it exists in this account and region",
    "AccessDenied": "the credentials boto3 found (AWS_PROFILE, AWS_ACCESS_KEY_ID, the instance's role) may not "
                    "act on this key; docs/aws.md lists the permissions hpml needs",
    "InvalidAccessKeyId": "check AWS_ACCESS_KEY_ID (or the profile AWS_PROFILE names)",
    "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY (or the profile AWS_PROFILE names)",
    "ExpiredToken": "the session token expired: renew the credentials (AWS_SESSION_TOKEN)",
}


@contextlib.contextmanager
def _explained(url: str) -> Iterator[None]:
    """Turn boto3's failures into an error naming the URL and what to check."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        yield
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "404", "NotFound"):
            raise FileNotFoundError(url) from None
        raise SpecError(f"{url}: S3 refused the request ({code}: {err.response.get('Error', {}).get('Message', '')})",
                        hint=_HINTS.get(code, "check the URL, the credentials and AWS_ENDPOINT_URL_S3")) from None
    except NoCredentialsError:
        raise SpecError(f"{url}: no AWS credentials found", hint="set AWS_PROFILE or AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY, or run where an instance or IRSA role provides them") from None
    except BotoCoreError as err:  # refused, timed out or dropped, after the bounded retries
        endpoint = client().meta.endpoint_url
        raise SpecError(f"{url}: no answer from the S3 store at {endpoint} ({err})",
                        hint="check that the store is up and AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL) points "
                             "at it") from None


def _keys(bucket: str, prefix: str, delimiter: str = "") -> Iterator[dict]:
    """The listing under `prefix`, page by page: objects as {"Key", "Size", ...}, and with a delimiter the
    folders as {"Prefix"}."""
    pages = client().get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix, **({"Delimiter": delimiter} if delimiter else {}))
    for page in pages:
        yield from page.get("Contents", [])
        yield from page.get("CommonPrefixes", [])


def _head(url: str) -> dict | None:
    from botocore.exceptions import ClientError

    bucket, key = split(url)
    if not key or key.endswith("/"):
        return None
    try:
        return client().head_object(Bucket=bucket, Key=key)
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def isfile(url: str) -> bool:
    with _explained(url):
        return _head(url) is not None


def isdir(url: str) -> bool:
    """A bucket that exists, or a prefix with an object under it."""
    from botocore.exceptions import ClientError

    bucket, key = split(url)
    with _explained(url):
        if not key.strip("/"):
            try:
                client().head_bucket(Bucket=bucket)
            except ClientError as err:
                if err.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
                    return False
                raise
            return True
        return next(_keys(bucket, key.rstrip("/") + "/"), None) is not None


def exists(url: str) -> bool:
    return isfile(url) or isdir(url)


def stat(url: str) -> dict:
    """{"size", "mtime" (seconds since the epoch), "etag"} of one object; FileNotFoundError where it is missing."""
    with _explained(url):
        head = _head(url)
    if head is None:
        raise FileNotFoundError(url)
    return {"size": head["ContentLength"], "mtime": head["LastModified"].timestamp(), "etag": head["ETag"]}


def listdir(url: str) -> list[str]:
    """Names of the objects and folders directly under `url`, folders without their slash."""
    bucket, key = split(url)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    with _explained(url):
        names = {(entry.get("Key") or entry["Prefix"])[len(prefix):].rstrip("/")
                 for entry in _keys(bucket, prefix, "/")}
    names.discard("")
    if not names and prefix and not isdir(url):
        raise FileNotFoundError(url)
    return sorted(names)


def walk_files(root: str) -> list[tuple[str, int]]:
    """(path relative to `root`, size) of every object under `root`, sorted."""
    bucket, key = split(root)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    with _explained(root):
        return sorted((entry["Key"][len(prefix):], entry["Size"]) for entry in _keys(bucket, prefix)
                      if not entry["Key"].endswith("/"))


def list_etags(root: str) -> dict[str, tuple[int, str]]:
    """{path relative to `root`: (size, ETag)} of every object under `root`, in one listing."""
    bucket, key = split(root)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    with _explained(root):
        return {entry["Key"][len(prefix):]: (entry["Size"], entry["ETag"]) for entry in _keys(bucket, prefix)
                if not entry["Key"].endswith("/")}


def _pattern(glob_pattern: str) -> re.Pattern:
    """A glob as a regular expression over keys: `*` and `?` stop at a slash, as in TensorFlow's glob."""
    out, i = [], 0
    while i < len(glob_pattern):
        char = glob_pattern[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and "]" in glob_pattern[i + 1:]:
            end = glob_pattern.index("]", i + 1)
            out.append("[" + glob_pattern[i + 1:end].replace("!", "^", 1) + "]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return re.compile("".join(out) + r"\Z")


def glob(pattern: str) -> list[str]:
    """The objects and folders whose URL matches `pattern`, sorted."""
    bucket, key = split(pattern)
    fixed = re.split(r"[*?\[]", key, maxsplit=1)[0]
    matcher, found = _pattern(key), set[str]()
    with _explained(pattern):
        for entry in _keys(bucket, fixed[:fixed.rfind("/") + 1]):
            parts = entry["Key"].rstrip("/").split("/")
            found.update("/".join(parts[:n]) for n in range(1, len(parts) + 1))
    return sorted(f"{SCHEME}{bucket}/{k}" for k in found if matcher.match(k))


def makedirs(url: str) -> None:
    bucket, key = split(url)
    if key.strip("/"):
        with _explained(url):
            client().put_object(Bucket=bucket, Key=key.rstrip("/") + "/", Body=b"")


def read_bytes(url: str) -> bytes:
    bucket, key = split(url)
    with _explained(url):
        return client().get_object(Bucket=bucket, Key=key)["Body"].read()


def write_bytes(url: str, data: bytes) -> None:
    """One object, replaced whole: S3 shows the old object or the new, never a part."""
    bucket, key = split(url)
    with _explained(url):
        client().put_object(Bucket=bucket, Key=key, Body=data)


def create_new(url: str, data: bytes) -> bool:
    """Create the object only if there is none (`If-None-Match: *`): True for the one writer that created it."""
    from botocore.exceptions import ClientError

    bucket, key = split(url)
    with _explained(url):
        for attempt in range(5):
            try:
                client().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
                return True
            except ClientError as err:
                code = err.response.get("Error", {}).get("Code")
                if code == "PreconditionFailed":
                    return False
                # 409 ConditionalRequestConflict: another conditional write of this key is under way; ask again.
                if code != "ConditionalRequestConflict" or attempt == 4:
                    raise
                time.sleep(0.1 * (attempt + 1))
    return False


class _Body(io.RawIOBase):
    """An object's body as a raw stream, so that io.BufferedReader, io.TextIOWrapper and gzip can read it. A seek
    starts a ranged GET at the new offset when the next read comes, so a reader can begin at a piece of a large
    object without downloading what comes before."""

    def __init__(self, url: str):
        self._url = url
        self._bucket, self._key = split(url)
        self._position = 0
        self._body = self._get()

    def _get(self):
        extra = {"Range": f"bytes={self._position}-"} if self._position else {}
        with _explained(self._url):
            response = client().get_object(Bucket=self._bucket, Key=self._key, **extra)
        self._length = self._position + response["ContentLength"]
        return response["Body"]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._length}[whence] + offset
        if target != self._position:
            if self._body is not None:
                self._body.close()
            self._body, self._position = None, max(0, target)
        return self._position

    def readinto(self, buffer) -> int:
        if self._position >= self._length:
            return 0
        if self._body is None:
            self._body = self._get()
        with _explained(self._url):
            data = self._body.read(len(buffer))
        buffer[:len(data)] = data
        self._position += len(data)
        return len(data)

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
        super().close()


def open_stream(url: str) -> io.BufferedReader:
    """A buffered binary reader that streams the object (nothing is downloaded first)."""
    return io.BufferedReader(_Body(url), buffer_size=1 << 20)


class _Upload(io.RawIOBase):
    """A file being written: spooled in memory, then on local disk, and uploaded when closed (in parts where it
    is large), so that the object appears whole."""

    def __init__(self, url: str):
        self._url = url
        self._spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES, prefix="hpml-s3-")

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self._spool.write(data)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._spool.seek(0)
            upload_fileobj(self._spool, self._url)
        finally:
            self._spool.close()
            super().close()


def open_writer(url: str, text: bool) -> IO:
    raw = io.BufferedWriter(_Upload(url))
    return io.TextIOWrapper(raw, encoding="utf-8") if text else raw


def upload_fileobj(handle, url: str) -> None:
    bucket, key = split(url)
    with _explained(url):
        client().upload_fileobj(handle, bucket, key)


def upload_file(path: str, url: str) -> None:
    bucket, key = split(url)
    with _explained(url):
        client().upload_file(path, bucket, key)


def download_file(url: str, path: str) -> None:
    """Download the object, in parallel ranges where it is large."""
    bucket, key = split(url)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with _explained(url):
        client().download_file(bucket, key, path)


def copy(source: str, target: str) -> None:
    """Copy one object within the store (server-side)."""
    (bucket, key), (target_bucket, target_key) = split(source), split(target)
    with _explained(source):
        client().copy({"Bucket": bucket, "Key": key}, target_bucket, target_key)


def remove(url: str) -> None:
    bucket, key = split(url)
    with _explained(url):
        client().delete_object(Bucket=bucket, Key=key)


def rmtree(url: str) -> None:
    """Delete every object under the folder: a request per page of the listing (at most 1000 keys, as a delete
    takes)."""
    bucket, key = split(url)
    with _explained(url):
        for page in client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key.rstrip("/") + "/"):
            if page.get("Contents"):
                client().delete_objects(Bucket=bucket, Delete={
                    "Objects": [{"Key": entry["Key"]} for entry in page["Contents"]], "Quiet": True})
