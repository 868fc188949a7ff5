"""A loopback stand-in for a Kubernetes API server with Kubeflow's training operator behind it.

No cluster is reachable from the test machines. This stand-in answers the three TFJob calls the
Trainer makes through the real kubernetes client (create; read status; delete), and does what the
training operator does with a created TFJob: it starts every replica's container command, with
the container's env and a TF_CONFIG naming the replica's role and index in the job's cluster,
as a local process (the "image" is this checkout; `python` is this interpreter). Status follows
the processes: Running, then Succeeded when the chief and the workers that must finish exit 0,
or Failed with the failing replica's last lines.
"""
from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler

from components.trainer.launchers.local import free_ports
from tests.loopback_jobs import LoopbackJobService, Replica, reply_json

_ROLES = {"Chief": "chief", "Worker": "worker", "PS": "ps"}
_COLLECTION = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/tfjobs$")
_STATUS = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/tfjobs/([^/]+)/status$")
_OBJECT = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/tfjobs/([^/?]+)(\?.*)?$")


class TrainingOperatorStandIn(LoopbackJobService):
    """Start with `with TrainingOperatorStandIn(tmp) as operator:`; `operator.kubeconfig` points the client at it."""

    def __init__(self, workdir):
        super().__init__(workdir, self._handler())
        self.deleted: list[str] = []
        self.kubeconfig = self.workdir / "kubeconfig"

    def __enter__(self):
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "tester"}}],
        }))
        return super().__enter__()

    def _start(self, manifest: dict) -> None:
        specs = manifest["spec"]["tfReplicaSpecs"]
        roles = [(_ROLES[kind], spec) for kind, spec in specs.items()]
        ports = iter(free_ports(sum(spec["replicas"] for _, spec in roles)))
        cluster = {role: [f"127.0.0.1:{next(ports)}" for _ in range(spec["replicas"])] for role, spec in roles}
        replicas = []
        for role, spec in roles:
            container = spec["template"]["spec"]["containers"][0]
            env = {e["name"]: e["value"] for e in container.get("env", [])}
            for index in range(spec["replicas"]):
                name = f"{role}-{index}"
                replicas.append(Replica(name, container["command"], env,
                                        {"cluster": cluster, "task": {"type": role, "index": index}},
                                        self.workdir / f"{manifest['metadata']['name']}-{name}.log"))
        parameter_server = "ps" in cluster
        self.jobs[manifest["metadata"]["name"]] = {
            "manifest": manifest, "replicas": replicas, "cluster": cluster,
            # Under parameter servers only the chief (coordinator) finishes; servers run until stopped.
            "finishers": [r for r in replicas if not parameter_server or r.name.startswith("chief")]}

    def status(self, name: str) -> dict:
        job = self.jobs[name]
        conditions = [{"type": "Created", "status": "True"}]
        failed = [r for r in job["replicas"] if r.popen.poll() not in (None, 0)]
        if failed:
            replica = failed[0]
            conditions.append({"type": "Failed", "status": "True",
                               "message": f"{replica.name} exited with code {replica.popen.returncode}: "
                                          f"{replica.tail()}"})
            for other in job["replicas"]:
                other.stop()
        elif all(r.popen.poll() == 0 for r in job["finishers"]):
            conditions.append({"type": "Succeeded", "status": "True"})
            for other in job["replicas"]:
                other.stop()
        else:
            conditions.append({"type": "Running", "status": "True"})
        return {"conditions": conditions}

    def _handler(self):
        operator = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, code, body):
                reply_json(self, code, body)

            def do_POST(self):
                operator.requests.append(("POST", self.path))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                match = _COLLECTION.match(self.path)
                if not match or match.group(1) != body["metadata"]["namespace"]:
                    return self._reply(404, {"kind": "Status", "message": f"no route {self.path}"})
                if body["metadata"]["name"] in operator.jobs:
                    return self._reply(409, {"kind": "Status", "reason": "AlreadyExists"})
                operator._start(body)
                return self._reply(201, body)

            def do_GET(self):
                operator.requests.append(("GET", self.path))
                match = _STATUS.match(self.path)
                if not match or match.group(2) not in operator.jobs or match.group(2) in operator.deleted:
                    return self._reply(404, {"kind": "Status", "message": f"no TFJob at {self.path}"})
                name = match.group(2)
                return self._reply(200, {**operator.jobs[name]["manifest"], "status": operator.status(name)})

            def do_DELETE(self):
                operator.requests.append(("DELETE", self.path))
                match = _OBJECT.match(self.path)
                if not match or match.group(2) not in operator.jobs:
                    return self._reply(404, {"kind": "Status", "reason": "NotFound", "code": 404})
                for replica in operator.jobs[match.group(2)]["replicas"]:  # the pods it owns go with it
                    replica.stop()
                operator.deleted.append(match.group(2))
                return self._reply(200, {"kind": "Status", "status": "Success"})

        return Handler
