"""The Trainer drives a remote launch end to end: it writes the job file, renders a TFJob, submits
it through the real kubernetes client, waits, and publishes the model the replicas wrote.

The cluster is tests/k8s_standin.py: a loopback API server whose "training operator" runs each
replica's container command as a local process with the TF_CONFIG a TFJob replica gets. What
this proves: the manifest's command, env and job file are enough for the workers to train and
export; what it cannot prove: image pulls, scheduling, volumes and RBAC on a real cluster."""
import glob
import os
import textwrap

import jsonschema
import numpy as np
import pytest
import tensorflow as tf

from components.errors import HpmlError, SpecError
from components.trainer import TRAINER
from tests.k8s_standin import TrainingOperatorStandIn
from tests.test_distributed import _inputs, _out
from tests.test_launchers import tfjob_schema  # noqa: F401 - the CRD schema fixture

IMAGE = "registry.example/hpml:test"


@pytest.fixture
def operator(tmp_path, monkeypatch):
    with TrainingOperatorStandIn(tmp_path) as standin:
        monkeypatch.setenv("KUBECONFIG", str(standin.kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield standin


def _params(**extra):
    return dict({"module": "pipelines.penguin_module", "launcher": "kubernetes", "num_workers": 2,
                 "hyperparameters": {"epochs": 2, "batch_size": 16},
                 "cluster": {"image": IMAGE, "namespace": "ml", "poll_seconds": 0.2}}, **extra)


def test_trainer_runs_multi_worker_training_as_a_tfjob(penguin_outputs, operator, tmp_path, tfjob_schema):  # noqa: F811
    out = _out(tmp_path, "tfjob")
    props = TRAINER.run(_inputs(penguin_outputs), out, _params())
    launch = props["launch"]
    assert launch["launcher"] == "kubernetes" and launch["job"].startswith("ml/hpml-trainer-")
    assert launch["replicas"] == {"chief": 1, "worker": 1, "ps": 0} and launch["conditions"][-1] == "Succeeded"
    assert props["plan"]["strategy"] == "multi_worker_mirrored"
    (job,) = operator.jobs.values()
    jsonschema.validate(job["manifest"], tfjob_schema)
    container = job["manifest"]["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE and container["command"][:3] == ["python", "-m", "components.trainer.worker"]
    assert sorted(job["cluster"]) == ["chief", "worker"], "the replicas formed the cluster the manifest asked for"
    assert [row["epoch"] for row in props["history"]] == [1, 2]
    # The model the chief wrote on shared storage is the published Model artifact, and it serves.
    serve = tf.saved_model.load(os.path.join(out["model"], "Format-Serving")).signatures["serving_default"]
    files = glob.glob(os.path.join(penguin_outputs["ExampleGen"]["examples"], "Split-eval", "*.gz"))
    raw = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    np.testing.assert_allclose(serve(examples=tf.constant(raw))["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)
    assert not os.path.exists(out["model"] + ".work"), "the job's working dir is removed after success"


def test_a_failed_tfjob_fails_the_trainer_with_the_replicas_error(penguin_outputs, operator, tmp_path):
    module = tmp_path / "broken_on_cluster.py"
    module.write_text(textwrap.dedent('''
        def run_fn(fn_args):
            raise RuntimeError("the cluster's data mount is empty")
    '''))
    out = _out(tmp_path, "failed")
    # Both replicas run the broken run_fn; whichever the operator sees exit first is the one named.
    with pytest.raises(HpmlError, match=r"TFJob ml/hpml-trainer-\w+-\w+ failed: (chief|worker)-0 exited with code 1: .*"
                                        r"the cluster's data mount is empty"):
        TRAINER.run(_inputs(penguin_outputs), out, _params(module=str(module)))
    assert not os.path.exists(out["model"]) and not os.path.exists(out["model_run"]), "nothing half-published"


@pytest.mark.parametrize("extra, message", [
    ({"cluster": {"namespace": "ml"}}, "launcher 'kubernetes' needs cluster.image"),
    ({"cluster": {"image": IMAGE, "replicas": 3}}, "cluster has unknown field"),
    ({"cluster": {"image": IMAGE, "gpus_per_worker": -1}}, "cluster.gpus_per_worker must be a whole number"),
    ({"launcher": "vertex", "cluster": {"image": IMAGE}}, "needs cluster.project and cluster.staging_bucket"),
    ({"strategy": "mirrored"}, "a remote launcher runs multi_worker_mirrored or parameter_server, not mirrored"),
    ({"strategy": "parameter_server"}, "needs a cluster with ps tasks"),
    ({"launcher": "local"}, "parameter 'cluster' is set but launcher is 'local'"),
])
def test_remote_settings_are_checked_before_anything_is_submitted(penguin_outputs, operator, tmp_path, extra,
                                                                  message):
    with pytest.raises(SpecError, match=message):
        TRAINER.run(_inputs(penguin_outputs), _out(tmp_path, "refused"), _params(**extra))
    assert operator.requests == [], "no job was submitted"
    assert not os.path.exists(tmp_path / "refused")


def test_penguin_pipeline_trains_on_the_cluster_the_deployment_configures(airflow_db, operator, tmp_path, monkeypatch):
    import json

    from pipelines import records, runner
    from pipelines.penguin import PIPELINE

    config = tmp_path / "cluster.json"
    config.write_text(json.dumps({"image": IMAGE, "namespace": "ml", "poll_seconds": 0.2}))
    monkeypatch.setenv("HPML_CLUSTER_CONFIG", str(config))
    context = runner.run_local(PIPELINE, {"launcher": "kubernetes", "num_workers": 2, "epochs": 2, "batch_size": 16})
    summary = records.load(context.mlflow_run_id)
    assert summary.status == "FINISHED"
    assert summary.tags["hpml.remote_job"].startswith("kubernetes:ml/hpml-trainer-")
    assert summary.tags["hpml.strategy"] == "multi_worker_mirrored"
    assert len(operator.jobs) == 1 and "eval_accuracy" in records.client().get_run(context.mlflow_run_id).data.metrics
    config.write_text(json.dumps({"namespace": "ml"}))
    with pytest.raises(SpecError, match="needs cluster.image"):
        runner.start(PIPELINE, {"launcher": "kubernetes"})
    assert len(operator.jobs) == 1


SLEEPER = "import time\n\ndef run_fn(fn_args):\n    time.sleep(300)\n"


def test_a_tfjob_that_outlives_its_timeout_is_deleted(penguin_outputs, operator, tmp_path):
    """A job still running when the Trainer stops waiting would hold its accelerators on for nothing, and a
    retry of the task would start a second one beside it."""
    module = tmp_path / "sleeper.py"
    module.write_text(SLEEPER)
    out = _out(tmp_path, "slow")
    cluster = {"image": IMAGE, "namespace": "ml", "poll_seconds": 0.2, "timeout_seconds": 3}
    with pytest.raises(HpmlError, match=r"TFJob ml/hpml-trainer-\w+-\w+ did not finish within 3s"):
        TRAINER.run(_inputs(penguin_outputs), out, _params(module=str(module), cluster=cluster))
    (name,) = operator.jobs
    assert operator.deleted == [name]
    assert ("DELETE", f"/apis/kubeflow.org/v1/namespaces/ml/tfjobs/{name}") in \
        [(method, path.split("?")[0]) for method, path in operator.requests]
    assert all(r.popen.poll() is not None for r in operator.jobs[name]["replicas"])
    assert not os.path.exists(out["model"])


def test_a_failed_tfjob_is_kept_for_its_logs(penguin_outputs, operator, tmp_path):
    module = tmp_path / "broken.py"
    module.write_text("def run_fn(fn_args):\n    raise RuntimeError('bad shard')\n")
    with pytest.raises(HpmlError, match="bad shard"):
        TRAINER.run(_inputs(penguin_outputs), _out(tmp_path, "broken"), _params(module=str(module)))
    assert len(operator.jobs) == 1 and operator.deleted == []


def test_a_trainer_stopped_with_sigterm_deletes_its_tfjob(penguin_outputs, operator, tmp_path):
    """Airflow stops a task it no longer wants (marked failed, heartbeat refused) with SIGTERM."""
    import json
    import signal
    import subprocess
    import sys
    import time

    module = tmp_path / "sleeper.py"
    module.write_text(SLEEPER)
    out = _out(tmp_path, "stopped")
    args = json.dumps([_inputs(penguin_outputs), out, _params(module=str(module))])
    script = f"import json; from components.trainer import TRAINER; TRAINER.run(*json.loads({args!r}))"
    with open(tmp_path / "trainer.err", "w") as stderr:
        trainer = subprocess.Popen([sys.executable, "-c", script], stderr=stderr)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
            operator.jobs and all(r.popen.poll() is None for job in operator.jobs.values() for r in job["replicas"])
            and trainer.poll() is None):
        time.sleep(0.2)
    assert trainer.poll() is None and len(operator.jobs) == 1, (tmp_path / "trainer.err").read_text()[-3000:]
    (name,) = operator.jobs
    trainer.send_signal(signal.SIGTERM)
    assert trainer.wait(timeout=60) != 0
    err = (tmp_path / "trainer.err").read_text()
    assert f"the Trainer waiting on TFJob ml/{name} was stopped by SIGTERM" in err, err[-3000:]
    assert operator.deleted == [name]
    assert all(r.popen.poll() is not None for r in operator.jobs[name]["replicas"])
    assert not os.path.exists(out["model"])
