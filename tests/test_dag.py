"""The Airflow DAG: imports cleanly, runs for real on SQLite, and leaves a full run record."""
import dataclasses
import json
import os
import subprocess
from pathlib import Path
import sys

import pytest

from tests.helpers import TINY_EPOCHS

TASKS = ["start_run", "ExampleGen", "Transform", "Trainer", "Gate", "Pusher", "finish_run"]


def test_dagbag_imports_the_penguin_dag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.path.join(os.path.dirname(__file__), "..", "dags"))
    assert bag.import_errors == {}
    dag = bag.get_dag("penguin")
    assert sorted(t.task_id for t in dag.tasks) == sorted(TASKS)
    assert dag.task_dict["Transform"].upstream_task_ids == {"start_run", "ExampleGen"}
    assert dag.task_dict["Trainer"].upstream_task_ids == {"start_run", "ExampleGen", "Transform"}
    assert dag.task_dict["Gate"].upstream_task_ids == {"start_run", "ExampleGen", "Trainer"}
    assert dag.task_dict["Pusher"].upstream_task_ids == {"start_run", "Trainer", "Gate"}
    assert dag.catchup is False
    assert dag.timetable.expression == "0 0 * * *"
    outlets = dag.task_dict["Trainer"].outlets
    assert [a.name for a in outlets] == ["penguin.model"]
    form = dag.params.dump()
    assert set(form) == {"data_path", "epochs", "batch_size", "learning_rate", "strategy", "skip_bad_rows", "encoding",
                         "num_workers", "num_ps", "gradient_accumulation_steps", "launcher", "remat", "seed",
                         "steps_per_execution", "xla", "precision", "gate_min_accuracy", "gate_margin", "serving_dir"}
    schemas = {name: dag.params.get_param(name).schema for name in form}
    assert all(s["title"] for s in schemas.values()), "every field has a title"
    assert all(dag.params.get_param(name).description for name in form), "and a description"
    assert "mirrored" in schemas["strategy"]["enum"] and schemas["remat"]["enum"] == ["never", "except_last", "always"]
    assert schemas["launcher"]["enum"] == ["local", "kubernetes", "vertex", "slurm"]
    assert all("minimum" in s and "maximum" in s for s in schemas.values() if s["type"] == "integer")
    assert "epochs" in dag.doc_md and "Distribution strategy" in dag.doc_md


def test_dag_files_load_without_tensorflow_or_beam(airflow_db):
    """The dag-processor re-imports every DAG file every 30 s under a 30 s import timeout. Importing
    TensorFlow there cost ~15 s a parse, and on a loaded machine the parse timed out and Airflow
    marked the DAG stale (a trigger then got 404). Components load their executors when they run."""
    dags = os.path.join(os.path.dirname(__file__), "..", "dags")
    heavy = ("tensorflow", "tf_keras", "tensorflow_transform", "apache_beam", "tfx_bsl", "mlflow", "pandas",
             "sklearn", "matplotlib")
    probe = (f"import runpy, sys\n"
             f"for name in ('penguin', 'distillation'):\n"
             f"    assert 'dag' in runpy.run_path({dags!r} + '/' + name + '.py'), name\n"
             f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", "a DAG file imported " + done.stdout


def test_loading_the_plugin_builds_no_app_until_a_request_comes():
    """Every Airflow process loads plugins; the report app is built by the api-server's first request to it."""
    probe = ("import asyncio, sys\n"
             "from hpml.pipelines.airflow.plugin import HpmlPlugin\n"
             "app = HpmlPlugin.fastapi_apps[0]['app']\n"
             "print('LAZY', 'hpml.pipelines.airflow.report_app' in sys.modules, app.app)\n"
             "sent = []\n"
             "async def receive():\n"
             "    return {'type': 'http.request', 'body': b'', 'more_body': False}\n"
             "async def send(message):\n"
             "    sent.append(message)\n"
             "scope = {'type': 'http', 'method': 'GET', 'path': '/runs/x/y/', 'raw_path': b'/runs/x/y/',\n"
             "         'root_path': '', 'query_string': b'', 'headers': [], 'scheme': 'http',\n"
             "         'server': ('127.0.0.1', 80),\n"
             "         'client': ('127.0.0.1', 1), 'http_version': '1.1'}\n"
             "asyncio.run(app(scope, receive, send))\n"
             "print('BUILT', type(app.app).__name__, sent[0]['status'])\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "LAZY False None" in lines, f"loading the plugin imported or built the app: {done.stdout[-2000:]}"
    built = next(line.split() for line in lines if line.startswith("BUILT "))
    assert built[1] == "FastAPI" and built[2] in ("401", "403"), \
        f"the first request built it, and it answers as the view does without a login: {built}"


def test_a_component_loads_its_executor_when_it_runs():
    from hpml.components.errors import SpecError
    from hpml.components.trainer import TRAINER
    from hpml.components.trainer.executor import run as trainer_run

    assert TRAINER.load_executor() is trainer_run
    broken = dataclasses.replace(TRAINER, executor="hpml.components.trainer.executor:no_such_function")
    with pytest.raises(SpecError, match="Trainer: cannot load executor 'hpml.components.trainer.executor:no_such"):
        broken.load_executor()


def test_full_dag_run_succeeds(penguin_dag_run):
    assert str(penguin_dag_run["dag_run"].state).endswith("success")
    assert penguin_dag_run["summary"].status == "FINISHED"


def test_run_record_contents(penguin_dag_run):
    from hpml.pipelines import records

    summary = penguin_dag_run["summary"]
    run_id = penguin_dag_run["dag_run"].run_id
    conf = penguin_dag_run["conf"]
    for key, value in conf.items():
        assert summary.params[key] == str(value)
    assert summary.tags["airflow.dag_id"] == "penguin" and summary.tags["airflow.run_id"] == run_id
    assert set(summary.durations) == {"ExampleGen", "Transform", "Trainer", "Gate", "Pusher"}
    assert all(seconds > 0 for seconds in summary.durations.values())
    from hpml.pipelines.paths import artifact_root, run_folder_name

    run_dir = os.path.join(artifact_root(), "penguin", run_folder_name(run_id))
    assert summary.tags["hpml.run_dir"] == run_dir
    for node, outputs in summary.outputs.items():
        for name, uri in outputs.items():
            assert uri == os.path.join(run_dir, node, name) and os.path.isdir(uri)
    assert summary.outputs["Trainer"]["model"].endswith("/Trainer/model")
    assert summary.constant_features == [] and "hpml.constant_features" not in summary.tags, "every feature varies"
    for metric in ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_sec", "step_time_ms"):
        steps = records.history(summary.mlflow_run_id, metric)
        assert [s for s, _ in steps] == list(range(1, TINY_EPOCHS + 1)), metric
    losses = [v for _, v in records.history(summary.mlflow_run_id, "loss")]
    assert losses[-1] < losses[0], "training must make progress"
    # Throughput counts the train split's examples, not steps x batch_size: the last batch is short.
    train, batch = summary.examples["train"], int(summary.params["batch_size"])
    steps = -(-train // batch)
    assert train % batch, "the test needs a short last batch"
    for (_, rate), (_, step_ms) in zip(records.history(summary.mlflow_run_id, "examples_per_sec"),
                                       records.history(summary.mlflow_run_id, "step_time_ms")):
        assert rate * step_ms * steps / 1000 == pytest.approx(train, rel=1e-6)
    metrics_file = os.path.join(summary.outputs["Trainer"]["model_run"], "metrics.jsonl")
    last = [json.loads(line) for line in open(metrics_file)][-1]
    assert summary.eval_metrics["accuracy"] > 0.8
    assert records.history(summary.mlflow_run_id, "loss")[-1][1] == pytest.approx(last["loss"])
    artifacts = {a.path for a in records.client().list_artifacts(summary.mlflow_run_id, "Trainer/model_run")}
    assert "Trainer/model_run/metrics.jsonl" in artifacts


def test_invalid_trigger_values_are_refused_before_any_work(airflow_db):
    from airflow.sdk.definitions.param import ParamValidationError

    from hpml.pipelines.airflow import local as airflow_local
    from hpml.pipelines.paths import artifact_root

    penguin_runs = Path(artifact_root()) / "penguin"
    before = set(os.listdir(penguin_runs)) if penguin_runs.exists() else set()
    with pytest.raises(ParamValidationError, match="epochs"):
        airflow_local.test_run("penguin", {"epochs": 0})
    after = set(os.listdir(penguin_runs)) if penguin_runs.exists() else set()
    assert after == before, "no run directory may be created for refused parameters"


def test_a_nan_in_the_run_conf_fails_start_run_and_nothing_else_runs(airflow_db):
    """NaN passes a JSON-schema range (it compares false with both bounds), so params.validate refuses it
    (tests/test_params.py). Through Airflow it arrives as null, which Airflow's own check refuses: either way
    start_run fails and no component runs. (Airflow's task runner logs "Invalid input for param learning_rate";
    its log streams outlive pytest's output capture, so the message is not checked here.)"""
    from hpml.pipelines.airflow import local as airflow_local

    run = airflow_local.test_run("penguin", {"learning_rate": float("nan")})
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == "failed" and states["start_run"] == "failed", states
    assert not any(state == "success" for task, state in states.items() if task != "start_run"), states


def test_task_retries_come_from_the_environment_and_bad_values_are_named(monkeypatch, airflow_db):
    """dag.test gives every task no retries whatever Airflow's default_task_retries says; HPML_TASK_RETRIES is
    how a run under `hpml run --engine airflow` (and any scheduler) gets them."""
    from datetime import timedelta

    from hpml.components.errors import SpecError
    from hpml.pipelines.airflow.dag import build_dag
    from hpml.examples.penguin.pipeline import PIPELINE

    monkeypatch.delenv("HPML_TASK_RETRIES", raising=False)
    plain = build_dag(PIPELINE)
    monkeypatch.setenv("HPML_TASK_RETRIES", "3")
    monkeypatch.setenv("HPML_TASK_RETRY_DELAY_S", "7.5")
    dag = build_dag(PIPELINE)
    for node in ("ExampleGen", "Transform", "Trainer"):
        assert (dag.task_dict[node].retries, dag.task_dict[node].retry_delay) == (3, timedelta(seconds=7.5))
        assert dag.task_dict[node].retries != plain.task_dict[node].retries
    assert dag.task_dict["start_run"].retries == plain.task_dict["start_run"].retries, "parameters: no retry"
    for name, value, message in [
        ("HPML_TASK_RETRIES", "-1", "HPML_TASK_RETRIES must be a whole number of at least 0, not '-1'"),
        ("HPML_TASK_RETRIES", "two", "HPML_TASK_RETRIES must be a whole number of at least 0, not 'two'"),
        ("HPML_TASK_RETRY_DELAY_S", "soon", "HPML_TASK_RETRY_DELAY_S must be a number of seconds of at least 0, "
                                            "not 'soon'"),
        ("HPML_TASK_RETRY_DELAY_S", "nan", "HPML_TASK_RETRY_DELAY_S must be a number of seconds of at least 0, "
                                           "not 'nan'"),
    ]:
        monkeypatch.setenv("HPML_TASK_RETRIES", "1")
        monkeypatch.setenv("HPML_TASK_RETRY_DELAY_S", "0")
        monkeypatch.setenv(name, value)
        with pytest.raises(SpecError) as err:
            build_dag(PIPELINE)
        assert str(err.value) == message


RETRY_DAG = '''
import dataclasses

from hpml.pipelines.airflow.dag import build_dag
from hpml.examples.penguin.pipeline import PIPELINE

trainer = PIPELINE.node("Trainer")
fail_once = dataclasses.replace(trainer, params=lambda p: dict(trainer.params(p), module={module!r}))
dag = build_dag(dataclasses.replace(PIPELINE, name="penguin_retry", nodes=(*PIPELINE.nodes[:2], fail_once)),
                schedule=None)
'''

RETRY_RUN = '''
import json
from hpml.pipelines.airflow import local as airflow_local

airflow_local.configure()
airflow_local.migrate()
from airflow.dag_processing.dagbag import DagBag

bag = DagBag(dag_folder={dags!r})
assert not bag.import_errors, bag.import_errors
run = bag.get_dag("penguin_retry").test(run_conf={{"epochs": 2}})
tries = {{ti.task_id: [ti.state, ti.try_number] for ti in run.get_task_instances()}}
print(json.dumps({{"state": str(run.state), "run_id": run.run_id, "tries": tries}}))
'''


def test_a_task_that_fails_once_is_retried_by_airflow_and_the_run_record_ends_finished(tmp_path):
    """A real DAG run (its own Airflow home and DAG folder) whose Trainer loses a worker on its first try:
    with HPML_TASK_RETRIES=1 Airflow retries it, the retry trains, and the record and report end FINISHED,
    naming the retried node, where they had said FAILED in Trainer."""
    from hpml.pipelines import records

    home = tmp_path / "home"  # its own private Airflow: HPML_HOME/airflow, whose dags folder holds the DAG
    dags = home / "airflow" / "dags"
    dags.mkdir(parents=True)
    module = os.path.join(os.path.dirname(__file__), "assets", "fail_once_run_fn.py")
    (dags / "penguin_retry.py").write_text(RETRY_DAG.format(module=module))
    env = dict(os.environ, HPML_HOME=str(home), MLFLOW_TRACKING_URI=records.tracking_uri(),
               HPML_TASK_RETRIES="1", HPML_TASK_RETRY_DELAY_S="0")
    done = subprocess.run([sys.executable, "-c", RETRY_RUN.format(dags=str(dags))], capture_output=True, text=True,
                          timeout=600, env=env, cwd=os.path.join(os.path.dirname(__file__), ".."))
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["state"].endswith("success"), outcome
    assert outcome["tries"]["Trainer"] == ["success", 2] and outcome["tries"]["Transform"] == ["success", 1]
    summary = records.load(records.find("airflow.run_id", outcome["run_id"], "penguin_retry"))
    assert summary.status == "FINISHED" and "hpml.failed_node" not in summary.tags
    assert summary.tags["hpml.retried.Trainer"] == "RuntimeError: worker lost (simulated)"
    assert [row for row in records.history(summary.mlflow_run_id, "loss")], "the retry trained and logged its epochs"
    page = open(summary.tags["hpml.report"], encoding="utf-8").read()
    assert "Status <b>FINISHED</b>" in page and "Failed in" not in page
    assert "Trainer was retried; a try before failed: RuntimeError: worker lost (simulated)" in page
