"""The strategy decision table, one row per rule, on simulated inventories."""
import json

import pytest

from hpml.components.errors import SpecError
from hpml.components.trainer.plan import GiB, ClusterInfo, DeviceInventory, ModelMemory, decide

SMALL = ModelMemory(params=1_000_000)          # 16 MB with Adam state
HUGE = ModelMemory(params=5_000_000_000)       # 80 GB with Adam state
HEAVY_VARS = ModelMemory(params=700_000_000)   # 11.2 GB of variables + state
GPU16 = 16 * GiB

TABLE = [
    # (inventory, cluster, memory, expected strategy, words the reason must contain)
    (DeviceInventory(tpus=8), ClusterInfo(), SMALL, "tpu", "8 TPU cores"),
    (DeviceInventory(gpus=2, gpu_memory_bytes=GPU16), ClusterInfo(workers=2, ps=1), SMALL,
     "parameter_server", "1 parameter server"),
    (DeviceInventory(gpus=1, gpu_memory_bytes=GPU16), ClusterInfo(workers=3), SMALL,
     "multi_worker_mirrored", "3 workers"),
    (DeviceInventory(gpus=4, gpu_memory_bytes=GPU16), ClusterInfo(), HUGE, "gpipe", "GPipe pipeline over 4 GPUs"),
    (DeviceInventory(gpus=2, gpu_memory_bytes=GPU16), ClusterInfo(), HEAVY_VARS,
     "central_storage", "over half of one GPU"),
    (DeviceInventory(gpus=2, gpu_memory_bytes=GPU16), ClusterInfo(), SMALL, "mirrored", "2 local GPUs"),
    (DeviceInventory(gpus=1, gpu_memory_bytes=GPU16), ClusterInfo(), SMALL, "one_device", "one GPU"),
    (DeviceInventory(host_memory_bytes=24 * GiB), ClusterInfo(), SMALL, "one_device", "no accelerator"),
    (DeviceInventory(gpus=1, gpu_memory_bytes=GPU16), ClusterInfo(), HUGE, "one_device",
     "use gradient accumulation or rematerialisation"),
    (DeviceInventory(gpus=2, gpu_memory_bytes=GPU16), ClusterInfo(), None, "mirrored", "2 local GPUs"),
]


@pytest.mark.parametrize("inventory, cluster, memory, strategy, reason", TABLE)
def test_decision_table(inventory, cluster, memory, strategy, reason):
    plan = decide(inventory, cluster, memory)
    assert plan.strategy == strategy
    assert reason in plan.explain()


def test_rule_precedence_tpu_beats_cluster_and_cluster_beats_gpus():
    assert decide(DeviceInventory(tpus=8, gpus=4), ClusterInfo(workers=4, ps=2), SMALL).strategy == "tpu"
    assert decide(DeviceInventory(gpus=8, gpu_memory_bytes=GPU16), ClusterInfo(workers=2), HUGE).strategy == \
        "multi_worker_mirrored"


def test_requested_strategies_are_checked():
    plan = decide(DeviceInventory(), ClusterInfo(), SMALL, requested="mirrored")
    assert plan.strategy == "mirrored" and "requested by parameter" in plan.reasons[0]
    with pytest.raises(SpecError, match="no TPU"):
        decide(DeviceInventory(), ClusterInfo(), SMALL, requested="tpu")
    with pytest.raises(SpecError, match="needs a cluster with ps tasks"):
        decide(DeviceInventory(), ClusterInfo(), SMALL, requested="parameter_server")


def test_cluster_from_tf_config():
    tf_config = {"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"], "ps": ["d:1"]},
                 "task": {"type": "worker", "index": 0}}
    assert ClusterInfo.from_tf_config(json.dumps(tf_config)) == ClusterInfo(workers=3, ps=1)
    assert ClusterInfo.from_tf_config(None) == ClusterInfo()
    with pytest.raises(SpecError, match="TF_CONFIG"):
        ClusterInfo.from_tf_config("not json")


def test_memory_estimate_arithmetic():
    memory = ModelMemory(params=1000, bytes_per_param=4, optimizer_factor=4, activation_bytes=500)
    assert memory.total_bytes == 1000 * 4 * 4 + 500
