"""`hpml run penguin` with its artifact root on s3:// (moto's S3 server on loopback): the run is the local run, every
artifact is published whole in the bucket, the Gate scores the champion served from the bucket, and nothing is
left on local disk but the cache."""
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


def _record(home):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("penguin").experiment_id],
                              order_by=["attributes.start_time DESC"])
    return runs[0]


def test_a_run_with_its_artifact_root_on_s3_equals_the_local_run(s3, tmp_path, monkeypatch):
    import tensorflow as tf

    from hpml.pipelines import run_status

    _run(tmp_path / "local")
    root = f"{s3.root}/{tmp_path.name}/artifacts"
    cache = tmp_path / "cache" / "s3"
    remote_env = {"HPML_ARTIFACT_ROOT": root, "HPML_CACHE_DIR": str(cache)}
    done = _run(tmp_path / "remote", **remote_env)
    assert f"artifacts: {root}/penguin/" in done.stdout

    local, remote = _record(tmp_path / "local"), _record(tmp_path / "remote")
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
    assert os.listdir(tmp_path / "cache" / "staging") == [], "the staged outputs were removed"

    # The Report view's data for the run: read from the record and the bucket.
    monkeypatch.setenv("HPML_HOME", str(tmp_path / "remote"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    status = run_status.status(remote.info.run_id)
    assert status["status"] == "FINISHED" and status["report"] is True
    assert status["metrics"]["accuracy"] == pytest.approx(evaluated["eval_accuracy"])

    # The pushed model serves from the bucket; a second run is gated against it there.
    served = files.tf_readable(f"{root}/_serving/penguin/1")
    assert "serving_default" in tf.saved_model.load(served).signatures
    again = _run(tmp_path / "remote", **remote_env)
    assert "champion 0.9" in again.stderr and f"pushed as version 2 to {root}/_serving/penguin" in again.stdout
