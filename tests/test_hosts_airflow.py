"""Airflow on Celery across hosts: the penguin DAG and one that `hpml init` wrote, triggered through Airflow's REST
API as the UI's form does, run each component task on a Celery worker of a worker host; artifacts go to the store on
the storage host, the run record to the MLflow server on the control host, and the Report view there reads the
finished run from both."""
import datetime
import json
import re
import time
import urllib.parse

import pytest

from tests.helpers import assert_same_weights, served_weights, store_env

RUN_TIMEOUT_S = 900
# The fault-free penguin run and the one that loses hosts: two workers train in the Trainer's task, long enough that
# its host can die mid-training with backups on the store.
PENGUIN_CONF = {"epochs": 6, "batch_size": 8, "num_workers": 2, "strategy": "multi_worker_mirrored",
                "steps_per_execution": 1}
STEPS_PER_EPOCH = 28  # penguin's 217 training rows in batches of 8


def _finished(airflow, cluster_store, dag_id: str, run_id: str):
    """The run's record, once Airflow says it succeeded; each task ran on a worker host, and so the record says."""
    from hpml.pipelines import records

    run = airflow.wait_for_run(dag_id, run_id, RUN_TIMEOUT_S)
    quoted = urllib.parse.quote(run_id, safe="")
    tasks = airflow.api(f"dags/{dag_id}/dagRuns/{quoted}/taskInstances")["task_instances"]
    assert run["state"] == "success", _run_state(airflow, dag_id, run_id)
    ran_on = {t["task_id"]: t["hostname"] for t in tasks}
    assert set(ran_on.values()) <= {"worker1", "worker2"}, ran_on
    with store_env({**cluster_store.env(None), "MLFLOW_TRACKING_URI": airflow.mlflow_uri}):
        summary = records.load(records.find("airflow.run_id", run_id, dag_id))
    assert summary.status == "FINISHED"
    # The run record says which host ran each component, as Airflow does.
    assert summary.hosts == {node: ran_on[node] for node in ("ExampleGen", "Transform", "Trainer", "Gate", "Pusher")}
    assert summary.tags["hpml.run_dir"].startswith(f"{cluster_store.root}/airflow/{dag_id}/")
    assert all(uri.startswith(cluster_store.root) for outputs in summary.outputs.values() for uri in outputs.values())
    # The serving folder is on the store too, so the Gate on one host sees what the Pusher on another published.
    with store_env(cluster_store.env(None)):
        from hpml.components import files
        from hpml.components.pusher import serving_dir
        from hpml.pipelines import shipping

        push = shipping.outcome(summary.outputs)["push"]
        assert push["destination"] == f"{cluster_store.root}/airflow/_serving/{dag_id}", push
        assert push["version"] in serving_dir.versions(push["destination"])
        assert files.isfile(f"{serving_dir.version_path(push['destination'], push['version'])}/saved_model.pb")
    return summary


@pytest.fixture(scope="module")
def plain_runs(cluster_airflow, cluster_store, tmp_path_factory):
    """The quickstart's project, as `hpml init` writes it, deployed beside penguin (its DAG file in the dags folder,
    its CSV on the store), and both DAGs triggered at once, with no fault: {dag_id: (run_id, record)}."""
    import tensorflow as tf

    from hpml.pipelines import scaffold
    from tests.helpers import quickstart_csv

    airflow = cluster_airflow
    csv = quickstart_csv(tmp_path_factory.mktemp("churn"))
    scaffold.init_project("churn", str(csv), "churned", directory=str(airflow.code / "projects"),
                          dags_folder=str(airflow.dags))
    data = f"{cluster_store.root}/data/customers.csv"
    with store_env(cluster_store.env(None)):
        tf.io.gfile.makedirs(f"{cluster_store.root}/data")
        tf.io.gfile.copy(str(csv), data, overwrite=True)
    airflow.wait_for_dag("churn")
    confs = {"penguin": PENGUIN_CONF, "churn": {"epochs": 2, "data_path": data}}
    runs = {dag_id: airflow.api(f"dags/{dag_id}/dagRuns", "POST", {"logical_date": None, "conf": conf})["dag_run_id"]
            for dag_id, conf in confs.items()}
    return {dag_id: (run_id, _finished(airflow, cluster_store, dag_id, run_id)) for dag_id, run_id in runs.items()}


def test_the_penguin_dag_and_an_hpml_init_dag_run_their_tasks_on_celery_workers_of_the_worker_hosts(
        cluster_airflow, cluster_store, plain_runs):
    airflow = cluster_airflow
    runs = {dag_id: run_id for dag_id, (run_id, _) in plain_runs.items()}
    churn = plain_runs["churn"][1]
    assert churn.examples and sum(churn.examples.values()) == 600
    assert churn.params["data_path"] == f"{cluster_store.root}/data/customers.csv"

    # The Report view on the control host reads the finished run from the store.
    quoted = urllib.parse.quote(runs["penguin"], safe="")
    status, body = airflow.get(f"/hpml/runs/penguin/{quoted}/status.json")
    assert status == 200, body[:500]
    status_json = json.loads(body)
    assert status_json["status"] == "FINISHED" and status_json["report"] is True
    assert [c["state"] for c in status_json["components"]] == ["done"] * 5
    status, body = airflow.get(f"/hpml/runs/penguin/{quoted}/report/report.html")
    assert status == 200 and f"penguin run {runs['penguin']}".encode() in body


def _run_state(airflow, dag_id: str, run_id: str) -> str:
    """Where a run stands, for an assertion message: its state, each task's state, try and host, and the end of
    each failed try's log (a retried task's earlier tries included)."""
    quoted = urllib.parse.quote(run_id, safe="")
    run = airflow.api(f"dags/{dag_id}/dagRuns/{quoted}")
    tasks = airflow.api(f"dags/{dag_id}/dagRuns/{quoted}/taskInstances")["task_instances"]
    lines = [f"run {run_id}: {run['state']}"]
    lines += [f"  {t['task_id']}: {t['state']}, try {t['try_number']} on {t['hostname']}, "
              f"{_clock(t.get('start_date'))} to {_clock(t.get('end_date'))}" for t in tasks]
    for task in tasks:
        tries = [task["try_number"]] if task["state"] in ("failed", "up_for_retry") else []
        tries = list(range(1, task["try_number"])) + tries  # a task's earlier tries failed, whatever it did next
        for number in tries:
            content = airflow.api(f"dags/{dag_id}/dagRuns/{quoted}/taskInstances/{task['task_id']}/logs/"
                                  f"{number}?full_content=true")["content"]
            events = content.splitlines() if isinstance(content, str) else [_log_line(e) for e in content]
            lines += [f"--- {task['task_id']} try {number}:", *events[-30:]]
    return "\n".join(lines)


def _clock(iso: str | None) -> str:
    """An Airflow timestamp as this machine's time of day, to set beside the test's own (a cut, a kill)."""
    if not iso:
        return "-"
    return datetime.datetime.fromisoformat(iso).astimezone().strftime("%H:%M:%S")


def _log_line(event: dict) -> str:
    """One structured Airflow 3 log event as text, with the exception it carries: Airflow keeps a task's traceback
    in `error_detail`, not in the event's text."""
    line = str(event.get("event", ""))
    for error in event.get("error_detail") or ():
        frames = error.get("frames") or [{}]
        where = f"{frames[-1].get('filename', '?')}:{frames[-1].get('lineno', '?')}"
        line += f"\n    {error.get('exc_type')}: {error.get('exc_value')} (at {where})"
    return line


def _task(airflow, dag_id: str, run_id: str, task_id: str) -> dict:
    quoted = urllib.parse.quote(run_id, safe="")
    return airflow.api(f"dags/{dag_id}/dagRuns/{quoted}/taskInstances/{task_id}")


def test_a_cut_off_transform_host_a_dead_trainer_host_and_a_redis_restart_cost_retries_and_lose_nothing(
        cluster, cluster_airflow, cluster_store, plain_runs):
    """Three faults in one run, each survived:
    - the worker host running Transform loses its network for 30 s, longer than Airflow waits for a task's
      heartbeat: Airflow retries Transform on the other host while the first attempt is cut off;
    - mid-training, Celery's broker restarts;
    - at the same moment the worker host running the Trainer dies (every process on it SIGKILLed): Airflow retries
      the Trainer on the other host, which resumes from the backup on the store. (Where Transform's retry and the
      Trainer run fast, that is while the other host is still cut off, and the retry waits for it.)
    The run succeeds; every artifact holds exactly the files its manifest lists, and the examples, transformed rows,
    vocabularies, the model's weights and its eval equal the fault-free run's."""
    from tests.test_beam_processes import _assets, _records, _rows

    airflow = cluster_airflow
    run_id = airflow.api("dags/penguin/dagRuns", "POST", {"logical_date": None, "conf": PENGUIN_CONF})["dag_run_id"]
    quoted = urllib.parse.quote(run_id, safe="")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (transform := _task(airflow, "penguin", run_id, "Transform"))["state"] != "running":
        assert time.monotonic() < deadline and transform["state"] not in ("success", "failed"), transform
        time.sleep(0.5)
    with store_env({**cluster_store.env(None), "MLFLOW_TRACKING_URI": airflow.mlflow_uri}):
        from hpml.components import files
        from hpml.pipelines import records

        run_dir = records.load(records.find("airflow.run_id", run_id, "penguin")).tags["hpml.run_dir"]
        while not list(files.walk_files(f"{run_dir}/Transform")):  # until its outputs start to appear on the store
            assert time.monotonic() < deadline and _task(airflow, "penguin", run_id, "Transform")["state"] == "running"
            time.sleep(0.2)
    now = _task(airflow, "penguin", run_id, "Transform")
    assert (now["state"], now["try_number"]) == ("running", transform["try_number"]), \
        "Transform's first try ended before its host was cut off:\n" + _run_state(airflow, "penguin", run_id)
    cut = cluster[transform["hostname"]]
    cut.disconnect()
    reconnect_at: float | None = time.monotonic() + 30
    faults = f"{cut.name} cut off at {time.strftime('%H:%M:%S')} for 30 s"
    try:
        epoch = 0
        while epoch < 3:  # backups are written at each epoch's end: two are on the store
            if reconnect_at is not None and time.monotonic() >= reconnect_at:
                cut.reconnect()
                reconnect_at = None
            ended = airflow.api(f"dags/penguin/dagRuns/{quoted}")["state"] in ("success", "failed") or \
                _task(airflow, "penguin", run_id, "Trainer")["state"] in ("success", "failed")
            assert time.monotonic() < deadline and not ended, \
                f"the Trainer never got to its third epoch ({faults}):\n" + _run_state(airflow, "penguin", run_id)
            status, body = airflow.get(f"/hpml/runs/penguin/{quoted}/status.json")
            training = json.loads(body).get("training", {}).get("Trainer") if status == 200 else None
            epoch = (training or {}).get("epoch", 0)
            time.sleep(1)
        # Where Transform's retry and the Trainer ran fast, the Trainer's host dies while the other is still cut off.
        lost = cluster[_task(airflow, "penguin", run_id, "Trainer")["hostname"]]
        survivor = next(w for w in airflow.workers if w is not lost)
        airflow.restart_redis()
        killed, killed_at = lost.kill(), time.time()
        assert killed >= 3, "the Celery worker, the task and its training processes"
        if reconnect_at is not None:  # the cut lasts its 30 s
            time.sleep(max(0.0, reconnect_at - time.monotonic()))
    finally:
        if reconnect_at is not None:
            cut.reconnect()
    try:
        record = _finished(airflow, cluster_store, "penguin", run_id)
    finally:
        airflow.start_worker(lost)  # the host is back for the tests after this one

    transform, trainer = (_task(airflow, "penguin", run_id, task) for task in ("Transform", "Trainer"))
    print(f"Transform: try {transform['try_number']} on {transform['hostname']}; {cut.name} was cut off")
    assert trainer["try_number"] == 2 and trainer["hostname"] == survivor.name, trainer
    retried_after = datetime.datetime.fromisoformat(trainer["start_date"]).timestamp() - killed_at
    print(f"the Trainer's host died; Airflow started it again on {survivor.name} {retried_after:.0f}s later")
    log = json.dumps(airflow.api(f"dags/penguin/dagRuns/{quoted}/taskInstances/Trainer/logs/2?full_content=true"))
    resumed = [int(n) for n in re.findall(r"resuming from the backup after (\d+) training steps", log)]
    assert resumed and min(resumed) >= STEPS_PER_EPOCH, f"the retry resumed from a backup on the store: {resumed}"

    from hpml.components import artifacts

    plain = plain_runs["penguin"][1]
    with store_env(cluster_store.env(None)):
        for node, outputs in record.outputs.items():
            for key, uri in outputs.items():
                artifacts.require_published(uri, f"{node}'s {key}")
                # Whole and alone: exactly the files its manifest lists, none from an attempt that was cut off.
                manifest = json.loads(files.read_text(f"{uri}/{artifacts.PUBLISHED_FILE}"))["files"]
                present = {path: size for path, size in files.walk_files(uri) if path != artifacts.PUBLISHED_FILE}
                assert present == manifest, (node, key)
        got, want = record.outputs, plain.outputs
        for split in ("train", "eval"):
            assert _records(got["ExampleGen"]["examples"], split) == _records(want["ExampleGen"]["examples"], split)
            assert (_rows(got["Transform"]["transformed_examples"], split) ==
                    _rows(want["Transform"]["transformed_examples"], split)).all()
        assert _assets(got["Transform"]["transform_graph"]) == _assets(want["Transform"]["transform_graph"])
        # The Trainer that lost its host trained the model a Trainer that lost nothing trains.
        assert_same_weights(served_weights(got["Trainer"]["model"]), served_weights(want["Trainer"]["model"]))
    assert record.eval_metrics and record.eval_metrics == plain.eval_metrics
