"""The run record (real SQLite MLflow store): Trainer properties land as the documented fields,
and a run id prefix or a run name finds its run."""
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hpml.components.errors import HpmlError
from hpml.components.example_gen.record import run_record as example_gen_record
from hpml.components.results import RECORD_KEY
from hpml.components.trainer.record import run_record as trainer_record
from hpml.components.transform.record import run_record as transform_record
from hpml.pipelines import records

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _with_record(run_record, result: dict) -> dict:
    """An executor's properties: its result, and the run record its component makes of it."""
    return {**result, RECORD_KEY: run_record(result).to_json()}


def test_a_restart_whose_recovery_was_not_measured_records_no_steps_lost():
    """A parameter-server job reports no step as it trains, so a launcher that restarted it whole cannot tell the
    steps lost or the time to recover: the record leaves them out rather than say 0. Measured, they are kept, and a
    worker restarted alone needs no recovery of the job."""
    unmeasured = trainer_record({"launch": {"restarts": 1, "steps_lost": 0, "recovery_seconds": []}})
    assert unmeasured.metrics == {"restarts": 1}
    measured = trainer_record({"launch": {"restarts": 2, "steps_lost": 3, "recovery_seconds": [1.5, 2.0]}})
    assert measured.metrics == {"restarts": 2, "steps_lost": 3, "recovery_seconds": 3.5}
    in_place = trainer_record({"launch": {"restarts": 1, "steps_lost": 0, "recovery_seconds": [],
                                          "restarted_in_place": ["worker-0"], "rejoin_seconds": [2.5]}})
    assert in_place.metrics == {"restarts": 1, "steps_lost": 0, "recovery_seconds": 0, "rejoin_seconds": 2.5}
    never = trainer_record({"launch": {"restarts": 0, "steps_lost": 0, "recovery_seconds": []}})
    assert never.metrics == {"restarts": 0, "steps_lost": 0, "recovery_seconds": 0}


def test_trainer_properties_become_run_record_fields(tmp_path):
    model_run = tmp_path / "model_run"
    model_run.mkdir()
    (model_run / "plan.json").write_text('{"strategy": "multi_worker_mirrored"}')
    run_id = records.start("record_test", "run-1", {"epochs": 2}, {"airflow.dag_id": "d"})
    properties = {
        "history": [{"epoch": 1, "loss": 0.9, "accuracy": 0.5}, {"epoch": 2, "loss": 0.4, "accuracy": 0.8}],
        "eval_metrics": {"accuracy": 0.75},
        "plan": {"strategy": "multi_worker_mirrored", "reasons": ["2 workers and no parameter servers"]},
        "launch": {"restarts": 1, "steps_lost": 4, "recovery_seconds": [12.5],
                   "failures": ["worker-1 ...", "worker-0 ..."], "restarted_in_place": ["worker-0"],
                   "rejoin_seconds": [3.5]},
        "gpipe": {"num_stages": 2, "num_micro_batches": 4, "balance": [2, 2], "remat": "always",
                  "schedule": "gpipe", "stage_costs_s": [0.1, 0.2], "expected_bubble": 0.2, "measured_bubble": 0.25},
    }
    records.log_node(run_id, "Trainer", {"model_run": str(model_run)}, _with_record(trainer_record, properties),
                     seconds=3.0)
    records.finish(run_id)
    summary = records.load(run_id)
    run = records.client().get_run(run_id)
    metrics, tags = run.data.metrics, run.data.tags
    assert summary.status == "FINISHED" and summary.params == {"epochs": "2"}
    assert summary.durations == {"Trainer": 3.0} and summary.eval_metrics == {"accuracy": 0.75}
    assert records.history(run_id, "loss") == [(1, 0.9), (2, 0.4)]
    assert (metrics["restarts"], metrics["steps_lost"], metrics["recovery_seconds"]) == (1, 4, 12.5)
    assert tags["hpml.strategy"] == "multi_worker_mirrored" and "2 workers" in tags["hpml.plan"]
    assert tags["hpml.restarted_in_place"] == "worker-0" and metrics["rejoin_seconds"] == 3.5
    assert tags["gpipe.num_stages"] == "2" and tags["gpipe.balance"] == "[2, 2]"
    assert metrics["gpipe.measured_bubble"] == 0.25 and metrics["gpipe.expected_bubble"] == 0.2
    assert summary.outputs == {"Trainer": {"model_run": str(model_run)}}
    logged = {a.path for a in records.client().list_artifacts(run_id, "Trainer/model_run")}
    assert logged == {"Trainer/model_run/plan.json"}


def test_empty_input_columns_reach_the_run_record_summary_and_report():
    """ExampleGen's empty_columns: a run that goes on without such a column still says so where people look."""
    from rich.console import Console

    from hpml.pipelines import report
    from hpml.pipelines.summary import print_summary

    run_id = records.start("record_test", "run-empty", {"epochs": 1}, {})
    properties = {"split_counts": {"train": 20, "eval": 10}, "bad_rows": 0, "input_files": 1,
                  "empty_columns": ["sex", "comment"]}
    records.log_node(run_id, "ExampleGen", {"examples": "/tmp/x"}, _with_record(example_gen_record, properties),
                     seconds=1.0)
    records.finish(run_id)
    summary = records.load(run_id)
    assert summary.empty_columns == ["sex", "comment"]
    console = Console(record=True, width=200)
    print_summary(summary, console)
    assert "examples: train=20 eval=10; no value in any row: sex, comment" in console.export_text()
    page = report.render(report.collect(run_id), {})
    assert "<b>no value in any row: sex, comment</b> (disabled in the schema)" in page
    plain = records.start("record_test", "run-full", {"epochs": 1}, {})
    records.log_node(plain, "ExampleGen", {}, _with_record(example_gen_record, {**properties, "empty_columns": []}),
                     seconds=1.0)
    assert records.load(plain).empty_columns == [] and "no value in any row" not in report.render(
        report.collect(plain), {})


def test_constant_features_reach_the_run_record_summary_and_report():
    """Transform's constant_features: the model learns nothing from them, and the run says so where people look."""
    from rich.console import Console

    from hpml.pipelines import report
    from hpml.pipelines.summary import print_summary

    run_id = records.start("record_test", "run-constant", {"epochs": 1}, {})
    records.log_node(run_id, "ExampleGen", {}, _with_record(example_gen_record, {"split_counts": {"train": 20,
                                                                                     "eval": 10}}), seconds=1.0)
    records.log_node(run_id, "Transform", {}, _with_record(transform_record, {"constant_features": [
        "bill_length_mm", "year"]}), seconds=1.0)
    records.finish(run_id)
    summary = records.load(run_id)
    assert summary.constant_features == ["bill_length_mm", "year"]
    console = Console(record=True, width=200)
    print_summary(summary, console)
    assert "one value in every transformed train example: bill_length_mm, year" in console.export_text()
    assert "<b>one value in every transformed train example: bill_length_mm, year</b>" in report.render(
        report.collect(run_id), {})


def test_the_cache_the_trainer_used_replaces_the_tuned_one_in_the_record_and_report():
    from hpml.pipelines import report

    run_id = records.start("record_test", "run-cache", {"epochs": 1}, {})
    pipeline = {"recommendation": "Slowest stage: read", "decisions": {"cache": "memory", "prefetch": 2}}
    records.log_node(run_id, "Transform", {}, _with_record(transform_record, {"input_pipeline": pipeline}), seconds=1.0)
    used = "none (one epoch reads the data once; tuned: memory)"
    records.log_node(run_id, "Trainer", {}, _with_record(trainer_record, {"input_cache": used}), seconds=1.0)
    records.finish(run_id)
    tags = records.client().get_run(run_id).data.tags
    assert (tags["input_pipeline.cache"], tags["input_pipeline.prefetch"]) == (used, "2")
    assert used in report.render(report.collect(run_id), {})


def test_a_failed_node_records_the_error_and_the_epochs_that_finished():
    from hpml.pipelines import report

    run_id = records.start("record_test", "run-failed", {"epochs": 3}, {})
    error = RuntimeError("training diverged: loss is nan")
    error.hint = "lower the learning rate"
    error.partial_history = [{"epoch": 1, "loss": 0.9, "seconds": 1.0}, {"epoch": 2, "loss": 0.5, "seconds": 1.0}]
    records.mark_failed(run_id, "Student", error, "Student.")
    summary = records.load(run_id)
    assert summary.status == "FAILED" and summary.tags["hpml.failed_node"] == "Student"
    assert summary.tags["hpml.error"] == "RuntimeError: training diverged: loss is nan"
    assert summary.tags["hpml.error_hint"] == "lower the learning rate"
    assert records.history(run_id, "Student.loss") == [(1, 0.9), (2, 0.5)]
    page = report.render(report.collect(run_id), {})
    assert "Failed in Student: RuntimeError: training diverged: loss is nan" in page
    assert "What to do: lower the learning rate" in page, "the report gives the hint the terminal gave"


def test_resolve_takes_a_run_id_a_unique_prefix_of_one_or_a_run_name():
    name = f"it's \"quoted\" {uuid.uuid4().hex[:8]} 100% \\"
    run_id = records.start("resolve_test", name, {}, {})
    assert records.resolve(run_id) == run_id
    assert records.resolve(run_id[:records.SHORT_ID]) == run_id
    assert records.resolve(run_id[:12].upper()) == run_id
    assert records.resolve(name) == run_id


def test_resolve_refuses_a_name_two_runs_share_and_one_no_run_has():
    name = f"twin-{uuid.uuid4().hex[:8]}"
    first, second = (records.start("resolve_test", name, {}, {}) for _ in range(2))
    with pytest.raises(HpmlError, match="names more than one run") as refused:
        records.resolve(name)
    assert first[:records.SHORT_ID] in str(refused.value) and second[:records.SHORT_ID] in str(refused.value)
    assert refused.value.hint == "name one of them by its id, or give more characters of the id"
    for unknown in ("f" * 32, "abc", f"no-such-{name}"):
        with pytest.raises(HpmlError, match=f"no run '{unknown}' in the run records"):
            records.resolve(unknown)


def test_find_matches_a_tag_value_with_quotes_exactly():
    value = f"manual__'{uuid.uuid4().hex[:8]}\" \\"
    wanted = records.start("find_test", "wanted", {}, {"airflow.run_id": value})
    records.start("find_test", "other", {}, {"airflow.run_id": value.replace("'", "x")})
    assert records.find("airflow.run_id", value, "find_test") == wanted
    assert records.find("airflow.run_id", value + "x", "find_test") is None
    assert records.find("airflow.run_id", value, "no_such_pipeline") is None


_TELEMETRY = """
from hpml.pipelines import records
records.start("telemetry_test", "run-1", {}, {})
from mlflow.telemetry.utils import is_telemetry_disabled
print("telemetry disabled:", is_telemetry_disabled())
"""


def test_a_run_record_starts_no_mlflow_telemetry(tmp_path):
    """MLflow 3 starts a client that sends usage events to mlflow-telemetry.io in any process that imports
    it, except under CI or pytest; hpml's processes are neither, so the markers are left out here. Where the
    network is unreachable the client gives itself up, so what is read is MLflow's own decision."""
    markers = {"PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK"}
    env = {k: v for k, v in os.environ.items() if k not in markers} | {"HPML_HOME": str(tmp_path)}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-c", _TELEMETRY], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "telemetry disabled: True" in done.stdout
    assert (tmp_path / "mlflow.db").exists(), "the record went to the home's own store"


_FIRST_RUN = """
import pathlib, sys, time
import mlflow.tracking  # imported first, so that the processes reach each store together
from hpml.pipelines import records
from hpml.pipelines.airflow import local as airflow_local
folder, me = pathlib.Path(sys.argv[1]), sys.argv[2]

def together(step):  # wait here until the test says go: every process then starts `step` at once
    (folder / f"{step}.{me}").touch()
    while not (folder / f"{step}.go").exists():
        time.sleep(0.005)

together("airflow")
airflow_local.migrate()
together("mlflow")
records.start("first_run", me, {}, {})
"""


def test_runs_started_at_once_on_a_fresh_home_set_up_its_stores_once(tmp_path):
    """Opening a new SQLite MLflow store creates its tables, and so does `airflow db migrate` on a new
    Airflow DB: two runs started together on a fresh HPML_HOME both did it, and one failed with
    'table ... already exists'. A lock beside each store makes the second wait."""
    home, names = tmp_path / "home", ["run-0", "run-1"]
    env = dict(os.environ, HPML_HOME=str(home), AIRFLOW_HOME=str(home / "airflow"))
    starts = [subprocess.Popen([sys.executable, "-c", _FIRST_RUN, str(tmp_path), name], env=env, cwd=PROJECT_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for name in names]
    for step in ("airflow", "mlflow"):
        deadline = time.monotonic() + 300
        while not all((tmp_path / f"{step}.{name}").exists() for name in names):
            assert time.monotonic() < deadline and all(s.poll() is None for s in starts), \
                f"a process died before {step}: " + "".join(s.communicate()[0][-3000:] for s in starts)
            time.sleep(0.05)
        (tmp_path / f"{step}.go").touch()
    for start in starts:
        output = start.communicate(timeout=300)[0]
        assert start.returncode == 0, output[-3000:]
    from mlflow.tracking import MlflowClient

    store = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    runs = store.search_runs([store.get_experiment_by_name("first_run").experiment_id])
    assert sorted(r.info.run_name for r in runs) == names


def test_a_node_tried_again_after_failing_reopens_the_record_and_the_report_says_it_was_retried(tmp_path):
    """A retried (or cleared) Airflow task runs its node again in the same run. The record stayed FAILED, with
    the old error, through the new try and after it succeeded, so the final report said "Status FINISHED"
    and "Failed in ExampleGen" on one page."""
    from hpml.components.example_gen import EXAMPLE_GEN
    from hpml.pipelines import runner
    from hpml.pipelines.dsl import Node, Pipeline
    from tests.helpers import write_csv

    header = "species,island,bill_length_mm,year"
    rows = [f"{'Adelie' if i % 2 else 'Gentoo'},Dream,{40 + i % 7}.5,2008" for i in range(40)]
    data = write_csv(tmp_path / "penguins.csv", header, [*rows[:5], "Adelie,Dream,abc,2008", *rows[5:]])
    pipeline = Pipeline(name="retry_test", params_schema={"type": "object", "properties": {}}, nodes=(
        Node("ExampleGen", EXAMPLE_GEN, params=lambda p: {"input_path": data, "numeric_columns": ["bill_length_mm"]}),
    ))
    context = runner.start(pipeline, {})
    with pytest.raises(HpmlError, match=r"penguins.csv:7: column 'bill_length_mm' must hold a number"):
        runner.execute_node(pipeline, "ExampleGen", context, {})
    failed = records.load(context.mlflow_run_id)
    assert failed.status == "FAILED" and failed.tags["hpml.failed_node"] == "ExampleGen"

    write_csv(data, header, rows)  # the data is fixed, and the task cleared
    runner.execute_node(pipeline, "ExampleGen", context, {})
    retried = records.load(context.mlflow_run_id)
    assert retried.status == "RUNNING", "the record is open again once a new try succeeds"
    assert not {"hpml.failed_node", "hpml.error", "hpml.error_hint"} & set(retried.tags), retried.tags
    assert retried.tags["hpml.retried.ExampleGen"].startswith(
        "InputDataError: " + data + ":7: column 'bill_length_mm' must hold a number")
    assert retried.examples == {"train": retried.examples["train"], "eval": 40 - retried.examples["train"]}
    # The report the failed try wrote is written again as the new try starts: it no longer says FAILED.
    page = open(retried.tags["hpml.report"], encoding="utf-8").read()
    assert "Status <b>RUNNING</b>" in page and "Failed in" not in page
    assert "ExampleGen was retried; a try before failed: InputDataError: " in page

    runner.finish(context)
    summary = records.load(context.mlflow_run_id)
    page = open(summary.tags["hpml.report"], encoding="utf-8").read()
    assert summary.status == "FINISHED" and "Status <b>FINISHED</b>" in page
    assert "Failed in" not in page and "What to do:" not in page
    assert "ExampleGen was retried; a try before failed: InputDataError: " in page


def _taken_over_in_beam(inputs, outputs, params):
    from hpml.components.errors import TakenOver

    try:
        raise TakenOver("gs://hpml-test/run/Transform/transformed_examples: an attempt of this task that began after "
                        "this one is writing it; this attempt leaves it to that one")
    except TakenOver as err:
        raise RuntimeError("a Beam stage failed") from err  # as a runner wraps its workers' errors


def test_an_attempt_taken_over_by_its_retry_leaves_the_run_record_to_it(tmp_path):
    """A Transform attempt cut off from the network came back after its retry had begun, found the retry's work and
    ended: it marked the run FAILED and wrote the failure report while the retry went on, and the run's live view
    lost the Trainer's progress. The run record belongs to the retry: the attempt ends without touching it."""
    from hpml.components.spec import ComponentSpec
    from hpml.pipelines import runner
    from hpml.pipelines.dsl import Node, Pipeline

    pipeline = Pipeline(name="taken_over", params_schema={"type": "object", "properties": {}}, nodes=(
        Node("Transform", ComponentSpec("Transform", {}, {}, {}, _taken_over_in_beam)),))
    context = runner.start(pipeline, {})
    with pytest.raises(RuntimeError, match="a Beam stage failed"):
        runner.execute_node(pipeline, "Transform", context, {})
    record = records.load(context.mlflow_run_id)
    assert record.status == "RUNNING"
    assert not {"hpml.failed_node", "hpml.error", "hpml.error_hint"} & set(record.tags), record.tags
    report = record.tags.get("hpml.report")
    assert report is None or "Failed in" not in open(report, encoding="utf-8").read()
