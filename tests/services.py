"""Production-shaped services on loopback for the tests: Debian's PostgreSQL and an MLflow tracking server.

Each runs as its own processes in a temporary folder, on a free port, and is stopped by the test that
started it. PostgreSQL refuses to run as root, so under root it runs as Debian's `postgres` user.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def postgres_bin() -> str | None:
    """Debian's PostgreSQL server binaries (package postgresql), newest version first; None if not installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]), reverse=True)
    return os.path.dirname(found[0]) if found else None


class Postgres:
    """A PostgreSQL cluster of its own: trust authentication for user `hpml`, TCP on 127.0.0.1 only."""

    user = "hpml"

    def __init__(self):
        self.bin = postgres_bin()
        if self.bin is None:
            raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (make test does)")
        # Its own folder under /tmp: the postgres user cannot enter pytest's root-only temporary folders.
        self.folder = Path(tempfile.mkdtemp(prefix="hpml-postgres-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self._as = []
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run([*self._as, os.path.join(self.bin, tool), *args], capture_output=True, text=True,
                              cwd=self.folder)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stdout}{done.stderr}")

    def start(self) -> Postgres:
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "postgres.log"), "-w", "start", "-o",
                  f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1")
        return self

    def create_database(self, name: str) -> str:
        """A new database; its SQLAlchemy URL, with psycopg2 (the driver Airflow's engine options are made for)."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name)
        return f"postgresql+psycopg2://{self.user}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


class MlflowServer:
    """`mlflow server` with its runs in `backend_uri` and artifacts proxied into `artifacts`: its own folder, or an
    object store's URL (gs://) with the environment `env` that reaches it."""

    def __init__(self, folder: Path, backend_uri: str, artifacts: str | None = None,
                 env: dict[str, str] | None = None):
        self.folder = Path(folder)
        self.artifacts = artifacts or str(self.folder / "artifacts")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.backend_uri = backend_uri
        self.env = env or {}
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120) -> MlflowServer:
        if "://" not in self.artifacts:
            os.makedirs(self.artifacts, exist_ok=True)
        log = open(self.folder / "mlflow-server.log", "w")
        mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
        self.process = subprocess.Popen(
            [mlflow, "server", "--backend-store-uri", self.backend_uri, "--artifacts-destination",
             self.artifacts, "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", **self.env))
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.folder / 'mlflow-server.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"mlflow server did not answer in {timeout_s:.0f}s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
