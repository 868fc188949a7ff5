"""What the loopback stand-ins for remote job services share (tests/k8s_standin.py, tests/vertex_standin.py):
an HTTP server on a free loopback port, JSON replies, and each replica run as a local process from this
checkout (the "image"), with `python` meaning this interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def reply_json(handler: BaseHTTPRequestHandler, code: int, body: dict) -> None:
    """Answer an HTTP request with a JSON body, as the API server does."""
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class Replica:
    """One replica's container command as a local process, with the container's env and its TF_CONFIG."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], tf_config: dict, log_path: Path):
        self.name, self.log_path = name, log_path
        self.restarts = 0
        self._argv = [sys.executable if part == "python" else part for part in command]
        self._env = dict(os.environ, **env, TF_CONFIG=json.dumps(tf_config))
        self.log = open(log_path, "w", encoding="utf-8")
        self._start()

    def _start(self):
        self.log.flush()
        self.log_start = self.log_path.stat().st_size  # a restarted container's log starts afresh
        self.popen = subprocess.Popen(self._argv, env=self._env, cwd=PROJECT_ROOT, stdout=self.log,
                                      stderr=subprocess.STDOUT, start_new_session=True)

    def restart(self):
        """Run the container command again in place, as the kubelet does under restartPolicy OnFailure."""
        self.restarts += 1
        self._start()

    def current_log(self) -> str:
        """What the process running now (or last) wrote, not counting the runs before its last restart."""
        with open(self.log_path, "rb") as handle:
            handle.seek(self.log_start)
            return handle.read().decode("utf-8", errors="replace")

    def tail(self, lines: int = 3) -> str:
        text = [line for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
                if line.strip()]
        return " | ".join(text[-lines:])

    def stop(self):
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        self.log.close()


class LoopbackJobService:
    """Serves `handler` on 127.0.0.1 from a thread; on exit stops the server and every job's replicas.
    Subclasses keep each job as a dict with a "replicas" list in `self.jobs`, and log calls in `self.requests`."""

    def __init__(self, workdir: Path, handler: type[BaseHTTPRequestHandler]):
        self.workdir = Path(workdir)
        self.jobs: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        for job in self.jobs.values():
            for replica in job["replicas"]:
                replica.stop()
