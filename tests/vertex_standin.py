"""A loopback stand-in for Vertex AI's JobService (REST, v1) with the replicas of each CustomJob behind it.

No Google Cloud project is reachable from the test machines. This stand-in answers the calls
the Trainer makes through the real aiplatform client (create a CustomJob; get it; list them by display
name; cancel one), and does
what Vertex does with a created job: it runs each worker pool's container command (pool 0 chief,
1 workers, 2 parameter servers) as local processes, with the container's env and the TF_CONFIG a
Vertex replica gets. The job succeeds when the chief exits 0 (Vertex's rule for the primary pool),
fails with the failing replica's last lines, or is cancelled. The client authenticates with real
Application Default Credentials: a service-account key generated here, used as a self-signed JWT.
`unavailable_reads` makes the next status reads answer 503, as a flaky control plane does; `replica_env` is
what the replicas' machines add to their environment.
"""
from __future__ import annotations

import json
import re
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse
from pathlib import Path

from hpml.components.trainer.launchers.local import free_ports
from tests.loopback_jobs import LoopbackJobService, Replica, reply_json

_ROLES = ("chief", "worker", "ps")
_JOBS = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/customJobs(?:/(\d+))?(:cancel)?(?:\?.*)?$")


def write_service_account_key(path: Path, project: str) -> Path:
    """A service-account key file with a freshly generated RSA key: Application Default Credentials."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": project, "private_key_id": "standin", "private_key": pem,
        "client_email": f"trainer@{project}.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": "http://127.0.0.1:9/token",  # never called: the client signs its own JWT
        # Outside Google's own universe google-auth skips its background "allowedLocations" lookup on
        # iamcredentials.googleapis.com, which a test must not try to reach.
        "universe_domain": "standin.invalid"}))
    return path


class VertexStandIn(LoopbackJobService):
    """Start with `with VertexStandIn(tmp) as vertex:`; `vertex.endpoint` is the cluster's api_endpoint."""

    def __init__(self, workdir):
        super().__init__(workdir, self._handler())
        self.endpoint = self.url
        self.unavailable_reads = 0  # answer that many status reads with 503 first
        self.create_reply_delay_s = 0.0  # create the job at once, answer the create this much later
        self.replica_env: dict[str, str] = {}  # what the replicas' machines' environment adds (their own settings)

    def _create(self, parent: str, body: dict) -> dict:
        job_id = str(len(self.jobs) + 1)
        pools = body["jobSpec"]["workerPoolSpecs"]
        counts = [int(pool.get("replicaCount", 0)) if pool else 0 for pool in pools]
        ports = iter(free_ports(sum(counts)))
        cluster = {role: [f"127.0.0.1:{next(ports)}" for _ in range(count)]
                   for role, count in zip(_ROLES, counts) if count}
        replicas = []
        for role, pool, count in zip(_ROLES, pools, counts):
            container = pool.get("containerSpec", {}) if pool else {}
            command = container.get("command", []) + container.get("args", [])
            env = {**{e["name"]: e["value"] for e in container.get("env", [])}, **self.replica_env}
            for index in range(count):
                name = f"workerpool{_ROLES.index(role)}-{index}"
                tf_config = {"cluster": cluster, "task": {"type": role, "index": index}, "environment": "cloud"}
                replicas.append((role, Replica(name, command, env, tf_config,
                                               self.workdir / f"vertex-{job_id}-{name}.log")))
        resource = {**body, "name": f"{parent}/customJobs/{job_id}", "state": "JOB_STATE_PENDING"}
        self.jobs[job_id] = {"resource": resource, "replicas": [r for _, r in replicas],
                             "chief": next(r for role, r in replicas if role == "chief"), "cancelled": False}
        return resource

    def _current(self, job_id: str) -> dict:
        job = self.jobs[job_id]
        failed = [r for r in job["replicas"] if r.popen.poll() not in (None, 0)]
        if job["cancelled"]:
            state, error = "JOB_STATE_CANCELLED", {"code": 1, "message": "CANCELED"}
        elif failed:
            replica = failed[0]
            state, error = "JOB_STATE_FAILED", {"code": 3, "message": (
                f"The replica {replica.name} exited with a non-zero status of {replica.popen.returncode}. "
                f"{replica.tail()}")}
        elif job["chief"].popen.poll() == 0:
            state, error = "JOB_STATE_SUCCEEDED", None
        else:
            state, error = "JOB_STATE_RUNNING", None
        if state != "JOB_STATE_RUNNING":
            for replica in job["replicas"]:
                replica.stop()
        return {**job["resource"], "state": state, **({"error": error} if error else {})}

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _route(self, method: str):
                standin.requests.append((method, self.path))
                if not self.headers.get("Authorization", "").startswith("Bearer "):
                    reply_json(self, 401, {"error": {"code": 401, "message": "no credentials"}})
                    return None
                match = _JOBS.match(self.path)
                if not match or (match.group(3) and match.group(3) not in standin.jobs):
                    reply_json(self, 404, {"error": {"code": 404, "message": f"no route {self.path}"}})
                    return None
                return match

            def do_POST(self):
                match = self._route("POST")
                if match is None:
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if match.group(4):  # :cancel
                    job = standin.jobs[match.group(3)]
                    job["cancelled"] = True
                    for replica in job["replicas"]:
                        replica.stop()
                    return reply_json(self, 200, {})
                created = standin._create(f"projects/{match.group(1)}/locations/{match.group(2)}", body)
                time.sleep(standin.create_reply_delay_s)
                return reply_json(self, 200, created)

            def do_GET(self):
                match = self._route("GET")
                if match is not None and standin.unavailable_reads > 0:  # a flaky control plane
                    standin.unavailable_reads -= 1
                    reply_json(self, 503, {"error": {"code": 503, "message": "try again", "status": "UNAVAILABLE"}})
                elif match is not None and match.group(3):
                    reply_json(self, 200, standin._current(match.group(3)))
                elif match is not None:  # a list, filtered by display name as aiplatform asks
                    wanted = re.fullmatch(r'display_name="([^"]*)"', parse_qs(urlparse(self.path).query)
                                          .get("filter", [""])[0])
                    jobs = [standin._current(job_id) for job_id, job in standin.jobs.items()
                            if wanted is None or job["resource"].get("displayName") == wanted.group(1)]
                    reply_json(self, 200, {"customJobs": jobs})

        return Handler
