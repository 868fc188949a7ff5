"""The hpml command line, run as a user would: a local pipeline run, runs, compare, errors."""
import os
import re
import subprocess
import sys

import pytest

HPML = [sys.executable, "-m", "pipelines.cli"]


def _hpml(*args, timeout=600):
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([*HPML, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def local_run(penguin_dag_run):
    """A local-runner run of the same pipeline with other values (after the DAG run)."""
    done = _hpml("run", "penguin", "--param", "epochs=1", "--param", "batch_size=64")
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_local_run_prints_a_summary(local_run):
    out = local_run.stdout
    for part in ("ExampleGen", "Transform", "Trainer", "Trainer/model", "eval: accuracy=", "run record: MLflow run"):
        assert part in out, part
    assert "artifacts: " in out and "/penguin/local__" in out


def test_runs_lists_both_engines_runs(local_run, penguin_dag_run):
    done = _hpml("runs", "--pipeline", "penguin")
    assert done.returncode == 0, done.stderr
    assert penguin_dag_run["mlflow_run_id"] in done.stdout
    assert "local__" in done.stdout and "FINISHED" in done.stdout


def test_compare_shows_differing_params_side_by_side(local_run, penguin_dag_run):
    from pipelines import records

    local_id = records.recent("penguin", 1)[0].info.run_id
    done = _hpml("runs", "compare", penguin_dag_run["mlflow_run_id"], local_id)
    assert done.returncode == 0, done.stderr
    epochs_row = next(line for line in done.stdout.splitlines() if "param epochs" in line)
    assert [cell.strip() for cell in epochs_row.split("│")][2:4] == ["3", "1"]
    assert "eval accuracy" in done.stdout
    plot = done.stdout.split("overlay plot: ")[1].split()[0]
    assert open(plot, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_prints_the_run_reports_path(local_run):
    from pipelines import records

    run = records.load(records.recent("penguin", 1)[0].info.run_id)
    done = _hpml("report", run.run_name)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == run.tags["hpml.report"] and os.path.isfile(done.stdout.strip())
    assert "run report: " + run.tags["hpml.report"] in local_run.stderr


def test_help_lists_the_commands_the_readme_documents():
    done = _hpml("--help")
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8").read()
    for command in ("run", "runs", "report", "bench"):
        assert re.search(rf"^    {command}\b", done.stdout, re.M), command
        assert f"hpml {command}" in readme, command
    bench = _hpml("bench", "--help").stdout
    assert "distributed, gpipe, distillation, input_pipeline" in bench


@pytest.mark.parametrize("args, first_line", [
    (("run", "penguin", "--param", "epochs=0"), "error: parameter 'epochs': 0 is less than the minimum of 1"),
    (("run", "penguin", "--param", "epochs"), "error: --param 'epochs' is not NAME=VALUE"),
    (("run", "walrus"), "error: unknown pipeline 'walrus'"),
    (("runs", "compare", "nope", "nada"), "error: no run 'nope' in the run records"),
    (("report", "nope"), "error: no run 'nope' in the run records"),
    (("bench", "walrus"), "error: unknown benchmark 'walrus'"),
    (("run", "penguin", "--param", "launcher=vertex"), "error: parameter 'launcher': 'vertex' submits to a remote "
     "cluster, which needs a container image of this project and cluster credentials that this deployment does "
     "not configure"),
])
def test_errors_are_one_line_plus_hint_without_traceback(args, first_line):
    done = _hpml(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-2] == first_line and lines[-1].startswith("hint: ")
    assert "Traceback" not in done.stderr


def test_a_local_run_reproduces_the_dag_run_exactly(penguin_dag_run):
    """Same data, same parameters (the module's fixed seed): the local engine's run learns exactly
    what the Airflow DAG run learned, epoch by epoch, to the last bit."""
    from pipelines import records

    args = [part for name, value in penguin_dag_run["conf"].items() for part in ("--param", f"{name}={value}")]
    done = _hpml("run", "penguin", "--engine", "local", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    local_id = re.search(r"run record: MLflow run ([0-9a-f]+)", done.stdout).group(1)
    dag_id = penguin_dag_run["mlflow_run_id"]
    learned = {run_id: records.client().get_run(run_id).data.metrics for run_id in (dag_id, local_id)}
    keys = sorted(k for k in learned[dag_id] if k.endswith(("loss", "accuracy")))
    assert "Trainer.loss" in keys or "loss" in keys, keys
    assert sorted(k for k in learned[local_id] if k.endswith(("loss", "accuracy"))) == keys
    for key in keys:
        assert records.history(local_id, key) == records.history(dag_id, key), key
