"""Stopping a running task from Airflow stops everything it started.

Marking a task failed (the UI's action; here its REST call) makes the api-server refuse the task's next
heartbeat; Airflow 3's supervisor then sends the task SIGTERM, whose handler only calls on_kill(), and
SIGKILL 5 s later. A real Airflow on loopback, a real penguin run with two training workers.
"""
import os
import time
import urllib.parse

from tests.test_distributed import _alive

RUN_TIMEOUT_S = 600


def _wait_for(what: str, check, timeout: float, stack):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(1)
    raise TimeoutError(f"waited {timeout:.0f}s for {what}; logs in {stack.logs}")


def test_marking_a_running_trainer_failed_stops_its_workers(stack):
    """Marked failed (the UI's action, here its REST call), the task's heartbeat is refused and Airflow's
    supervisor sends SIGTERM, then SIGKILL 5 s later. The launcher must stop its training processes,
    and the run record must say why."""
    import json
    import signal

    from hpml.pipelines import records
    from hpml.pipelines.paths import artifact_root, run_folder_name

    conf = {"epochs": 1000, "num_workers": 2, "strategy": "multi_worker_mirrored", "batch_size": 8}
    run_id = stack.api("dags/penguin/dagRuns", "POST", {"logical_date": None, "conf": conf})["dag_run_id"]
    quoted = urllib.parse.quote(run_id, safe="")
    model = os.path.join(artifact_root(), "penguin", run_folder_name(run_id), "Trainer", "model")
    pids_file = model + ".work/pids.json"

    def training():
        states = stack.task_states("penguin", run_id)
        if {"failed", "upstream_failed"} & set(states.values()) or states.get("Trainer") == "success":
            raise AssertionError(f"the Trainer did not get to train: {states}")
        if not os.path.exists(pids_file):
            return None
        pids = json.load(open(pids_file))
        return pids if len(pids) == 2 and all(map(_alive, pids.values())) else None

    pids = _wait_for("two training workers running", training, RUN_TIMEOUT_S, stack)
    try:
        stack.api(f"dags/penguin/dagRuns/{quoted}/taskInstances/Trainer", "PATCH", {"new_state": "failed"})
        alive = lambda: [name for name, pid in pids.items() if _alive(pid)]  # noqa: E731
        _wait_for("the workers stopped", lambda: not alive(), 120, stack)
    finally:
        for pid in pids.values():
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
    assert not os.path.exists(model), "a stopped Trainer publishes no model"
    mlflow_run_id = records.find("airflow.run_id", run_id, "penguin")
    tags = records.load(mlflow_run_id).tags
    assert tags["hpml.failed_node"] == "Trainer"
    assert "stopped by SIGTERM" in tags["hpml.error"], tags["hpml.error"]
