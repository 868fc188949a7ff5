"""Choose a distribution strategy from the devices, the cluster and the model's memory needs.

`decide` is pure: it takes an inventory, a cluster description and a memory estimate and
returns a Plan that explains each choice in plain words, for the run record.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass, field

from hpml.components.errors import SpecError

GiB = 1024 ** 3


@dataclass(frozen=True)
class DeviceInventory:
    gpus: int = 0
    gpu_memory_bytes: int = 0  # per GPU
    tpus: int = 0
    host_memory_bytes: int = 0


@dataclass(frozen=True)
class ClusterInfo:
    workers: int = 1  # chief included
    ps: int = 0

    @classmethod
    def from_tf_config(cls, text: str | None) -> ClusterInfo:
        if not text:
            return cls()
        try:
            cluster = json.loads(text).get("cluster", {})
        except (json.JSONDecodeError, AttributeError):
            raise SpecError("TF_CONFIG is not a JSON object with a 'cluster' key") from None
        workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
        return cls(workers=max(workers, 1), ps=len(cluster.get("ps", [])))


@dataclass(frozen=True)
class ModelMemory:
    """Parameters x bytes x an optimizer-state factor, plus activations."""

    params: int
    bytes_per_param: int = 4
    optimizer_factor: float = 4.0  # weights, gradients and Adam's two moments
    activation_bytes: int = 0

    @property
    def variable_bytes(self) -> float:
        return self.params * self.bytes_per_param * self.optimizer_factor

    @property
    def total_bytes(self) -> float:
        return self.variable_bytes + self.activation_bytes


@dataclass
class Plan:
    strategy: str
    reasons: list[str] = field(default_factory=list)
    num_devices: int = 1
    inventory: dict = field(default_factory=dict)
    cluster: dict = field(default_factory=dict)
    model_bytes: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def explain(self) -> str:
        return f"{self.strategy}: " + "; ".join(self.reasons)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def decide(inventory: DeviceInventory, cluster: ClusterInfo, memory: ModelMemory | None,
           requested: str = "auto") -> Plan:
    plan = Plan("one_device", inventory=asdict(inventory), cluster=asdict(cluster),
                model_bytes=memory.total_bytes if memory else None)
    device_memory = inventory.gpu_memory_bytes if inventory.gpus else inventory.host_memory_bytes
    local_devices = max(inventory.gpus, 1)
    needed = memory.total_bytes if memory is not None else 0.0  # unknown: taken to fit
    fits = device_memory == 0 or needed <= device_memory
    if requested != "auto":
        return _requested(plan, requested, inventory, cluster)
    if inventory.tpus:
        plan.strategy, plan.num_devices = "tpu", inventory.tpus
        plan.reasons.append(f"{inventory.tpus} TPU cores found: TPUStrategy")
    elif cluster.ps:
        plan.strategy = "parameter_server"
        plan.num_devices = cluster.workers
        plan.reasons.append(f"the cluster has {cluster.ps} parameter server(s) and {cluster.workers} worker(s): "
                            "asynchronous training with ParameterServerStrategy")
    elif cluster.workers > 1:
        plan.strategy, plan.num_devices = "multi_worker_mirrored", cluster.workers * local_devices
        plan.reasons.append(f"{cluster.workers} workers and no parameter servers: synchronous all-reduce "
                            "with MultiWorkerMirroredStrategy")
    elif not fits and inventory.gpus >= 2:
        plan.strategy, plan.num_devices = "gpipe", inventory.gpus
        plan.reasons.append(f"the model needs about {_gib(needed)} but one GPU has "
                            f"{_gib(device_memory)}: split it into a GPipe pipeline over {inventory.gpus} GPUs")
    elif inventory.gpus >= 2:
        plan.num_devices = inventory.gpus
        if memory is not None and memory.variable_bytes > 0.5 * inventory.gpu_memory_bytes:
            plan.strategy = "central_storage"
            plan.reasons.append(f"{inventory.gpus} local GPUs; variables and optimizer state take "
                                f"{_gib(memory.variable_bytes)}, over half of one GPU's {_gib(device_memory)}: "
                                "keep variables on the host with CentralStorageStrategy")
        else:
            plan.strategy = "mirrored"
            plan.reasons.append(f"{inventory.gpus} local GPUs: replicate the model with MirroredStrategy")
    else:
        where = "one GPU" if inventory.gpus == 1 else "no accelerator (CPU)"
        plan.reasons.append(f"{where}, one worker: a single device")
        if not fits:
            plan.reasons.append(f"warning: the model needs about {_gib(needed)} but the device has "
                                f"{_gib(device_memory)}; use gradient accumulation or rematerialisation")
    if memory is not None and plan.strategy != "tpu":
        plan.reasons.append(f"memory estimate {_gib(memory.total_bytes)} ({memory.params:,} parameters)")
    return plan


def _requested(plan: Plan, requested: str, inventory: DeviceInventory, cluster: ClusterInfo) -> Plan:
    if requested == "tpu" and not inventory.tpus:
        raise SpecError("strategy 'tpu' was requested but no TPU was found")
    if requested == "parameter_server" and not cluster.ps:
        raise SpecError("strategy 'parameter_server' needs a cluster with ps tasks",
                        hint="use the local launcher with num_ps >= 1, or a TF_CONFIG that lists ps")
    if requested == "gpipe" and max(inventory.gpus, 1) < 2:
        plan.reasons.append("gpipe on one physical device: stages share it (logical devices)")
    plan.strategy = requested
    plan.num_devices = cluster.workers if requested in ("multi_worker_mirrored", "parameter_server") else \
        max(inventory.gpus, 1)
    plan.reasons.insert(0, f"strategy {requested!r} requested by parameter")
    return plan


def discover_inventory() -> DeviceInventory:
    """What this process can see: GPUs (memory from nvidia-smi when present), TPUs, host RAM."""
    import psutil
    import tensorflow as tf

    gpus = len(tf.config.list_physical_devices("GPU"))
    gpu_memory = 0
    if gpus:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=20)
            values = [int(v) for v in out.stdout.split()]
            gpu_memory = min(values) * 1024 * 1024 if values else 0
        except (OSError, ValueError, subprocess.TimeoutExpired):
            gpu_memory = 0
    tpus = len(tf.config.list_logical_devices("TPU"))
    return DeviceInventory(gpus=gpus, gpu_memory_bytes=gpu_memory, tpus=tpus,
                           host_memory_bytes=psutil.virtual_memory().total)


def discover_cluster() -> ClusterInfo:
    return ClusterInfo.from_tf_config(os.environ.get("TF_CONFIG"))
