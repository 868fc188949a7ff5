"""What a remote training job needs, whatever runs it: roles, image, resources, the job file."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from hpml.components.errors import SpecError

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# Launchers that run the workers on a cluster, and every launcher the Trainer knows.
REMOTE_LAUNCHERS = ("kubernetes", "vertex", "slurm")
LAUNCHERS = ("local", *REMOTE_LAUNCHERS)


@dataclass(frozen=True)
class ClusterJob:
    name: str
    image: str
    job_uri: str  # the job JSON the worker entry point reads (a shared volume path or gs://)
    strategy: str  # multi_worker_mirrored or parameter_server
    num_workers: int = 2  # chief included for multi_worker_mirrored
    num_ps: int = 0
    gpus_per_worker: int = 0
    cpu: str = "4"
    memory: str = "16Gi"
    max_restarts: int = 2
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise SpecError(f"job name {self.name!r} is not a valid Kubernetes name",
                            hint="lower-case letters, digits and '-', at most 63 characters")
        if self.strategy not in ("multi_worker_mirrored", "parameter_server"):
            raise SpecError(f"a cluster job needs multi_worker_mirrored or parameter_server, not {self.strategy}")
        if self.strategy == "parameter_server" and self.num_ps < 1:
            raise SpecError("parameter_server needs num_ps >= 1")
        if self.num_workers < 1 or self.gpus_per_worker < 0:
            raise SpecError("num_workers must be >= 1 and gpus_per_worker >= 0")

    @property
    def command(self) -> list[str]:
        return ["python", "-m", "hpml.components.trainer.worker", self.job_uri]

    def roles(self) -> dict[str, int]:
        """Replica counts: a chief (the coordinator under PS), workers, parameter servers."""
        if self.strategy == "parameter_server":
            return {"chief": 1, "worker": self.num_workers, "ps": self.num_ps}
        return {"chief": 1, "worker": self.num_workers - 1, "ps": 0}
