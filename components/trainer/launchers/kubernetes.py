"""Kubernetes launcher: render a Kubeflow TFJob, submit it with the kubernetes client, wait for it.

The training operator creates the pods and gives each its TF_CONFIG; our worker entry point
does the rest, exactly as on loopback. A job whose wait ends before the job does (a timeout, the
Trainer task stopped or interrupted) is deleted, so it cannot hold its accelerators on after the task.

While it waits, the launcher also reads the job's pods. The operator's conditions say which replica
failed but not why; each container keeps the tail of its log as its termination message
(FallbackToLogsOnError), so a failure is reported with the worker's own error line. A container
that exited with USER_ERROR_EXIT (bad input or parameters) is not left to restartPolicy OnFailure,
which would rerun it up to backoffLimit times for the same error: the job is deleted at once.
"""
from __future__ import annotations

import copy
import logging
import math
from typing import cast
from dataclasses import dataclass
from pathlib import Path

import yaml

from hpml import KERAS_ENV
from hpml.components.errors import USER_ERROR_EXIT, HpmlError
from hpml.components.trainer.launchers.cluster_job import ClusterJob
from hpml.components.trainer.launchers.exits import error_summary
from hpml.components.trainer.launchers.polling import MAX_OUTAGE_S, poll
from hpml.components.trainer.launchers.stopping import wait_or_stop_job

log = logging.getLogger("hpml.launcher.kubernetes")

TEMPLATE = Path(__file__).resolve().with_name("tfjob.yaml")  # package data, beside this module
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
_REPLICA_NAMES = {"chief": "Chief", "worker": "Worker", "ps": "PS"}
REQUEST_TIMEOUT_S = 60  # an API server that stops answering must not hang the Trainer task
JOB_LABEL = "training.kubeflow.org/job-name"  # the operator puts it on every pod of the job


def render(job: ClusterJob, namespace: str = "default", deadline_s: float | None = None) -> dict:
    """The TFJob manifest for `job`, from tfjob.yaml (beside this module). With `deadline_s` (the Trainer's wait) the
    operator ends the job itself once it has been active that long, so a Trainer killed before it could
    delete the job (SIGKILL, a lost node) does not leave it holding its pods."""
    manifest = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    manifest["metadata"]["name"] = job.name
    manifest["metadata"]["namespace"] = namespace
    manifest["spec"]["runPolicy"]["backoffLimit"] = job.max_restarts
    if deadline_s is not None:
        manifest["spec"]["runPolicy"]["activeDeadlineSeconds"] = max(1, math.ceil(deadline_s))
    env = [{"name": k, "value": v} for k, v in {**KERAS_ENV, **dict(sorted(job.env.items()))}.items()]
    for role, replicas in job.roles().items():
        if replicas == 0:
            continue
        limits = {"cpu": job.cpu, "memory": job.memory}
        if job.gpus_per_worker and role != "ps":
            limits["nvidia.com/gpu"] = str(job.gpus_per_worker)
        container = {
            "name": "tensorflow",  # the training operator looks for this container name
            "image": job.image,
            "command": list(job.command),
            "env": copy.deepcopy(env),
            "resources": {"limits": limits, "requests": {"cpu": job.cpu, "memory": job.memory}},
            "ports": [{"name": "tfjob-port", "containerPort": 2222}],
            # A failed container keeps its log's tail as its termination message, which wait() quotes.
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
        manifest["spec"]["tfReplicaSpecs"][_REPLICA_NAMES[role]] = {
            "replicas": replicas,
            "restartPolicy": "OnFailure" if role != "ps" else "Always",
            "template": {"spec": {"containers": [container]}},
        }
    return manifest


def submit(manifest: dict, api_client) -> str:
    """Create the TFJob; returns its name."""
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    created = api.create_namespaced_custom_object(GROUP, VERSION, manifest["metadata"]["namespace"], PLURAL, manifest,
                                                  _request_timeout=REQUEST_TIMEOUT_S)
    return cast(dict, created)["metadata"]["name"]


class TFJobFailed(HpmlError):
    """The TFJob reached its Failed condition: the training operator has stopped its pods."""


class ReplicaRefusedInput(HpmlError):
    """A replica exited with USER_ERROR_EXIT: bad input or parameters, which no restart mends."""


@dataclass(frozen=True)
class ContainerExit:
    pod: str
    code: int
    error: str  # the worker's exception line, from its termination message; "" when there is none

    def __str__(self) -> str:
        return f"pod {self.pod} exited with code {self.code}" + (f": {self.error}" if self.error else "")


class PodExits:
    """Reads how the job's containers exited, now or before their last restart. Reading pods is extra: a
    Trainer whose service account may not list pods (403) waits on the conditions alone, and says so once."""

    def __init__(self, name: str, namespace: str, api_client):
        self.name, self.namespace, self.api_client = name, namespace, api_client
        self.readable = True

    def read(self) -> list[ContainerExit]:
        """Every exit with a non-zero code. Errors other than 401/403 are left for the next poll; nothing
        broader is caught, so Stopped (SIGTERM) still ends the wait."""
        import urllib3
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        if not self.readable:
            return []
        try:
            pods = client.CoreV1Api(self.api_client).list_namespaced_pod(
                self.namespace, label_selector=f"{JOB_LABEL}={self.name}", _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as err:
            if err.status in (401, 403):
                self.readable = False
                log.warning("cannot list the pods of TFJob %s/%s (%s): failures are reported without the worker's "
                            "error, and bad input is restarted up to backoffLimit; grant the Trainer's service "
                            "account \"list\" on pods", self.namespace, self.name, err.status)
            return []
        except (urllib3.exceptions.HTTPError, OSError) as err:  # read again at the next poll
            log.debug("listing the pods of TFJob %s/%s failed: %s", self.namespace, self.name, err)
            return []
        exits = []
        for pod in pods.items:
            for container in (pod.status and pod.status.container_statuses) or []:
                if container.name != "tensorflow":
                    continue
                for state in (container.state, container.last_state):
                    ended = state and state.terminated
                    if ended and ended.exit_code:
                        lines = (ended.message or "").splitlines()
                        exits.append(ContainerExit((pod.metadata and pod.metadata.name) or "?", ended.exit_code,
                                                   error_summary(lines, tail_if_no_exception=False)))
        return exits


def wait(name: str, namespace: str, api_client, timeout_s: float = 24 * 3600, poll_s: float = 10.0,
         outage_s: float = MAX_OUTAGE_S) -> dict:
    """Poll the TFJob's conditions until it Succeeded (returns its status) or Failed (raises TFJobFailed). A
    container that exited with USER_ERROR_EXIT raises ReplicaRefusedInput first, as no restart can mend it."""
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    pods = PodExits(name, namespace, api_client)
    last = None
    read = lambda: api.get_namespaced_custom_object_status(  # noqa: E731
        GROUP, VERSION, namespace, PLURAL, name, _request_timeout=REQUEST_TIMEOUT_S)
    for obj in poll(read, what=f"TFJob {namespace}/{name}", timeout_s=timeout_s, poll_s=poll_s,
                    transient=_transient, outage_s=outage_s):
        status = cast(dict, obj).get("status") or {}
        conditions = [c for c in status.get("conditions", []) if c.get("status") == "True"]
        latest = conditions[-1]["type"] if conditions else None
        if latest != last:
            log.info("TFJob %s/%s: %s", namespace, name, latest or "pending")
            last = latest
        if latest == "Succeeded":
            return status
        exits = pods.read()
        refused = [e for e in exits if e.code == USER_ERROR_EXIT]
        if refused:
            raise ReplicaRefusedInput(
                f"TFJob {namespace}/{name}: {refused[0]}; bad input or parameters, so the job is stopped, "
                "not restarted", hint="a restart would fail the same way: fix what the error names")
        if latest == "Failed":
            message = conditions[-1].get("message", "")
            # The replica's own failure, not a peer the operator stopped after it (137: SIGKILL, 143: SIGTERM).
            cause = min(exits, key=lambda e: (e.code >= 128, not e.error), default=None)
            raise TFJobFailed(f"TFJob {namespace}/{name} failed: {message}" + (f" {cause}" if cause else ""),
                              hint=f"kubectl -n {namespace} logs -l {JOB_LABEL}={name}")
    raise AssertionError("poll() raises when its time is up")


def _transient(err: Exception) -> bool:
    """Worth another read: throttling, a server-side error, or the connection failing on the way."""
    import urllib3
    from kubernetes.client.rest import ApiException

    if isinstance(err, ApiException):
        return err.status == 429 or (err.status or 0) >= 500
    return isinstance(err, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


def _refused(err: BaseException) -> bool:
    """The API server answered the create with a client error (403, 409, 422): it created nothing."""
    from kubernetes.client.rest import ApiException

    return isinstance(err, ApiException) and 400 <= (err.status or 0) < 500


def delete(name: str, namespace: str, api_client) -> None:
    """Delete the TFJob; the pods it owns go with it. One already gone is fine."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.CustomObjectsApi(api_client)
    try:
        api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, propagation_policy="Background",
                                            _request_timeout=REQUEST_TIMEOUT_S)
    except ApiException as err:
        if err.status != 404:
            raise


def run(manifest: dict, api_client, timeout_s: float, poll_s: float) -> tuple[str, dict]:
    """Submit the TFJob and wait until it succeeds (returns its name and status) or fails (raises). When the
    wait ends first, the job is deleted before the error goes on: a failed job is kept for its logs. The
    submission is watched too: a SIGTERM that arrives while the API server answers still deletes the job."""
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]

    def submit_and_say():
        submit(manifest, api_client)
        log.info("submitted TFJob %s/%s", namespace, name)

    status = wait_or_stop_job(f"TFJob {namespace}/{name}",
                              lambda: wait(name, namespace, api_client, timeout_s=timeout_s, poll_s=poll_s),
                              lambda: delete(name, namespace, api_client), job_ended=TFJobFailed,
                              submit=submit_and_say, refused=_refused)
    return name, status
