"""Vertex AI launcher: render CustomJob worker pools (0 chief, 1 workers, 2 parameter servers)."""
from __future__ import annotations

from components.trainer.launchers.cluster_job import ClusterJob

DEFAULT_MACHINE = "n1-standard-8"
DEFAULT_ACCELERATOR = "NVIDIA_TESLA_T4"


def render_worker_pool_specs(job: ClusterJob, machine_type: str = DEFAULT_MACHINE,
                             accelerator_type: str = DEFAULT_ACCELERATOR) -> list[dict]:
    """Worker pool specs in Vertex's order; Vertex sets CLUSTER_SPEC and TF_CONFIG in each replica."""
    env = [{"name": "TF_USE_LEGACY_KERAS", "value": "1"}] + [
        {"name": k, "value": v} for k, v in sorted(job.env.items())]
    container = {"image_uri": job.image, "command": job.command[:3], "args": job.command[3:], "env": env}

    def pool(replicas: int, accelerators: int) -> dict:
        machine = {"machine_type": machine_type}
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
    from google.cloud.aiplatform.compat.types import custom_job as gca_custom_job

    return gca_custom_job.CustomJobSpec(worker_pool_specs=render_worker_pool_specs(job, **kwargs))


def submit(job: ClusterJob, project: str, location: str, staging_bucket: str, **kwargs):
    """Create and run the CustomJob on Vertex AI (needs Google Cloud credentials)."""
    from google.cloud import aiplatform

    aiplatform.init(project=project, location=location, staging_bucket=staging_bucket)
    custom_job = aiplatform.CustomJob(display_name=job.name, worker_pool_specs=render_worker_pool_specs(job, **kwargs))
    custom_job.run(sync=True)
    return custom_job
