"""A production-shaped deployment on loopback: Debian's PostgreSQL holds Airflow 3's metadata (LocalExecutor) and
an MLflow tracking server's runs; the server keeps the artifacts in the object store (gs://, gcp-storage-emulator).
Two penguin runs go at once, from the CLI and as DAG runs (their artifacts on s3://, moto's server): both succeed,
share no directory, and both records are whole on the server. The Report view reads the DAG runs from s3://.
"""
import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.services import MlflowServer, Postgres


@pytest.fixture(scope="module")
def postgres():
    server = Postgres().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tracking_server(postgres, gcs_server, tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), postgres.create_database("mlflow"),
                          f"{gcs_server.root}/mlflow", gcs_server.env()).start()
    yield server
    server.stop()


def _files(root: str) -> list[str]:
    """Every file under a gs:// or s3:// root, relative to it."""
    from hpml.components import files

    return [path for path, _ in files.walk_files(root)]


def _check_records(server, experiment_name: str, seeds: list[int]) -> list:
    """The runs of the experiment with these seeds, one each, finished, with their parameters, metrics and
    artifacts on the server."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(server.url)
    experiment = client.get_experiment_by_name(experiment_name)
    assert experiment.artifact_location.startswith("mlflow-artifacts:"), experiment.artifact_location
    recorded = [r for r in client.search_runs([experiment.experiment_id]) if int(r.data.params["seed"]) in seeds]
    assert sorted(int(r.data.params["seed"]) for r in recorded) == sorted(seeds)
    stored = _files(server.artifacts)  # the server's artifact store, on the object store
    for run in recorded:
        assert run.info.status == "FINISHED"
        assert run.data.metrics["eval_accuracy"] > 0.5 and "duration_s.Trainer" in run.data.metrics
        assert {f.path for f in client.list_artifacts(run.info.run_id)} >= {"ExampleGen", "Transform", "Trainer",
                                                                             "report"}
        assert any(run.info.run_id in path and path.endswith("input_stall.json") for path in stored), \
            "the server's artifact store holds the run's files"
    return recorded


def test_two_cli_runs_at_once_are_recorded_whole_on_a_postgres_backed_server(tracking_server, gcs, tmp_path):
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


def test_two_dag_runs_at_once_on_airflow_with_postgres_and_the_local_executor(postgres, tracking_server, gcs, s3,
                                                                              tmp_path):
    """The artifact root is on s3://: every task of both runs reads and writes its artifacts there, and the Report
    view on Airflow's api-server reads the runs' status and reports from there."""
    from airflow_stack import AirflowStack

    home = tmp_path / "home"
    artifact_root = f"{s3.root}/{tmp_path.name}/artifacts"
    stack = AirflowStack(tmp_path / "airflow", {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.create_database("airflow"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "AIRFLOW__CORE__PARALLELISM": "4",
        "HPML_SCHEDULE": "none", "HPML_HOME": str(home), "MLFLOW_TRACKING_URI": tracking_server.url,
        "HPML_ARTIFACT_ROOT": artifact_root, **gcs.env(), **s3.env()}).start()
    try:
        stack.wait_for_dag("penguin")
        run_ids = [stack.api("dags/penguin/dagRuns", "POST", {"logical_date": None,
                                                               "conf": {"epochs": 3, "seed": seed}})["dag_run_id"]
                   for seed in (11, 12)]
        finished = [stack.wait_for_run("penguin", run_id, timeout=900) for run_id in run_ids]
        assert [run["state"] for run in finished] == ["success", "success"], \
            "\n".join(stack.why_failed("penguin", run_id) for run_id in run_ids)
        # The Report view's endpoints read the record from the tracking server and the report from s3://.
        token = stack.token()
        for run_id in run_ids:
            base = f"/hpml/runs/penguin/{urllib.parse.quote(run_id, safe='')}"
            code, body = stack.get(f"{base}/status.json", token=token)
            status = json.loads(body)
            assert code == 200 and status["status"] == "FINISHED" and status["report"] is True, body[:500]
            assert status["mlflow_url"].startswith(f"{tracking_server.url}/#/experiments/"), status["mlflow_url"]
            assert status["tensorboard"].startswith(f"tensorboard --logdir '{artifact_root}/penguin/")
            code, page = stack.get(f"{base}/report/report.html", token=token)
            assert code == 200 and b"<h2>Per class</h2>" in page and b"data:image/png;base64," in page
            assert stack.get(f"{base}/report/..%2F..%2Fpenguin", token=token)[0] == 404
    finally:
        stack.stop()
    recorded = _check_records(tracking_server, "penguin", [11, 12])
    assert sorted(r.data.tags["airflow.run_id"] for r in recorded) == sorted(run_ids)
    run_dirs = sorted(r.data.tags["hpml.run_dir"] for r in recorded)
    assert len(set(run_dirs)) == 2 and all(d.startswith(f"{artifact_root}/penguin/") for d in run_dirs), run_dirs
    for run_dir in run_dirs:  # every artifact of both runs is on the object store, published whole
        stored = _files(run_dir)
        for artifact in ("ExampleGen/examples", "Transform/transform_graph", "Trainer/model", "report"):
            assert f"{artifact}/_hpml_published.json" in stored, (artifact, stored)
        assert "Trainer/model/Format-Serving/saved_model.pb" in stored
    assert not (home / "artifacts").exists() and not (home / "mlartifacts").exists(), \
        "no artifact was left on the worker's disk"
    # The tasks ran in this folder: an s3:// URL taken for a local path (os.makedirs) would leave s3:/bucket/... here.
    assert not (Path.cwd() / "s3:" / s3.bucket / tmp_path.name).exists(), "a URL was made into a local folder"


def _push_at_once(tracking_uri: str, name: str, serving: str, pushers: int) -> tuple[list, list]:
    """Run sync_champion from `pushers` threads released together; (their results, their errors)."""
    import threading

    from hpml.components.pusher import registry

    start, errors, results = threading.Barrier(pushers), [], []

    def push():
        start.wait()
        try:
            results.append(registry.sync_champion(tracking_uri, name, serving))
        except Exception as err:  # noqa: BLE001 - the test reports every pusher's failure
            errors.append(repr(err))

    threads = [threading.Thread(target=push) for _ in range(pushers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results, errors


def test_pushers_moving_the_alias_at_once_leave_it_on_the_serving_champion(tracking_server, tmp_path):
    """The first alias of a registered model is an insert on the server: pushers setting it at once race for it,
    and a slower one may set an older champion after a newer. Every pusher succeeds and the alias ends on the
    registry version of the serving folder's champion."""
    from mlflow.tracking import MlflowClient

    from hpml.components.pusher import registry

    client = MlflowClient(tracking_server.url)
    experiment = client.create_experiment("alias-race")
    for trial in range(4):
        name, serving = f"alias-race-{trial}", tmp_path / f"serving-{trial}"
        client.create_registered_model(name)
        run_id = client.create_run(experiment).info.run_id
        for version in (1, 2, 3):
            (serving / str(version)).mkdir(parents=True)
            client.create_model_version(name, source=f"runs:/{run_id}/pushed_model/{version}", run_id=run_id,
                                        tags={registry.SERVING_VERSION_TAG: str(version),
                                              registry.SERVING_DIR_TAG: str(serving)})
        champion_registry_version = registry.registry_versions(tracking_server.url, name, str(serving))[3]
        results, errors = _push_at_once(tracking_server.url, name, str(serving), pushers=6)
        assert not errors, errors
        assert results == [champion_registry_version] * 6
        assert registry.champion(tracking_server.url, name) == champion_registry_version
