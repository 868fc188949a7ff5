"""`hpml run penguin` with its artifact root on s3:// (moto's S3 server on loopback), recorded on an MLflow server
whose artifact store is in the bucket too: the run is the local run, every artifact is published whole in the
bucket, the Gate scores the champion served from the bucket, and nothing is left on local disk but the cache."""
import os
import subprocess
import sys

import pytest

from hpml.components import artifacts, files
from tests.helpers import REPO

HPML = os.path.join(os.path.dirname(sys.executable), "hpml")


def _run(home, **env) -> subprocess.CompletedProcess:
    done = subprocess.run([HPML, "run", "penguin", "--param", "epochs=3"], cwd=REPO, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, HPML_HOME=str(home), COLUMNS="200", **env))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _record(tracking_uri: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("penguin").experiment_id],
                              order_by=["attributes.start_time DESC"])
    return runs[0]


@pytest.fixture
def s3_tracking_server(s3, tmp_path):
    from tests.services import MlflowServer

    server = MlflowServer(tmp_path / "mlflow", f"sqlite:///{tmp_path / 'mlflow' / 'runs.db'}",
                          f"{s3.root}/{tmp_path.name}/mlflow", s3.env())
    (tmp_path / "mlflow").mkdir()
    yield server.start()
    server.stop()


def test_a_run_with_its_artifact_root_on_s3_equals_the_local_run(s3, s3_tracking_server, tmp_path, monkeypatch):
    import tensorflow as tf

    from hpml.pipelines import run_status

    _run(tmp_path / "local")
    root = f"{s3.root}/{tmp_path.name}/artifacts"
    remote_env = {"HPML_ARTIFACT_ROOT": root, "HPML_CACHE_DIR": str(tmp_path / "cache"),
                  "MLFLOW_TRACKING_URI": s3_tracking_server.url}
    done = _run(tmp_path / "remote", **remote_env)
    assert f"artifacts: {root}/penguin/" in done.stdout

    local = _record(f"sqlite:///{tmp_path / 'local' / 'mlflow.db'}")
    remote = _record(s3_tracking_server.url)
    evaluated = {k: v for k, v in local.data.metrics.items() if k.startswith("eval_")}
    assert evaluated and {k: remote.data.metrics[k] for k in evaluated} == evaluated, "the same model"

    run_dir = remote.data.tags["hpml.run_dir"]
    assert run_dir.startswith(f"{root}/penguin/")
    for artifact in ("ExampleGen/examples", "ExampleGen/schema", "Transform/transform_graph",
                     "Transform/transformed_examples", "Trainer/model", "Trainer/model_run", "Gate/blessing"):
        assert files.isfile(f"{run_dir}/{artifact}/{artifacts.PUBLISHED_FILE}"), artifact
    assert files.isfile(f"{run_dir}/Trainer/model/Format-Serving/saved_model.pb")
    assert files.isfile(f"{run_dir}/report/report.html")
    assert not (tmp_path / "remote" / "artifacts").exists(), "no artifact on local disk"
    assert not (tmp_path / "remote" / "mlartifacts").exists()
    recorded = files.walk_files(f"{s3.root}/{tmp_path.name}/mlflow")  # the server's artifact store, in the bucket
    assert any(remote.info.run_id in path and path.endswith("report.html") for path, _ in recorded)
    assert os.listdir(tmp_path / "cache" / "s3-staging") == [], "the staged outputs were removed"

    # The Report view's data for the run: read from the record and the bucket.
    monkeypatch.setenv("HPML_HOME", str(tmp_path / "remote"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", s3_tracking_server.url)
    status = run_status.status(remote.info.run_id)
    assert status["status"] == "FINISHED" and status["report"] is True
    assert status["metrics"]["accuracy"] == pytest.approx(evaluated["eval_accuracy"])

    # The pushed model serves from the bucket; a second run is gated against it there.
    served = files.tf_readable(f"{root}/_serving/penguin/1")
    assert "serving_default" in tf.saved_model.load(served).signatures
    again = _run(tmp_path / "remote", **remote_env)
    assert "champion 0.9" in again.stderr and f"pushed as version 2 to {root}/_serving/penguin" in again.stdout
