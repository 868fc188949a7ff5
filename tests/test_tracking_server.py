"""A production-shaped deployment on loopback: Debian's PostgreSQL holds Airflow 3's metadata (LocalExecutor) and
an MLflow tracking server's runs; the server keeps the artifacts in its own store. Two penguin runs go at once,
from the CLI and as DAG runs: both succeed, share no directory, and both records are whole on the server.
"""
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.services import MlflowServer, Postgres


@pytest.fixture(scope="module")
def postgres():
    server = Postgres().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tracking_server(postgres, tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), postgres.create_database("mlflow")).start()
    yield server
    server.stop()


def _files(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names)


def _check_records(server, experiment_name: str, seeds: list[int]) -> list:
    """The runs of the experiment with these seeds, one each, finished, with their parameters, metrics and
    artifacts on the server."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.url)
    experiment = client.get_experiment_by_name(experiment_name)
    assert experiment.artifact_location.startswith("mlflow-artifacts:"), experiment.artifact_location
    recorded = [r for r in client.search_runs([experiment.experiment_id]) if int(r.data.params["seed"]) in seeds]
    assert sorted(int(r.data.params["seed"]) for r in recorded) == sorted(seeds)
    stored = _files(server.artifacts)
    for run in recorded:
        assert run.info.status == "FINISHED"
        assert run.data.metrics["eval_accuracy"] > 0.5 and "duration_s.Trainer" in run.data.metrics
        assert {f.path for f in client.list_artifacts(run.info.run_id)} >= {"ExampleGen", "Transform", "Trainer",
                                                                             "report"}
        assert any(run.info.run_id in path and path.endswith("input_stall.json") for path in stored), \
            "the server's artifact store holds the run's files"
    return recorded


def test_two_cli_runs_at_once_are_recorded_whole_on_a_postgres_backed_server(tracking_server, tmp_path):
    home = tmp_path / "home"
    env = dict(os.environ, HPML_HOME=str(home), MLFLOW_TRACKING_URI=tracking_server.url)
    hpml = os.path.join(os.path.dirname(sys.executable), "hpml")
    logs = [open(tmp_path / f"run-{seed}.log", "w+") for seed in (1, 2)]  # files: a full pipe would stall a run
    runs = [subprocess.Popen([hpml, "run", "penguin", "--param", f"seed={seed}", "--param", "epochs=3"], cwd=REPO,
                             env=env, stdout=log, stderr=subprocess.STDOUT) for seed, log in zip((1, 2), logs)]
    codes = [run.wait(timeout=600) for run in runs]
    for log in logs:
        log.seek(0)
    assert codes == [0, 0], "\n".join(log.read()[-3000:] for log in logs)

    _check_records(tracking_server, "penguin", [1, 2])
    run_dirs = sorted(os.listdir(home / "artifacts" / "penguin"))
    assert len(run_dirs) == 2, run_dirs  # one directory each, shared by neither
    assert not (home / "mlartifacts").exists(), "no artifact was left on this machine's disk"


def test_two_dag_runs_at_once_on_airflow_with_postgres_and_the_local_executor(postgres, tracking_server, tmp_path):
    from airflow_stack import AirflowStack

    home = tmp_path / "home"
    stack = AirflowStack(tmp_path / "airflow", {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.create_database("airflow"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "AIRFLOW__CORE__PARALLELISM": "4",
        "HPML_SCHEDULE": "none", "HPML_HOME": str(home), "MLFLOW_TRACKING_URI": tracking_server.url}).start()
    try:
        stack.wait_for_dag("penguin")
        run_ids = [stack.api("dags/penguin/dagRuns", "POST", {"logical_date": None,
                                                               "conf": {"epochs": 3, "seed": seed}})["dag_run_id"]
                   for seed in (11, 12)]
        finished = [stack.wait_for_run("penguin", run_id, timeout=900) for run_id in run_ids]
        assert [run["state"] for run in finished] == ["success", "success"], \
            [stack.task_states("penguin", run_id) for run_id in run_ids]
    finally:
        stack.stop()
    recorded = _check_records(tracking_server, "penguin", [11, 12])
    assert sorted(r.data.tags["airflow.run_id"] for r in recorded) == sorted(run_ids)
    run_dirs = sorted(os.listdir(home / "artifacts" / "penguin"))
    assert len(run_dirs) == 2, run_dirs
    assert not (home / "mlartifacts").exists(), "no artifact was left on the worker's disk"
