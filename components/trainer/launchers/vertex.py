"""Vertex AI launcher: render CustomJob worker pools (0 chief, 1 workers, 2 parameter servers), submit the
job with aiplatform over its REST transport, and poll it. A job still running when the wait ends (a
timeout, the Trainer task stopped or interrupted) is cancelled, so it cannot hold its accelerators on.
"""
from __future__ import annotations

import logging
import math

from hpml import KERAS_ENV
from hpml.components.errors import HpmlError
from hpml.components.trainer.launchers.cluster_job import ClusterJob
from hpml.components.trainer.launchers.polling import MAX_OUTAGE_S, poll
from hpml.components.trainer.launchers.stopping import wait_or_stop_job

log = logging.getLogger("hpml.launcher.vertex")

DEFAULT_MACHINE = "n1-standard-8"
DEFAULT_ACCELERATOR = "NVIDIA_TESLA_T4"


def render_worker_pool_specs(job: ClusterJob, machine_type: str = DEFAULT_MACHINE,
                             accelerator_type: str = DEFAULT_ACCELERATOR) -> list[dict]:
    """Worker pool specs in Vertex's order; Vertex sets CLUSTER_SPEC and TF_CONFIG in each replica."""
    env = [{"name": k, "value": v} for k, v in {**KERAS_ENV, **dict(sorted(job.env.items()))}.items()]
    container = {"image_uri": job.image, "command": job.command[:3], "args": job.command[3:], "env": env}

    def pool(replicas: int, accelerators: int) -> dict:
        machine: dict[str, str | int] = {"machine_type": machine_type}
        if accelerators:
            machine.update(accelerator_type=accelerator_type, accelerator_count=accelerators)
        return {"machine_spec": machine, "replica_count": replicas, "container_spec": dict(container)}

    roles = job.roles()
    specs = [pool(1, job.gpus_per_worker), pool(roles["worker"], job.gpus_per_worker)]
    if roles["ps"]:
        specs.append(pool(roles["ps"], 0))
    if not roles["worker"]:
        specs[1] = {}  # Vertex wants an empty pool to keep the positions
    return specs


def custom_job_spec(job: ClusterJob, **kwargs):
    """The aiplatform CustomJobSpec proto: proves the specs are well-formed without a network call."""
    from google.cloud.aiplatform.compat.types import custom_job as gca_custom_job  # type: ignore[attr-defined]

    return gca_custom_job.CustomJobSpec(worker_pool_specs=render_worker_pool_specs(job, **kwargs))


def scheduling(job: ClusterJob, timeout_s: float) -> dict:
    """CustomJob.submit's scheduling arguments. Vertex stops the job itself after `timeout_s` of running, so a
    Trainer killed before it can cancel (SIGKILL, a lost node) cannot leave accelerators held for Vertex's
    default of 7 days. MultiWorkerMirrored's collectives need the whole group, so a restarted replica restarts
    the whole job, as the local launcher restarts its cluster (BackupAndRestore resumes it); under
    parameter_server the coordinator goes on with a restarted worker, so that replica restarts alone."""
    return {"timeout": max(1, math.ceil(timeout_s)),
            "restart_job_on_worker_restart": job.strategy == "multi_worker_mirrored"}


class CustomJobFailed(HpmlError):
    """The CustomJob ended FAILED or CANCELLED: Vertex has stopped its replicas."""


def wait(custom_job, timeout_s: float, poll_s: float, outage_s: float = MAX_OUTAGE_S) -> str:
    """Poll the job's state until it succeeded (returns the state's name), failed or was cancelled (raises)."""
    from google.cloud.aiplatform.compat.types import job_state  # type: ignore[attr-defined]

    states = job_state.JobState
    name = custom_job.resource_name
    last = None
    for state in poll(lambda: custom_job.state, what=f"CustomJob {name}", timeout_s=timeout_s, poll_s=poll_s,
                      transient=_transient, outage_s=outage_s):  # .state fetches the job again
        if state != last:
            log.info("CustomJob %s: %s", name, state.name)
            last = state
        if state == states.JOB_STATE_SUCCEEDED:
            return state.name
        if state in (states.JOB_STATE_FAILED, states.JOB_STATE_CANCELLED, states.JOB_STATE_EXPIRED):
            raise CustomJobFailed(f"CustomJob {name} ended {state.name}: {custom_job.error.message}",
                                  hint=f"gcloud ai custom-jobs stream-logs {name}")
    raise AssertionError("poll() raises when its time is up")


def _transient(err: Exception) -> bool:
    """Worth another read: throttling, a server-side error, the connection failing on the way, or the
    client's own retry of those running out (aiplatform retries a read for up to 2 minutes itself)."""
    import requests
    from google.api_core import exceptions

    return isinstance(err, (exceptions.ServerError, exceptions.TooManyRequests, exceptions.RetryError,
                            requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError))


def _refused(err: BaseException) -> bool:
    """Vertex answered the create with a client error (400, 403, 409...): it created nothing."""
    from google.api_core import exceptions

    return isinstance(err, exceptions.ClientError)


def _cancel(custom_job, display_name: str) -> None:
    """Cancel the job. After a create that was cut short the job has no name here, but Vertex may have made
    it: every running job with this attempt's display name (unique to the attempt) is cancelled instead."""
    from google.cloud import aiplatform
    from google.cloud.aiplatform.compat.types import job_state  # type: ignore[attr-defined]

    try:
        created = bool(custom_job.resource_name)
    except RuntimeError:  # aiplatform's word for "not created"
        created = False
    if not created:
        ended = (job_state.JobState.JOB_STATE_SUCCEEDED, job_state.JobState.JOB_STATE_FAILED,
                 job_state.JobState.JOB_STATE_CANCELLED, job_state.JobState.JOB_STATE_EXPIRED)
        for found in aiplatform.CustomJob.list(filter=f'display_name="{display_name}"'):
            if found.gca_resource.state not in ended:
                log.warning("cancelling CustomJob %s, created by a submission that was cut short", found.resource_name)
                found.cancel()  # type: ignore[attr-defined]  # a CustomJob, typed as its base class
        return
    custom_job.cancel()


def run(job: ClusterJob, project: str, location: str, staging_bucket: str, *, timeout_s: float, poll_s: float,
        api_endpoint: str | None = None, **pool_kwargs) -> tuple[str, str]:
    """Create the CustomJob and wait for it (needs Google Cloud credentials: Application Default Credentials).
    Returns its resource name and final state; cancels it when the wait ends before the job does, or when a
    SIGTERM cuts its creation short (Vertex may have created it before it answered)."""
    from google.cloud import aiplatform

    aiplatform.init(project=project, location=location, staging_bucket=staging_bucket, api_endpoint=api_endpoint,
                    api_transport="rest")
    custom_job = aiplatform.CustomJob(display_name=job.name,
                                      worker_pool_specs=render_worker_pool_specs(job, **pool_kwargs))
    state = wait_or_stop_job(f"CustomJob {job.name}", lambda: wait(custom_job, timeout_s, poll_s),
                             lambda: _cancel(custom_job, job.name), job_ended=CustomJobFailed,
                             submit=lambda: custom_job.submit(**scheduling(job, timeout_s)), refused=_refused)
    return custom_job.resource_name, state
