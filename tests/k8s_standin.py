"""A loopback stand-in for a Kubernetes API server with Kubeflow's training operator behind it.

No cluster is reachable from the test machines. This stand-in answers the three TFJob calls the
Trainer makes through the real kubernetes client (create; read status; delete), and does what the
training operator does with a created TFJob: it starts every replica's container command, with
the container's env and a TF_CONFIG naming the replica's role and index in the job's cluster,
as a local process (the "image" is this checkout; `python` is this interpreter). Status follows
the processes: Running, then Succeeded when the chief and the workers that must finish exit 0.
A replica that exits non-zero is restarted in place, as the kubelet does under the replica's
restartPolicy OnFailure, while the job's restarts stay under runPolicy.backoffLimit (condition
Restarting); past it the job is Failed, with the operator's message, which names no error.
Each replica is also a pod in the pod list (label training.kubeflow.org/job-name), whose
container status carries its exit code and, under terminationMessagePolicy FallbackToLogsOnError,
the tail of its log as the termination message, before and after a restart (lastState).
"""
from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlparse

from hpml.components.trainer.launchers.local import free_ports
from tests.loopback_jobs import LoopbackJobService, Replica, reply_json

_ROLES = {"Chief": "chief", "Worker": "worker", "PS": "ps"}
_COLLECTION = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/tfjobs$")
_STATUS = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/tfjobs/([^/]+)/status$")
_OBJECT = re.compile(r"^/apis/kubeflow\.org/v1/namespaces/([^/]+)/tfjobs/([^/?]+)(\?.*)?$")
_PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
JOB_LABEL = "training.kubeflow.org/job-name"
# What the kubelet keeps of a failed container's log under FallbackToLogsOnError: its last 2048 bytes or 80 lines.
_MESSAGE_BYTES, _MESSAGE_LINES = 2048, 80


class TrainingOperatorStandIn(LoopbackJobService):
    """Start with `with TrainingOperatorStandIn(tmp) as operator:`; `operator.kubeconfig` points the client at it."""

    def __init__(self, workdir):
        super().__init__(workdir, self._handler())
        self.replica_env: dict[str, str] = {}  # what the nodes' environment adds (another machine's settings)
        self.deleted: list[str] = []
        self.kubeconfig = self.workdir / "kubeconfig"
        self.pods_forbidden = False  # answer pod lists 403, as for a service account without "list pods"
        self.create_reply_delay_s = 0.0  # create the job at once, answer the create this much later
        self._lock = threading.Lock()

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
            env = {**{e["name"]: e["value"] for e in container.get("env", [])}, **self.replica_env}
            for index in range(spec["replicas"]):
                name = f"{role}-{index}"
                replica = Replica(name, container["command"], env,
                                  {"cluster": cluster, "task": {"type": role, "index": index}},
                                  self.workdir / f"{manifest['metadata']['name']}-{name}.log")
                replica.restart_policy = spec.get("restartPolicy", "Never")
                replica.message_policy = container.get("terminationMessagePolicy", "File")
                replica.last_terminated = None
                replicas.append(replica)
        parameter_server = "ps" in cluster
        self.jobs[manifest["metadata"]["name"]] = {
            "manifest": manifest, "replicas": replicas, "cluster": cluster, "failed": None,
            # Under parameter servers only the chief (coordinator) finishes; servers run until stopped.
            "finishers": [r for r in replicas if not parameter_server or r.name.startswith("chief")]}

    def status(self, name: str) -> dict:
        with self._lock:
            return self._reconcile(name)

    def _reconcile(self, name: str) -> dict:
        job = self.jobs[name]
        conditions = [{"type": "Created", "status": "True"}]
        if job["failed"]:
            return {"conditions": conditions + [job["failed"]]}
        restarting = False
        for replica in job["replicas"]:
            code = replica.popen.poll()
            if code in (None, 0):
                continue
            backoff_limit = job["manifest"]["spec"]["runPolicy"].get("backoffLimit", 6)
            restarts = sum(r.restarts for r in job["replicas"])
            if replica.restart_policy in ("OnFailure", "Always") and restarts < backoff_limit:
                replica.last_terminated = self._terminated(replica, code)
                replica.restart()
                restarting = True
                continue
            kind = next(k for k, role in _ROLES.items() if replica.name.startswith(role + "-"))
            job["failed"] = {"type": "Failed", "status": "True",
                             "message": f"TFJob {job['manifest']['metadata']['namespace']}/{name} has failed "
                                        f"because 1 {kind} replica(s) failed."}
            for other in job["replicas"]:
                if other is not replica:
                    other.stop()
            return {"conditions": conditions + [job["failed"]]}
        if not restarting and all(r.popen.poll() == 0 for r in job["finishers"]):
            conditions.append({"type": "Succeeded", "status": "True"})
            for other in job["replicas"]:
                other.stop()
        else:
            conditions.append({"type": "Restarting" if restarting else "Running", "status": "True"})
        return {"conditions": conditions}

    @staticmethod
    def _terminated(replica: Replica, code: int) -> dict:
        state = {"exitCode": code if code >= 0 else 128 - code, "reason": "Error" if code else "Completed"}
        if code and replica.message_policy == "FallbackToLogsOnError":
            text = "\n".join(replica.current_log().splitlines()[-_MESSAGE_LINES:])
            state["message"] = text.encode()[-_MESSAGE_BYTES:].decode(errors="replace")
        return state

    def pods(self, namespace: str, selector: str) -> dict:
        """The job's pods as the API server lists them: one per replica, its container's state and the last one."""
        items = []
        with self._lock:
            for name, job in self.jobs.items():
                manifest = job["manifest"]
                if (manifest["metadata"]["namespace"] != namespace or selector != f"{JOB_LABEL}={name}"
                        or name in self.deleted):
                    continue
                for replica in job["replicas"]:
                    code = replica.popen.poll()
                    state = {"running": {}} if code is None else {"terminated": self._terminated(replica, code)}
                    last = {"terminated": replica.last_terminated} if replica.last_terminated else {}
                    items.append({
                        "metadata": {"name": f"{name}-{replica.name}", "namespace": namespace,
                                     "labels": {JOB_LABEL: name}},
                        "status": {"phase": "Running" if code is None else ("Succeeded" if code == 0 else "Failed"),
                                   "containerStatuses": [{
                                       "name": "tensorflow", "image": "standin", "imageID": "", "ready": code is None,
                                       "restartCount": replica.restarts, "state": state, "lastState": last}]}})
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

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
                time.sleep(operator.create_reply_delay_s)
                return self._reply(201, body)

            def do_GET(self):
                operator.requests.append(("GET", self.path))
                url = urlparse(self.path)
                pods = _PODS.match(url.path)
                if pods:
                    if operator.pods_forbidden:
                        return self._reply(403, {"kind": "Status", "reason": "Forbidden", "code": 403,
                                                 "message": 'pods is forbidden: cannot list resource "pods"'})
                    selector = parse_qs(url.query).get("labelSelector", [""])[0]
                    return self._reply(200, operator.pods(pods.group(1), selector))
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
