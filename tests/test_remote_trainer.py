"""The Trainer drives a remote launch end to end: it writes the job file, renders a TFJob (or a Vertex AI
CustomJob), submits it through the real kubernetes (aiplatform) client, waits, and publishes the model
the replicas wrote; a job it stops waiting for is deleted (cancelled).

The cluster is tests/k8s_standin.py: a loopback API server whose "training operator" runs each
replica's container command as a local process with the TF_CONFIG a TFJob replica gets; Vertex AI is
tests/vertex_standin.py, the same idea behind a loopback JobService. What this proves: the manifest's
command, env and job file are enough for the workers to train and export; what it cannot prove: image
pulls, scheduling, volumes, RBAC and IAM on a real cluster or project."""
import glob
import os
import textwrap

import jsonschema
import numpy as np
import pytest
import tensorflow as tf

from hpml.components.errors import HpmlError, SpecError
from hpml.components.trainer import TRAINER
from tests.k8s_standin import TrainingOperatorStandIn
from tests.helpers import trainer_inputs, trainer_outputs
from tests.test_launchers import tfjob_schema  # noqa: F401 - the CRD schema fixture

IMAGE = "registry.example/hpml:test"


@pytest.fixture
def operator(tmp_path, monkeypatch):
    with TrainingOperatorStandIn(tmp_path) as standin:
        monkeypatch.setenv("KUBECONFIG", str(standin.kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield standin


def _params(**extra):
    return dict({"module": "hpml.examples.penguin.module", "launcher": "kubernetes", "num_workers": 2,
                 "hyperparameters": {"epochs": 2, "batch_size": 16},
                 "cluster": {"image": IMAGE, "namespace": "ml", "poll_seconds": 0.2}}, **extra)


def test_trainer_runs_multi_worker_training_as_a_tfjob(penguin_outputs, operator, tmp_path, tfjob_schema):  # noqa: F811
    out = trainer_outputs(tmp_path, "tfjob")
    props = TRAINER.run(trainer_inputs(penguin_outputs), out, _params())
    launch = props["launch"]
    assert launch["launcher"] == "kubernetes" and launch["job"].startswith("ml/hpml-trainer-")
    assert launch["replicas"] == {"chief": 1, "worker": 1, "ps": 0} and launch["conditions"][-1] == "Succeeded"
    assert props["plan"]["strategy"] == "multi_worker_mirrored"
    (job,) = operator.jobs.values()
    jsonschema.validate(job["manifest"], tfjob_schema)
    container = job["manifest"]["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    assert container["command"][:3] == ["python", "-m", "hpml.components.trainer.worker"]
    assert sorted(job["cluster"]) == ["chief", "worker"], "the replicas formed the cluster the manifest asked for"
    assert job["manifest"]["spec"]["runPolicy"]["activeDeadlineSeconds"] == 86400, "the operator's own backstop"
    assert [row["epoch"] for row in props["history"]] == [1, 2]
    # The model the chief wrote on shared storage is the published Model artifact, and it serves.
    serve = tf.saved_model.load(os.path.join(out["model"], "Format-Serving")).signatures["serving_default"]
    files = glob.glob(os.path.join(penguin_outputs["ExampleGen"]["examples"], "Split-eval", "*.gz"))
    raw = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    np.testing.assert_allclose(serve(examples=tf.constant(raw))["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)
    assert not os.path.exists(out["model"] + ".work"), "the job's working dir is removed after success"


def test_trainer_runs_ps_training_as_a_tfjob(penguin_outputs, operator, tmp_path, tfjob_schema):  # noqa: F811
    out = trainer_outputs(tmp_path, "tfjob-ps")
    props = TRAINER.run(trainer_inputs(penguin_outputs), out, _params(num_workers=1, num_ps=1))
    assert props["plan"]["strategy"] == "parameter_server"
    assert props["launch"]["replicas"] == {"chief": 1, "worker": 1, "ps": 1}
    (job,) = operator.jobs.values()
    jsonschema.validate(job["manifest"], tfjob_schema)
    replicas = job["manifest"]["spec"]["tfReplicaSpecs"]
    assert {k: (v["replicas"], v["restartPolicy"]) for k, v in replicas.items()} == {
        "Chief": (1, "OnFailure"), "Worker": (1, "OnFailure"), "PS": (1, "Always")}
    assert sorted(job["cluster"]) == ["chief", "ps", "worker"]
    assert [row["epoch"] for row in props["history"]] == [1, 2]
    assert os.path.isdir(os.path.join(out["model"], "Format-Serving")), "the coordinator's model is published"


def test_a_failed_tfjob_fails_the_trainer_with_the_replicas_error(penguin_outputs, operator, tmp_path):
    module = tmp_path / "broken_on_cluster.py"
    module.write_text(textwrap.dedent('''
        def run_fn(fn_args):
            raise RuntimeError("the cluster's data mount is empty")
    '''))
    out = trainer_outputs(tmp_path, "failed")
    # The operator's condition names no error; the message quotes the worker's own, from its pod's termination
    # message. Both replicas run the broken run_fn; whichever the operator sees exit first is the one named.
    with pytest.raises(HpmlError, match=r"TFJob ml/hpml-trainer-\w+-\w+ failed: TFJob .* has failed because 1 "
                                        r"(Chief|Worker) replica\(s\) failed. pod hpml-trainer-\w+-\w+-"
                                        r"(chief|worker)-0 exited with code 1: RuntimeError: the cluster's data mount "
                                        r"is empty"):
        TRAINER.run(trainer_inputs(penguin_outputs), out, _params(module=str(module), max_restarts=1))
    (job,) = operator.jobs.values()
    assert sum(r.restarts for r in job["replicas"]) == 1, "an ordinary crash is the operator's to restart"
    assert not os.path.exists(out["model"]) and not os.path.exists(out["model_run"]), "nothing half-published"


BAD_INPUT = textwrap.dedent('''
    import os, time

    def run_fn(fn_args):
        from hpml.components.errors import InputDataError
        from hpml.components.trainer.strategies import is_chief
        if not is_chief():
            time.sleep(300)
        with open(os.path.join(fn_args.working_dir, "attempts"), "a") as handle:
            handle.write("attempt\\n")
        raise InputDataError("data.csv:7: row 7 is bad", hint="fix row 7")
''')


def test_bad_input_on_a_tfjob_stops_the_job_instead_of_restarting_it(penguin_outputs, operator, tmp_path):
    """Under restartPolicy OnFailure the operator would rerun a worker that refused its input up to backoffLimit
    times, each failing alike. The launcher sees the exit code (2) in the pod's status and deletes the job."""
    module = tmp_path / "bad_input.py"
    module.write_text(BAD_INPUT)
    out = trainer_outputs(tmp_path, "bad_input")
    with pytest.raises(HpmlError, match=r"TFJob ml/hpml-trainer-\w+-\w+: pod hpml-trainer-\w+-\w+-chief-0 exited "
                                        r"with code 2: hpml\.components\.errors.InputDataError: "
                                        r"data.csv:7: row 7 is bad "
                                        r"hint: fix row 7; bad input or parameters, so the job is stopped, not "
                                        r"restarted") as err:
        TRAINER.run(trainer_inputs(penguin_outputs), out, _params(module=str(module), max_restarts=2))
    assert "would fail the same way" in err.value.hint
    (name,) = operator.jobs
    assert operator.deleted == [name], "left alone, the operator restarts it"
    with open(out["model"] + ".work/attempts") as handle:
        assert handle.read().count("attempt") == 1
    assert all(r.popen.poll() is not None for r in operator.jobs[name]["replicas"])


@pytest.mark.parametrize("extra, message", [
    ({"cluster": {"namespace": "ml"}}, "launcher 'kubernetes' needs cluster.image"),
    ({"cluster": {"image": IMAGE, "replicas": 3}}, "cluster has unknown field"),
    ({"cluster": {"image": IMAGE, "gpus_per_worker": -1}}, "cluster.gpus_per_worker must be a whole number"),
    ({"cluster": {"image": IMAGE, "memory": 16}}, "cluster.memory must be a string, got 16"),
    ({"cluster": {"image": ["a", "b"]}}, r"cluster.image must be a string, got \['a', 'b'\]"),
    ({"launcher": "vertex", "cluster": {"image": IMAGE}}, "needs cluster.project and cluster.staging_bucket"),
    ({"strategy": "mirrored"}, "a remote launcher runs multi_worker_mirrored or parameter_server, not mirrored"),
    ({"strategy": "parameter_server"}, "needs a cluster with ps tasks"),
    ({"launcher": "local"}, "parameter 'cluster' is set but launcher is 'local'"),
    ({"launcher": "slurm", "cluster": {"port": 80}}, "cluster.port must be a port number from 1024 to 65000"),
    ({"launcher": "slurm", "cluster": {"shared_filesystem": "yes"}}, "cluster.shared_filesystem must be true or false"),
    ({"launcher": "slurm", "cluster": {}}, "launcher 'slurm' runs the workers on other hosts, which cannot read"),
])
def test_remote_settings_are_checked_before_anything_is_submitted(penguin_outputs, operator, tmp_path, extra,
                                                                  message):
    with pytest.raises(SpecError, match=message):
        TRAINER.run(trainer_inputs(penguin_outputs), trainer_outputs(tmp_path, "refused"), _params(**extra))
    assert operator.requests == [], "no job was submitted"
    assert not os.path.exists(tmp_path / "refused")


def test_a_tfjob_over_artifacts_on_s3_reads_them_on_its_own_nodes_and_the_chief_uploads_the_model(
        penguin_outputs, operator, s3, tmp_path, monkeypatch):
    """Every artifact on s3://. The replicas, with a cache of their own (another machine's disk), download what they
    read by its s3:// URI, not this machine's copies; the chief uploads the model, which the Trainer publishes."""
    root, inputs = _published_on_s3(penguin_outputs, s3, tmp_path)
    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "this-machine"))
    operator.replica_env["HPML_CACHE_DIR"] = str(tmp_path / "nodes")
    props = TRAINER.run(inputs, {"model": f"{root}/model", "model_run": f"{root}/model_run"}, _params())
    assert props["launch"]["conditions"][-1] == "Succeeded"
    _assert_trained_from_s3(props, root, inputs, penguin_outputs, tmp_path / "nodes")


def _published_on_s3(penguin_outputs, s3, tmp_path) -> tuple[str, dict[str, str]]:
    """(a root on the store, the Trainer's inputs published under it from the penguin run's)."""
    from hpml.components import files, publishing

    root = f"{s3.root}/{tmp_path.name}"
    inputs = {}
    for name, uri in dict(trainer_inputs(penguin_outputs),
                          input_pipeline=penguin_outputs["Transform"]["input_pipeline"]).items():
        with publishing.publish(f"{root}/{name}") as target:
            files.copy_tree(uri, target)
        inputs[name] = f"{root}/{name}"
    return root, inputs


def _assert_trained_from_s3(props: dict, root: str, inputs: dict, penguin_outputs, node_cache) -> None:
    """The job trained two epochs from the replicas' own copies of the s3:// inputs, and its model, published on the
    store, serves."""
    from hpml.components import artifacts, files

    assert [row["epoch"] for row in props["history"]] == [1, 2]
    assert props["eval_metrics"]["accuracy"] > 0.5
    nodes = node_cache / "s3"
    shards = [path for split in ("train", "eval")
              for path in files.glob(artifacts.transformed_examples_file_pattern(inputs["examples"], split))]
    copies = sorted(os.listdir(nodes))
    assert len([c for c in copies if (nodes / c).is_dir()]) == 2, "the transform graph and the input pipeline"
    assert len([c for c in copies if (nodes / c).is_file()]) == len(shards) + 1, "each shard, and the schema"
    assert not glob.glob(str(node_cache / "s3-work" / "*" / "outputs" / "*")), "removed once uploaded"
    model = files.tf_readable(f"{root}/model")
    serve = tf.saved_model.load(os.path.join(model, "Format-Serving")).signatures["serving_default"]
    examples = glob.glob(os.path.join(penguin_outputs["ExampleGen"]["examples"], "Split-eval", "*.gz"))
    raw = [r.numpy() for r in tf.data.TFRecordDataset(examples, compression_type="GZIP")]
    assert list(serve(examples=tf.constant(raw[:5])).values())[0].shape[0] == 5
    assert files.isfile(f"{root}/model_run/{artifacts.EVAL_METRICS_FILE}")
    assert not [path for path in files.glob(f"{root}/*") if path.endswith(".work")], "the working dir is removed"


def test_penguin_pipeline_trains_on_the_cluster_the_deployment_configures(airflow_db, operator, tmp_path, monkeypatch):
    import json

    from hpml.pipelines import records, runner
    from hpml.examples.penguin.pipeline import PIPELINE

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
    out = trainer_outputs(tmp_path, "slow")
    cluster = {"image": IMAGE, "namespace": "ml", "poll_seconds": 0.2, "timeout_seconds": 3}
    with pytest.raises(HpmlError, match=r"TFJob ml/hpml-trainer-\w+-\w+ did not finish within 3s"):
        TRAINER.run(trainer_inputs(penguin_outputs), out, _params(module=str(module), cluster=cluster))
    (name,) = operator.jobs
    assert operator.deleted == [name]
    assert ("DELETE", f"/apis/kubeflow.org/v1/namespaces/ml/tfjobs/{name}") in \
        [(method, path.split("?")[0]) for method, path in operator.requests]
    assert all(r.popen.poll() is not None for r in operator.jobs[name]["replicas"])
    assert not os.path.exists(out["model"])


def test_a_failed_tfjob_is_kept_for_its_logs_and_pods_need_not_be_readable(penguin_outputs, operator, tmp_path,
                                                                          caplog):
    """A service account without "list pods" still gets the operator's verdict, and is told what it misses."""
    module = tmp_path / "broken.py"
    module.write_text(BAD_INPUT.replace("InputDataError(", "RuntimeError(").replace(", hint=\"fix row 7\"", ""))
    operator.pods_forbidden = True
    with pytest.raises(HpmlError, match=r"failed: TFJob .* has failed because 1 Chief replica\(s\) failed.$") as err:
        TRAINER.run(trainer_inputs(penguin_outputs), trainer_outputs(tmp_path, "broken"),
                    _params(module=str(module), max_restarts=0))
    assert err.value.hint.startswith("kubectl -n ml logs -l training.kubeflow.org/job-name=hpml-trainer-")
    assert len(operator.jobs) == 1 and operator.deleted == []
    forbidden = [r.message for r in caplog.records if "cannot list the pods" in r.message]
    assert len(forbidden) == 1 and "grant the Trainer's service account" in forbidden[0]


def _sigterm_a_training_trainer(penguin_outputs, tmp_path, params, jobs: dict) -> str:
    """Run the Trainer (a sleeping run_fn) in its own process until the stand-in's `jobs` hold one job whose
    replicas all run, then SIGTERM it, as Airflow stops a task it no longer wants; returns its stderr."""
    import json
    import signal
    import subprocess
    import sys
    import time

    module = tmp_path / "sleeper.py"
    module.write_text(SLEEPER)
    args = json.dumps([trainer_inputs(penguin_outputs), trainer_outputs(tmp_path, "stopped"),
                       dict(params, module=str(module))])
    # SIGUSR1 makes the Trainer print every thread's stack: if it ever outlives the SIGTERM, the failure says where.
    script = ("import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True); "
              f"import json; from hpml.components.trainer import TRAINER; TRAINER.run(*json.loads({args!r}))")
    with open(tmp_path / "trainer.err", "w") as stderr:
        trainer = subprocess.Popen([sys.executable, "-c", script], stderr=stderr)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and trainer.poll() is None and not (
            jobs and all(r.popen.poll() is None for job in jobs.values() for r in job["replicas"])):
        time.sleep(0.2)
    assert trainer.poll() is None and len(jobs) == 1, (tmp_path / "trainer.err").read_text()[-3000:]
    trainer.send_signal(signal.SIGTERM)
    try:
        trainer.wait(timeout=60)
    except subprocess.TimeoutExpired:
        trainer.send_signal(signal.SIGUSR1)
        time.sleep(2)
        trainer.kill()
        pytest.fail("the Trainer outlived its SIGTERM by 60 s; its stacks: "
                    + (tmp_path / "trainer.err").read_text()[-6000:])
    assert trainer.returncode != 0
    assert not os.path.exists(trainer_outputs(tmp_path, "stopped")["model"])
    return (tmp_path / "trainer.err").read_text()


def test_a_trainer_stopped_with_sigterm_deletes_its_tfjob(penguin_outputs, operator, tmp_path):
    err = _sigterm_a_training_trainer(penguin_outputs, tmp_path, _params(), operator.jobs)
    (name,) = operator.jobs
    assert f"the Trainer waiting on TFJob ml/{name} was stopped by SIGTERM" in err, err[-3000:]
    assert operator.deleted == [name]
    assert all(r.popen.poll() is not None for r in operator.jobs[name]["replicas"])


def test_a_sigterm_during_submission_still_deletes_the_tfjob(penguin_outputs, operator, tmp_path):
    """The API server creates the job before it answers; a SIGTERM in between must not leave the job behind."""
    operator.create_reply_delay_s = 5
    err = _sigterm_a_training_trainer(penguin_outputs, tmp_path, _params(), operator.jobs)
    (name,) = operator.jobs
    assert f"the Trainer waiting on TFJob ml/{name} was stopped by SIGTERM" in err, err[-3000:]
    assert "in submit_and_say" in err, "the signal was meant to cut the create short: " + err[-3000:]
    assert operator.deleted == [name]
    assert all(r.popen.poll() is not None for r in operator.jobs[name]["replicas"])


@pytest.fixture
def vertex_ai(tmp_path, monkeypatch):
    from tests.vertex_standin import VertexStandIn, write_service_account_key

    key = write_service_account_key(tmp_path / "adc.json", "hpml-test")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    with VertexStandIn(tmp_path) as standin:
        yield standin


def _vertex_params(vertex_ai, **extra):
    cluster = {"image": IMAGE, "project": "hpml-test", "location": "europe-west4", "staging_bucket": "gs://hpml-test",
               "api_endpoint": vertex_ai.endpoint, "poll_seconds": 0.2, **extra.pop("cluster", {})}
    return _params(launcher="vertex", cluster=cluster, **extra)


def test_trainer_runs_multi_worker_training_as_a_vertex_custom_job(penguin_outputs, vertex_ai, tmp_path):
    out = trainer_outputs(tmp_path, "vertex")
    # Ridden out, not a reason to abandon (and cancel) the job; here aiplatform's own retry takes them.
    vertex_ai.unavailable_reads = 2
    props = TRAINER.run(trainer_inputs(penguin_outputs), out, _vertex_params(vertex_ai))
    assert vertex_ai.unavailable_reads == 0
    launch = props["launch"]
    assert launch["launcher"] == "vertex" and launch["state"] == "JOB_STATE_SUCCEEDED"
    assert launch["job"] == "projects/hpml-test/locations/europe-west4/customJobs/1"
    (job,) = vertex_ai.jobs.values()
    pools = job["resource"]["jobSpec"]["workerPoolSpecs"]
    assert [int(p["replicaCount"]) for p in pools] == [1, 1]
    assert pools[0]["containerSpec"]["imageUri"] == IMAGE
    assert pools[0]["machineSpec"] == {"machineType": "n1-standard-8"}, "no accelerator asked for, none requested"
    assert sorted(job["replicas"][i].name for i in range(2)) == ["workerpool0-0", "workerpool1-0"]
    # What Vertex itself enforces: its own time limit (the wait's), and MWMS restarting as a whole.
    assert job["resource"]["jobSpec"]["scheduling"] == {"timeout": "86400s", "restartJobOnWorkerRestart": True}
    assert [row["epoch"] for row in props["history"]] == [1, 2]
    assert os.path.isdir(os.path.join(out["model"], "Format-Serving")), "the chief's model is published"


def test_a_vertex_custom_job_over_artifacts_on_s3_reads_them_on_its_own_nodes_and_the_chief_uploads_the_model(
        penguin_outputs, vertex_ai, s3, tmp_path, monkeypatch):
    """The same as a TFJob's: Vertex's replicas, with a cache of their own, read the s3:// inputs by their URIs, and
    the chief uploads the model, which the Trainer publishes."""
    root, inputs = _published_on_s3(penguin_outputs, s3, tmp_path)
    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "this-machine"))
    vertex_ai.replica_env["HPML_CACHE_DIR"] = str(tmp_path / "nodes")
    props = TRAINER.run(inputs, {"model": f"{root}/model", "model_run": f"{root}/model_run"},
                        _vertex_params(vertex_ai))
    assert props["launch"]["state"] == "JOB_STATE_SUCCEEDED"
    _assert_trained_from_s3(props, root, inputs, penguin_outputs, tmp_path / "nodes")


def test_trainer_runs_ps_training_as_a_vertex_custom_job(penguin_outputs, vertex_ai, tmp_path):
    out = trainer_outputs(tmp_path, "vertex-ps")
    props = TRAINER.run(trainer_inputs(penguin_outputs), out, _vertex_params(vertex_ai, num_workers=1, num_ps=1))
    assert props["plan"]["strategy"] == "parameter_server" and props["launch"]["state"] == "JOB_STATE_SUCCEEDED"
    (job,) = vertex_ai.jobs.values()
    spec = job["resource"]["jobSpec"]
    assert [int(p["replicaCount"]) for p in spec["workerPoolSpecs"]] == [1, 1, 1], "chief, workers, ps"
    # A restarted PS worker rejoins the coordinator alone: the job is not restarted as a whole.
    assert spec["scheduling"] == {"timeout": "86400s"}, "restartJobOnWorkerRestart left at Vertex's false"
    assert [row["epoch"] for row in props["history"]] == [1, 2]
    assert os.path.isdir(os.path.join(out["model"], "Format-Serving")), "the coordinator's model is published"


def test_a_failed_custom_job_fails_the_trainer_with_the_replicas_error(penguin_outputs, vertex_ai, tmp_path):
    module = tmp_path / "broken.py"
    module.write_text("def run_fn(fn_args):\n    raise RuntimeError('the bucket is empty')\n")
    out = trainer_outputs(tmp_path, "vertex-failed")
    with pytest.raises(HpmlError, match=r"CustomJob projects/hpml-test/locations/europe-west4/customJobs/1 ended "
                                        r"JOB_STATE_FAILED: The replica workerpool\d-0 exited .*the bucket is empty"):
        TRAINER.run(trainer_inputs(penguin_outputs), out, _vertex_params(vertex_ai, module=str(module)))
    assert ("POST", "cancel") not in [(m, p.split("?")[0].rsplit(":", 1)[-1]) for m, p in vertex_ai.requests]
    assert not os.path.exists(out["model"])


def test_a_custom_job_that_outlives_its_timeout_is_cancelled(penguin_outputs, vertex_ai, tmp_path):
    module = tmp_path / "sleeper.py"
    module.write_text(SLEEPER)
    out = trainer_outputs(tmp_path, "vertex-slow")
    with pytest.raises(HpmlError, match=r"CustomJob projects/hpml-test/locations/europe-west4/customJobs/1 did not "
                                        r"finish within 3s"):
        TRAINER.run(trainer_inputs(penguin_outputs), out,
                    _vertex_params(vertex_ai, module=str(module), cluster={"timeout_seconds": 3}))
    (job,) = vertex_ai.jobs.values()
    assert job["cancelled"] and all(r.popen.poll() is not None for r in job["replicas"])
    assert not os.path.exists(out["model"])


def test_a_trainer_stopped_with_sigterm_cancels_its_custom_job(penguin_outputs, vertex_ai, tmp_path):
    err = _sigterm_a_training_trainer(penguin_outputs, tmp_path, _vertex_params(vertex_ai), vertex_ai.jobs)
    (job,) = vertex_ai.jobs.values()
    assert f"the Trainer waiting on CustomJob {job['resource']['displayName']} was stopped by SIGTERM" in err, \
        err[-3000:]
    assert job["cancelled"] and all(r.popen.poll() is not None for r in job["replicas"])


def test_a_sigterm_during_submission_still_cancels_the_custom_job(penguin_outputs, vertex_ai, tmp_path):
    """Vertex creates the job before it answers; cut short, the Trainer has no name for it, so it finds the job
    by its display name (unique to the attempt) and cancels it."""
    vertex_ai.create_reply_delay_s = 5
    err = _sigterm_a_training_trainer(penguin_outputs, tmp_path, _vertex_params(vertex_ai), vertex_ai.jobs)
    (job,) = vertex_ai.jobs.values()
    assert "in submit" in err and "was stopped by SIGTERM" in err, err[-3000:]
    assert f"cancelling CustomJob {job['resource']['name']}, created by a submission that was cut short" in err
    assert job["cancelled"] and all(r.popen.poll() is not None for r in job["replicas"])
