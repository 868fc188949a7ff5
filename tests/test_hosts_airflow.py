"""Airflow on Celery across hosts: the penguin DAG, triggered through Airflow's REST API as the UI's form does, runs
each component task on a Celery worker of a worker host; artifacts go to the store on the storage host, the run
record to the MLflow server on the control host, and the Report view there reads the finished run from both."""
import json
import urllib.parse

from tests.helpers import store_env

RUN_TIMEOUT_S = 900


def test_the_penguin_dag_runs_its_tasks_on_celery_workers_of_the_worker_hosts(cluster_airflow, cluster_store):
    from hpml.pipelines import records
    from tests.cluster_services import MLFLOW_PORT

    airflow = cluster_airflow
    run_id = airflow.api("dags/penguin/dagRuns", "POST", {"logical_date": None, "conf": {"epochs": 2}})["dag_run_id"]
    run = airflow.wait_for_run("penguin", run_id, RUN_TIMEOUT_S)
    quoted = urllib.parse.quote(run_id, safe="")
    tasks = airflow.api(f"dags/penguin/dagRuns/{quoted}/taskInstances")["task_instances"]
    states = {t["task_id"]: t["state"] for t in tasks}
    failed = {task: json.dumps(airflow.api(f"dags/penguin/dagRuns/{quoted}/taskInstances/{task}/logs/1"
                                           "?full_content=true"))[-3000:]
              for task, state in states.items() if state == "failed"}
    assert run["state"] == "success", (states, failed)
    ran_on = {t["task_id"]: t["hostname"] for t in tasks}
    assert set(ran_on.values()) <= {"worker1", "worker2"}, ran_on

    with store_env({**cluster_store.env(None),
                    "MLFLOW_TRACKING_URI": f"http://{airflow.control.address}:{MLFLOW_PORT}"}):
        summary = records.load(records.find("airflow.run_id", run_id, "penguin"))
    assert summary.status == "FINISHED"
    # The run record says which host ran each component, as Airflow does.
    assert summary.hosts == {node: ran_on[node] for node in ("ExampleGen", "Transform", "Trainer")}
    assert summary.tags["hpml.run_dir"].startswith(f"{cluster_store.root}/airflow/penguin/")
    assert all(uri.startswith(cluster_store.root) for outputs in summary.outputs.values() for uri in outputs.values())

    status, body = airflow.get(f"/hpml/runs/penguin/{quoted}/status.json")
    assert status == 200, body[:500]
    status_json = json.loads(body)
    assert status_json["status"] == "FINISHED" and status_json["report"] is True
    assert [c["state"] for c in status_json["components"]] == ["done"] * 3
    status, body = airflow.get(f"/hpml/runs/penguin/{quoted}/report/report.html")
    assert status == 200 and f"penguin run {run_id}".encode() in body
