"""A Google Cloud Storage server on loopback for the tests: PyPI's gcp-storage-emulator, reached by every client.

The clients find it in two ways:
- Python's google-cloud-storage (Beam's gcsio, MLflow, hpml's own file calls) honours `STORAGE_EMULATOR_HOST`.
- TensorFlow's built-in gs:// file system has no endpoint setting: it always calls https://www.googleapis.com and
  https://storage.googleapis.com. It does honour `HTTPS_PROXY` and `CURL_CA_BUNDLE`, so a small front on loopback
  takes its CONNECTs, ends TLS with a certificate made here for those names, and forwards each request to the
  emulator. The upload session URLs the emulator hands back are plain http:// on the same host names, so
  `HTTP_PROXY` sends those through the front too.
- TF uploads with Transfer-Encoding: chunked, which the emulator does not decode (it stores the chunk framing as
  the object's bytes); the front forwards every body whole, with a Content-Length.

Nothing here needs root, a fixed port or a changed /etc/hosts; `env()` is all a child process needs.
"""
from __future__ import annotations

import datetime
import http.client
import http.server
import ipaddress
import json
import os
import re
import socketserver
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from tests.services import free_port

GOOGLE_HOSTS = ("www.googleapis.com", "storage.googleapis.com", "oauth2.googleapis.com")
# Hop-by-hop headers are the front's own business on each side.
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
        "proxy-authorization", "content-length", "expect"}


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for the Google storage hosts, valid for a day, and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hpml test object store")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([*(x509.DNSName(h) for h in GOOGLE_HOSTS),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "front.pem", folder / "front.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class _FrontHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm on, the client's delayed ACK held each
    # reply back ~40 ms.
    disable_nagle_algorithm = True

    def log_message(self, *args):  # the tests read the emulator's state, not the front's chatter
        pass

    def do_CONNECT(self):
        self.send_response(200, "Connection established")
        self.end_headers()
        tls = self.server.tls.wrap_socket(self.connection, server_side=True)
        self.connection, self.rfile, self.wfile = tls, tls.makefile("rb"), tls.makefile("wb")
        self.close_connection = False

    def _forward(self):
        if self.path == "/token":  # oauth2.googleapis.com's token endpoint, for the test's credentials file
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            token = json.dumps({"access_token": "hpml-test", "expires_in": 3600, "token_type": "Bearer"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(token)))
            self.end_headers()
            self.wfile.write(token)
            return
        parts = urlsplit(self.path)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "") if parts.scheme else self.path
        body = self._body()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        layout = re.fullmatch(r"/storage/v1/b/([^/?]+)/storageLayout(\?.*)?", target)
        if self.command == "GET" and layout:
            # TF asks before renaming a folder; the emulator lacks this call. A flat bucket's answer:
            reply = (200, "OK", [("Content-Type", "application/json")], json.dumps(
                {"kind": "storage#storageLayout", "bucket": layout.group(1), "location": "US",
                 "locationType": "multi-region"}).encode())
        elif self.command == "POST" and "uploadType=media" in target and not body:
            # An empty object (TF's folder markers): the emulator fails on an empty media upload, so the front
            # makes it through a resumable upload of 0 bytes, which the emulator handles.
            session = self._upstream("POST", target.replace("uploadType=media", "uploadType=resumable"), b"",
                                     headers)
            location = urlsplit(dict((k.lower(), v) for k, v in session[2])["location"])
            reply = self._upstream("PUT", f"{location.path}?{location.query}", b"",
                                   {**headers, "Content-Range": "bytes */0"})
        else:
            reply = self._upstream(self.command, target, body, headers)
        status, reason, reply_headers, data = reply
        self.send_response(status, reason)
        for key, value in reply_headers:
            if key.lower() not in _HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _upstream(self, method: str, target: str, body: bytes | None, headers: dict) -> tuple:
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.emulator_port, timeout=120)
        try:
            upstream.request(method, target, body=body, headers=headers)
            reply = upstream.getresponse()
            return reply.status, reply.reason, reply.getheaders(), reply.read()
        finally:
            upstream.close()

    def _body(self) -> bytes | None:
        # TF's chunked uploads reach the emulator as one body with a Content-Length (see the module's docstring).
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _forward


class _Front(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def _serve_front(port_file: str, emulator_port: int, cert: str, key: str, address: str = "127.0.0.1",
                 port: int = 0) -> None:
    """The front's own process: TF holds the GIL while it waits on some requests, so it cannot run in the test's.
    It writes the port it listens on to `port_file` (none where `port` is given: a test host's store)."""
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    front = _Front((address, port), _FrontHandler)
    front.tls, front.emulator_port = tls, emulator_port
    if not port:
        Path(port_file + ".tmp").write_text(str(front.server_address[1]))
        os.replace(port_file + ".tmp", port_file)
    front.serve_forever()


def hard_deletes(emulator: str, bucket: str) -> None:
    """Turn the emulator's soft delete off for `bucket`, as a scratch bucket has it. The emulator keeps a deleted
    object for 7 days by default and rewrites its whole metadata, soft-deleted objects included, on every write:
    each deletion kept made every later write slower (a benchmark's store ran twice as slow by its third repeat)."""
    body = json.dumps({"softDeletePolicy": {"retentionDurationSeconds": "0"}}).encode()
    request = urllib.request.Request(f"{emulator}/storage/v1/b/{bucket}", data=body, method="PATCH",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        policy = json.loads(answer.read()).get("softDeletePolicy", {})
    if int(policy.get("retentionDurationSeconds", -1)) != 0:
        raise RuntimeError(f"the emulator kept soft delete on for {bucket}: {policy}")


def _serve_emulator(argv: list[str]) -> None:
    """gcp-storage-emulator with the one GCS behaviour hpml relies on that it lacks: an upload with
    ifGenerationMatch=0 (create only) fails with 412 Precondition Failed when the object exists, and two such
    uploads of one name never both succeed."""
    import threading
    from http import HTTPStatus

    from gcp_storage_emulator import __main__ as emulator_main
    from gcp_storage_emulator import server
    from gcp_storage_emulator.exceptions import NotFound
    from gcp_storage_emulator.handlers import objects

    original, lock = objects.insert, threading.Lock()

    def insert(request, response, storage, *args, **kwargs):
        if request.query.get("ifGenerationMatch") != ["0"]:
            return original(request, response, storage, *args, **kwargs)
        name = (request.query.get("name") or [None])[0]
        if name is None and isinstance(request.data, dict):
            name = request.data.get("meta", {}).get("name")
        with lock:
            try:
                storage.get_file_obj(request.params["bucket_name"], name)
            except NotFound:
                return original(request, response, storage, *args, **kwargs)
            response.status = HTTPStatus.PRECONDITION_FAILED
            response.json({"error": {"code": 412, "message": "At least one of the pre-conditions you specified "
                                                              "did not hold."}})

    objects.insert = insert
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is original:
                handlers[method] = insert
    emulator_main.main(argv)


class GcsServer:
    """gcp-storage-emulator in its own process (in memory), plus the TLS front that TensorFlow goes through."""

    def __init__(self, bucket: str = "hpml-test"):
        self.bucket = bucket
        self.folder = Path(tempfile.mkdtemp(prefix="hpml-gcs-"))
        self.port = free_port()
        self._processes: list[subprocess.Popen] = []
        self.front_port: int | None = None

    @property
    def root(self) -> str:
        return f"gs://{self.bucket}"

    def start(self, timeout_s: float = 60) -> GcsServer:
        self._log = log = open(self.folder / "emulator.log", "wb")
        root = str(Path(__file__).resolve().parents[1])
        emulator = subprocess.Popen(
            [sys.executable, "-c", "import sys; from tests.object_store import _serve_emulator; "
             "_serve_emulator(sys.argv[1:])", "start", "--host", "127.0.0.1", "--port", str(self.port),
             "--in-memory", "--default-bucket", self.bucket],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.folder,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))})
        self._processes.append(emulator)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=2).read()
                break
            except OSError:
                if emulator.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("gcp-storage-emulator did not start: "
                                       + (self.folder / "emulator.log").read_text(errors="replace")[-2000:]) from None
                time.sleep(0.2)
        hard_deletes(f"http://127.0.0.1:{self.port}", self.bucket)
        self.cert, key = _self_signed(self.folder)
        port_file = self.folder / "front.port"
        code = ("import sys; from tests.object_store import _serve_front; "
                "_serve_front(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])")
        front = subprocess.Popen([sys.executable, "-c", code, str(port_file), str(self.port), str(self.cert), str(key)],
                                 cwd=root, stdout=log, stderr=subprocess.STDOUT,
                                 env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                     filter(None, [root, os.environ.get("PYTHONPATH")]))})
        self._processes.append(front)
        while not port_file.exists():
            if front.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the object store's TLS front did not start: "
                                   + (self.folder / "emulator.log").read_text(errors="replace")[-2000:])
            time.sleep(0.05)
        self.front_port = int(port_file.read_text())
        return self

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to use this server through TF, Beam and google-cloud-storage."""
        front = f"http://127.0.0.1:{self.front_port}"
        credentials = self.folder / "credentials.json"
        if not credentials.exists():
            credentials.write_text(json.dumps({"type": "authorized_user", "client_id": "hpml-test",
                                               "client_secret": "hpml-test", "refresh_token": "hpml-test"}))
        return {
            # Python's google-auth (Beam's gcsio): credentials whose token the front hands out, so Beam does not
            # spend ~20 s retrying to find some.
            "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
            "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{self.port}",
            "HTTPS_PROXY": front, "https_proxy": front, "HTTP_PROXY": front, "http_proxy": front,
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
            "CURL_CA_BUNDLE": str(self.cert), "REQUESTS_CA_BUNDLE": str(self.cert),
            # TF's GCS client: a fixed bearer token and no metadata-server probe; the emulator checks neither.
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "hpml-test", "NO_GCE_CHECK": "true",
            "GOOGLE_CLOUD_PROJECT": "hpml-test",
        }

    def wipe(self) -> None:
        urllib.request.urlopen(f"http://127.0.0.1:{self.port}/wipe?keep-buckets=true", timeout=10).read()

    def stop(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
        self._processes = []
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None
