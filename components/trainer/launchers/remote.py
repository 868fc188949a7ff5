"""The Trainer's remote launches: a Kubeflow TFJob, a Vertex AI CustomJob or a Slurm job running the worker
entry point on the job file the Trainer wrote.

The cluster must reach the artifact root (HPML_ARTIFACT_ROOT) as the Trainer task does: on an object store
(gs://), or on shared storage mounted at the same path in every pod or node (a PVC, NFS). `RemoteCluster` is the
Trainer's `cluster` parameter, typed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
import uuid
from dataclasses import dataclass

from hpml.components import files
from hpml.components.errors import SpecError
from hpml.components.trainer.launchers import vertex
from hpml.components.trainer.launchers.cluster_job import ClusterJob
from hpml.components.trainer.strategies import CLUSTER_STRATEGIES

log = logging.getLogger("hpml.launcher.remote")


@dataclass(frozen=True)
class RemoteCluster:
    """Where and how a remote Trainer job runs."""

    image: str = ""  # kubernetes, vertex: the training image
    namespace: str = "default"
    gpus_per_worker: int = 0
    cpu: str = "4"
    memory: str = "16Gi"
    kube_context: str | None = None  # None: in-cluster config, else the current kubeconfig context
    poll_seconds: float = 10.0
    timeout_seconds: float = 24 * 3600.0
    project: str | None = None  # Vertex AI
    location: str = "us-central1"
    staging_bucket: str | None = None
    api_endpoint: str | None = None  # None: the region's endpoint; else e.g. a Private Service Connect one
    machine_type: str = vertex.DEFAULT_MACHINE
    accelerator_type: str = vertex.DEFAULT_ACCELERATOR
    partition: str | None = None  # Slurm: None for the cluster's default partition
    python: str = "python"  # Slurm: the interpreter on the nodes, in an environment with hpml installed
    port: int = 8888  # Slurm: each task's TF gRPC port on its node
    shared_filesystem: bool = False  # Slurm: the artifact root is a mount every node has at the same path
    nodes: int = 0  # Slurm: the nodes the job's tasks share; 0: one node per task

    @classmethod
    def from_params(cls, launcher: str, raw: dict) -> RemoteCluster:
        """Validate the Trainer's `cluster` parameter for `launcher`; every problem names its field."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise SpecError(f"Trainer: cluster has unknown field(s) {', '.join(unknown)}",
                            hint=f"known fields: {', '.join(fields)}")
        for name, value in raw.items():  # the text fields: names, quantities, endpoints
            text, optional = fields[name].type in ("str", "str | None"), fields[name].type == "str | None"
            if text and not (isinstance(value, str) or (optional and value is None)):
                raise SpecError(f"Trainer: cluster.{name} must be a string, got {value!r}",
                                hint='e.g. "cpu": "4", "memory": "16Gi"')
        if launcher != "slurm" and not raw.get("image"):
            raise SpecError(f"Trainer: launcher {launcher!r} needs cluster.image, the training image to run",
                            hint="build it from infra/Dockerfile and push it where the cluster can pull it")
        if "shared_filesystem" in raw and not isinstance(raw["shared_filesystem"], bool):
            raise SpecError("Trainer: cluster.shared_filesystem must be true or false, "
                            f"got {raw['shared_filesystem']!r}")
        if "port" in raw and (not isinstance(raw["port"], int) or isinstance(raw["port"], bool)
                              or not 1024 <= raw["port"] <= 65000):
            raise SpecError(f"Trainer: cluster.port must be a port number from 1024 to 65000, got {raw['port']!r}")
        for name in ("gpus_per_worker", "nodes"):
            if name in raw and (not isinstance(raw[name], int) or isinstance(raw[name], bool) or raw[name] < 0):
                raise SpecError(f"Trainer: cluster.{name} must be a whole number >= 0, got {raw[name]!r}")
        for name in ("poll_seconds", "timeout_seconds"):
            if name in raw and (not isinstance(raw[name], (int, float)) or raw[name] <= 0):
                raise SpecError(f"Trainer: cluster.{name} must be a positive number, got {raw[name]!r}")
        if launcher == "vertex":
            missing = [name for name in ("project", "staging_bucket") if not raw.get(name)]
            if missing:
                raise SpecError(f"Trainer: launcher 'vertex' needs cluster.{' and cluster.'.join(missing)}")
        return cls(**raw)


def strategy_for(requested: str, num_ps: int) -> str:
    """A remote job runs a cluster strategy: auto means parameter_server with ps tasks, else MWMS."""
    if requested == "auto":
        return "parameter_server" if num_ps else "multi_worker_mirrored"
    if requested not in CLUSTER_STRATEGIES:
        raise SpecError(f"Trainer: a remote launcher runs multi_worker_mirrored or parameter_server, not {requested}",
                        hint="set strategy to auto, multi_worker_mirrored or parameter_server")
    return requested


def job_name(model_uri: str) -> str:
    """A Kubernetes name unique to this attempt: a retried task must not collide with its last job."""
    digest = hashlib.sha256(files.absolute(model_uri).encode()).hexdigest()[:10]
    return f"hpml-trainer-{digest}-{uuid.uuid4().hex[:6]}"


def kubernetes_api_client(context: str | None):
    """The kubernetes client, configured in-cluster (a pod) or from the kubeconfig (KUBECONFIG)."""
    from kubernetes import client, config

    if os.environ.get("KUBERNETES_SERVICE_HOST") and context is None:
        config.load_incluster_config()
        return client.ApiClient()
    configuration = client.Configuration()
    # KUBECONFIG is read now: the client library reads it once, when it is first imported.
    config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), context=context,
                            client_configuration=configuration)
    return client.ApiClient(configuration)


def check_reachable(launcher: str, cluster: RemoteCluster, working_dir: str) -> None:
    """A Slurm job's nodes read the job file and write backups and logs where the Trainer does: refuse a local
    working dir unless the cluster says it is a shared mount."""
    if launcher == "slurm" and not files.is_url(working_dir) and not cluster.shared_filesystem:
        raise SpecError(f"Trainer: launcher 'slurm' runs the workers on other hosts, which cannot read {working_dir} "
                        "on this one", hint="put the artifact root on an object store (HPML_ARTIFACT_ROOT=gs://...), "
                                            "or set cluster.shared_filesystem to true where it is a mount every "
                                            "node has")


def launch(launcher: str, cluster: RemoteCluster, job: ClusterJob, working_dir: str = "", progress: str = "",
           max_restarts: int = 2) -> dict:
    """Submit the job and wait for it; returns what the run record keeps. Raises if it fails."""
    started = time.monotonic()
    if launcher == "slurm":
        from hpml.components.trainer.launchers import slurm

        return slurm.run(job, working_dir, progress, partition=cluster.partition, python=cluster.python,
                         port=cluster.port, max_restarts=max_restarts, timeout_s=cluster.timeout_seconds,
                         poll_s=cluster.poll_seconds, nodes=cluster.nodes)
    if launcher == "kubernetes":
        from hpml.components.trainer.launchers import kubernetes as k8s

        api = kubernetes_api_client(cluster.kube_context)
        manifest = k8s.render(job, cluster.namespace, deadline_s=cluster.timeout_seconds)
        name, status = k8s.run(manifest, api, timeout_s=cluster.timeout_seconds, poll_s=cluster.poll_seconds)
        return {"launcher": "kubernetes", "job": f"{cluster.namespace}/{name}",
                "replicas": job.roles(), "seconds": time.monotonic() - started,
                "conditions": [c.get("type") for c in status.get("conditions", [])]}
    assert cluster.project and cluster.staging_bucket, "ClusterConfig.parse requires both for Vertex AI"
    name, state = vertex.run(job, cluster.project, cluster.location, cluster.staging_bucket,
                             timeout_s=cluster.timeout_seconds, poll_s=cluster.poll_seconds,
                             api_endpoint=cluster.api_endpoint, machine_type=cluster.machine_type,
                             accelerator_type=cluster.accelerator_type)
    return {"launcher": "vertex", "job": name, "replicas": job.roles(), "seconds": time.monotonic() - started,
            "state": state}
