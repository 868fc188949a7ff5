"""hpml's file calls on s3://, against an S3 server on loopback (moto's; tests/s3_store.py): the same answers as on
a local disk, create-only writes that one writer wins, and clear errors within a bounded time."""
import contextlib
import os
import socket
import threading
import time

import pytest

from hpml.components import files, s3_files
from hpml.components.errors import SpecError


def _tree(root) -> dict[str, bytes]:
    return {relative: files.open_file(os.path.join(root, relative), "rb").read()
            for relative, _ in files.walk_files(str(root))}


def test_files_on_s3_answer_as_on_a_local_disk(s3, tmp_path):
    root = f"{s3.root}/{tmp_path.name}"
    local = tmp_path / "tree"
    (local / "Split-train").mkdir(parents=True)
    (local / "Split-train" / "data-0.gz").write_bytes(os.urandom(1000))
    (local / "Split-train" / "data-1.gz").write_bytes(os.urandom(20 << 20))  # above the spool and one part
    (local / "schema.pbtxt").write_text("feature { name: 'x' }")

    assert not files.exists(root) and not files.isdir(root)
    copied = files.copy_tree(str(local), f"{root}/tree", last=("schema.pbtxt",))
    assert copied == (20 << 20) + 1000 + len("feature { name: 'x' }")
    assert _tree(f"{root}/tree") == _tree(local)
    assert files.listdir(f"{root}/tree") == ["Split-train", "schema.pbtxt"]
    assert files.isdir(f"{root}/tree/Split-train") and not files.isfile(f"{root}/tree/Split-train")
    assert files.isfile(f"{root}/tree/schema.pbtxt") and not files.isdir(f"{root}/tree/schema.pbtxt")
    assert files.glob(f"{root}/tree/Split-*/data-*.gz") == [f"{root}/tree/Split-train/data-0.gz",
                                                            f"{root}/tree/Split-train/data-1.gz"]
    assert files.glob(f"{root}/tree/*") == [f"{root}/tree/Split-train", f"{root}/tree/schema.pbtxt"]
    assert files.size(f"{root}/tree/Split-train/data-1.gz") == 20 << 20
    assert abs(files.mtime(f"{root}/tree/schema.pbtxt") - time.time()) < 120

    # Back to a local disk, and between two folders of the store.
    files.copy_tree(f"{root}/tree", str(tmp_path / "back"))
    files.copy_tree(f"{root}/tree", f"{root}/copy")
    assert _tree(tmp_path / "back") == _tree(local) == _tree(f"{root}/copy")

    # Text and streams.
    files.write_text(f"{root}/notes/a.txt", "héllo\n")
    assert files.read_text(f"{root}/notes/a.txt") == "héllo\n"
    with files.open_file(f"{root}/notes/b.txt", "w") as handle:
        handle.write("line 1\nline 2\n")
    with files.open_file(f"{root}/notes/b.txt") as handle:
        assert handle.readlines() == ["line 1\n", "line 2\n"]
    with files.open_stream(f"{root}/tree/Split-train/data-1.gz") as stream:
        assert stream.read(10) == (local / "Split-train" / "data-1.gz").read_bytes()[:10]
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        files.read_text(f"{root}/notes/missing.txt")

    # An empty folder exists; removing leaves nothing.
    files.makedirs(f"{root}/empty")
    assert files.isdir(f"{root}/empty") and files.listdir(f"{root}/empty") == []
    assert "empty" in files.listdir(root)
    files.rename(f"{root}/notes/a.txt", f"{root}/notes/c.txt")
    assert files.listdir(f"{root}/notes") == ["b.txt", "c.txt"]
    files.remove(f"{root}/notes/b.txt")
    files.remove(f"{root}/notes/b.txt")  # nothing there: nothing happens
    assert files.listdir(f"{root}/notes") == ["c.txt"]
    files.rmtree(root)
    assert not files.exists(root) and files.walk_files(root) and list(files.walk_files(root)) == []



def test_removing_a_folder_of_more_objects_than_one_listing_page_removes_them_all(s3, tmp_path):
    """A listing page and a delete request each take at most 1000 keys: a folder of 1003 needs two of each."""
    from concurrent.futures import ThreadPoolExecutor

    from hpml.components import s3_files

    root = f"{s3.root}/{tmp_path.name}"
    bucket, prefix = s3_files.split(root)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: s3_files.client().put_object(Bucket=bucket, Key=f"{prefix}/part/{i:04d}", Body=b"x"),
                      range(1003)))
    files.write_text(f"{root}/kept.txt", "outside the folder")
    assert len(list(files.walk_files(f"{root}/part"))) == 1003
    files.rmtree(f"{root}/part")
    assert list(files.walk_files(f"{root}/part")) == [] and files.listdir(root) == ["kept.txt"]

def test_a_create_only_write_is_won_by_one_writer_of_many(s3, tmp_path):
    root = f"{s3.root}/{tmp_path.name}"
    for key in range(4):
        path, start, won = f"{root}/_claims/{key}", threading.Barrier(8), []

        def claim(writer, path=path, start=start, won=won):
            start.wait()
            if files.create_new(path, f"writer {writer}"):
                won.append(writer)

        threads = [threading.Thread(target=claim, args=(writer,)) for writer in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(won) == 1, won
        assert files.read_text(path) == f"writer {won[0]}"
        assert not files.create_new(path, "late")


def test_a_missing_bucket_or_a_store_that_is_down_is_named_in_the_error(s3, monkeypatch):
    with pytest.raises(SpecError, match=r"s3://no-such-bucket/x\.csv: S3 refused the request \(NoSuchBucket") as err:
        files.read_text("s3://no-such-bucket/x.csv")
    assert "bucket's name" in err.value.hint
    assert not files.exists("s3://no-such-bucket") and not files.isdir("s3://no-such-bucket/")
    assert files.isdir(s3.root) and files.exists(s3.root)

    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
    s3_files.forget_clients()
    with pytest.raises(SpecError, match=rf"s3://{s3.bucket}/x\.csv: no answer from the S3 store at "
                                        rf"http://127.0.0.1:{port} ") as err:
        files.exists(f"{s3.root}/x.csv")
    assert "AWS_ENDPOINT_URL_S3" in err.value.hint


def test_a_store_that_never_answers_fails_after_the_bounded_retries(s3, monkeypatch):
    """A store that takes the connection and says nothing: each attempt ends at the read timeout, and the call
    fails after MAX_ATTEMPTS of them, naming the store."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def accept():
        listener.settimeout(30)
        while len(accepted) < 10:
            try:
                accepted.append(listener.accept()[0])  # held open, never answered
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setattr(s3_files, "READ_TIMEOUT_S", 1)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{listener.getsockname()[1]}")
    s3_files.forget_clients()
    try:
        with pytest.raises(SpecError, match="no answer from the S3 store"):
            files.read_text(f"{s3.root}/slow.txt")
        assert len(accepted) == s3_files.MAX_ATTEMPTS, "one connection per attempt, then the error"
    finally:
        listener.close()
        for connection in accepted:
            connection.close()


@pytest.fixture(scope="module")
def checking_s3():
    """A second S3 server that checks signatures and policies (moto's IAM access control)."""
    from tests.s3_store import S3Server

    server = S3Server(bucket="hpml-checked", check_credentials=True).start()
    yield server
    server.stop()


def test_wrong_or_denied_credentials_are_named_with_what_to_check(checking_s3, monkeypatch):
    from tests.s3_store import ALLOWED_PREFIX

    for name, value in checking_s3.env().items():
        monkeypatch.setenv(name, value)
    s3_files.forget_clients()
    allowed = f"{checking_s3.root}/{ALLOWED_PREFIX}a.txt"
    files.write_text(allowed, "ok")
    assert files.read_text(allowed) == "ok"

    denied = f"{checking_s3.root}/elsewhere/a.txt"
    with pytest.raises(SpecError, match=r"elsewhere/a\.txt: S3 refused the request \(AccessDenied") as err:
        files.write_text(denied, "no")
    assert "permissions" in err.value.hint

    # The Pusher's check of its destination, before any training: a prefix these credentials may not write.
    from hpml.components.pusher import serving_dir

    problem = serving_dir.check_writable(f"{checking_s3.root}/elsewhere/serving")
    assert problem and problem.startswith(f"{checking_s3.root}/elsewhere/serving: cannot be written") and \
        "AccessDenied" in problem, problem
    assert serving_dir.check_writable(f"{checking_s3.root}/{ALLOWED_PREFIX}serving") is None
    assert [path for path, _ in files.walk_files(f"{checking_s3.root}/{ALLOWED_PREFIX}")] == ["a.txt"], \
        "the check's object is removed"

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    s3_files.forget_clients()
    with pytest.raises(SpecError, match="SignatureDoesNotMatch") as err:
        files.read_text(allowed)
    assert "AWS_SECRET_ACCESS_KEY" in err.value.hint

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOSUCHKEY0000000")
    s3_files.forget_clients()
    with pytest.raises(SpecError, match="InvalidAccessKeyId") as err:
        files.read_text(allowed)
    assert "AWS_ACCESS_KEY_ID" in err.value.hint
    s3_files.forget_clients()


def test_a_stream_seeks_to_a_byte_offset_with_a_ranged_read(s3, tmp_path):
    data = os.urandom(3 << 20)
    path = f"{s3.root}/{tmp_path.name}/blob"
    s3_files.write_bytes(path, data)
    with files.open_stream(path) as stream:
        assert stream.read(100) == data[:100]
        stream.seek(2 << 20)
        assert stream.tell() == 2 << 20 and stream.read(1000) == data[2 << 20:(2 << 20) + 1000]
        stream.seek(-10, os.SEEK_END)
        assert stream.read() == data[-10:] and stream.read() == b""
        stream.seek(5)
        assert stream.read(5) == data[5:10]


class _DroppingProxy:
    """A TCP proxy in front of the S3 server that cuts its first `drops` connections after reading part of the
    request (an upload cut mid-body), then forwards the rest whole."""

    def __init__(self, upstream_port: int, drops: int, delay_s: float = 0.0):
        self.drops, self.dropped, self.delay_s = drops, 0, delay_s
        self.open = self.most_open = 0  # connections forwarded now, and the most at once
        self._lock = threading.Lock()
        self._upstream = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        if self.dropped < self.drops:
            self.dropped += 1
            client.settimeout(5)
            with contextlib.suppress(OSError):
                client.recv(64 << 10)  # the headers and the first part of the body
            client.close()
            return
        upstream = socket.create_connection(("127.0.0.1", self._upstream))

        def pipe(source, sink):
            with contextlib.suppress(OSError):
                while data := source.recv(1 << 16):
                    time.sleep(self.delay_s)  # a store some way off
                    sink.sendall(data)
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

        with self._lock:
            self.open += 1
            self.most_open = max(self.most_open, self.open)
        threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
        pipe(client, upstream)
        with self._lock:
            self.open -= 1

    def close(self):
        self._listener.close()


def test_a_store_that_drops_connections_mid_upload_is_retried_then_named(s3, tmp_path, monkeypatch):
    data = os.urandom(3 << 20)
    source = tmp_path / "model.bin"
    source.write_bytes(data)
    flaky = _DroppingProxy(s3.port, drops=s3_files.MAX_ATTEMPTS - 1)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{flaky.port}")
    s3_files.forget_clients()
    try:
        target = f"{s3.root}/{tmp_path.name}/model.bin"
        files.copy_file(str(source), target)  # dropped twice, whole on the third attempt
        assert flaky.dropped == s3_files.MAX_ATTEMPTS - 1
        assert s3_files.read_bytes(target) == data
    finally:
        flaky.close()

    always = _DroppingProxy(s3.port, drops=10 ** 6)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{always.port}")
    s3_files.forget_clients()
    try:
        with pytest.raises(SpecError, match=rf"{tmp_path.name}/other\.bin: no answer from the S3 store at "
                                            rf"http://127.0.0.1:{always.port}"):
            files.copy_file(str(source), f"{s3.root}/{tmp_path.name}/other.bin")
        assert always.dropped == s3_files.MAX_ATTEMPTS, "each attempt, then the error"
    finally:
        always.close()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.url)
    s3_files.forget_clients()
    assert not files.exists(f"{s3.root}/{tmp_path.name}/other.bin"), "nothing half-written"


def test_a_folder_goes_to_and_from_the_store_several_files_at_a_time(s3, tmp_path, monkeypatch):
    """Uploads (copy_tree) and the cache's folder download (local_tree) keep several requests in flight, since
    each request to a store mostly waits on the network: the proxy in front of the store sees several connections
    open at once."""
    from hpml.components import s3_cache

    local = tmp_path / "shards"
    local.mkdir()
    for i in range(16):
        (local / f"part-{i:02d}.gz").write_bytes(os.urandom(10_000 + i))
    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "cache"))
    slow = _DroppingProxy(s3.port, drops=0, delay_s=0.02)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{slow.port}")
    s3_files.forget_clients()
    try:
        files.copy_tree(str(local), f"{s3.root}/{tmp_path.name}/shards")
        uploads, slow.most_open = slow.most_open, 0
        copy = s3_cache.local_tree(f"{s3.root}/{tmp_path.name}/shards")
        downloads = slow.most_open
    finally:
        slow.close()
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.url)
        s3_files.forget_clients()
    assert uploads >= 4 and downloads >= 4, (uploads, downloads)
    assert _tree(copy) == _tree(local)


def test_copying_threads_that_start_at_once_share_one_client(s3):
    """A folder copy's threads make their first request together: they must share the process's one client (its
    connection pool and retry budget), not race to make one each."""
    s3_files.forget_clients()
    start, made = threading.Barrier(8), []

    def first_request():
        start.wait()
        made.append(s3_files.client())

    threads = [threading.Thread(target=first_request) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(made) == 8 and len({id(client) for client in made}) == 1, {id(client) for client in made}
