"""The hpml command line, run as a user would: a local pipeline run, runs, compare, errors."""
import os
import re
import subprocess
import sys

import pytest

HPML = [sys.executable, "-m", "hpml.pipelines.cli"]


def _hpml(*args, timeout=600, columns=200, **env_vars):
    env = dict(os.environ, COLUMNS=str(columns), **env_vars)
    return subprocess.run([*HPML, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def local_run(penguin_dag_run, tmp_path_factory):
    """A local-runner run of the same pipeline with other values (after the DAG run), on the penguins CSV
    with two rows broken and skip_bad_rows on."""
    import palmerpenguins

    source = os.path.join(os.path.dirname(palmerpenguins.__file__), "data", "penguins.csv")
    lines = open(source, encoding="utf-8").read().splitlines()
    lines[10] = lines[10] + ",extra"
    lines[20] = lines[20].replace("Adelie", "Adelie,")
    data = tmp_path_factory.mktemp("local_run") / "penguins_2_bad.csv"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = _hpml("run", "penguin", "--param", "epochs=1", "--param", "batch_size=64",
                 "--param", f"data_path={data}", "--param", "skip_bad_rows=true")
    assert done.returncode == 0, done.stderr[-3000:]
    done.data_path, done.rows = str(data), len(lines) - 1
    return done


def test_a_plain_run_is_quiet_and_verbose_brings_the_detail_back(local_run, tmp_path):
    """No TensorFlow start-up lines and no error-level line on a CPU run; one line for the input pipeline's
    decisions; the report's path once. --verbose shows each decision and TensorFlow's own lines."""
    both = local_run.stdout + local_run.stderr
    for noise in ("cudart_stub", "cuInit", "absl::InitializeLog", "E0000 "):
        assert noise not in both, noise
    tuner = [line for line in local_run.stderr.splitlines() if "input pipeline:" in line]
    assert len(tuner) == 1 and "tuned cache=" in tuner[0], tuner
    report = re.findall(r"report\.html", both)
    assert len(report) == 1, [line for line in both.splitlines() if "report.html" in line]

    verbose = _hpml("--verbose", "run", "penguin", "--param", "epochs=1", HPML_HOME=str(tmp_path / "home"))
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    decisions = [line for line in verbose.stderr.splitlines() if "input pipeline: " in line]
    assert len(decisions) >= 10 and any("map_parallelism = " in line for line in decisions), decisions
    assert "cudart_stub" in verbose.stderr, "verbose keeps TensorFlow's start-up lines"


def test_local_run_prints_a_summary(local_run):
    out = local_run.stdout
    for part in ("ExampleGen", "Transform", "Trainer", "Trainer/model", "eval: accuracy=", "run record: MLflow run"):
        assert part in out, part
    assert "artifacts: " in out and "/penguin/local__" in out
    examples = re.search(r"^examples: train=(\d+) eval=(\d+); 2 bad rows skipped$", out, re.M)
    assert examples, out
    assert int(examples[1]) + int(examples[2]) == local_run.rows - 2
    assert f"skipped bad row {local_run.data_path}:11: expected 8 fields, got 9" in local_run.stderr
    assert f"skipped bad row {local_run.data_path}:21: expected 8 fields, got 9" in local_run.stderr


def test_runs_lists_both_engines_runs(local_run, penguin_dag_run):
    done = _hpml("runs", "--pipeline", "penguin")
    assert done.returncode == 0, done.stderr
    assert penguin_dag_run["mlflow_run_id"][:8] in done.stdout and penguin_dag_run["dag_run"].run_id in done.stdout
    assert "local__" in done.stdout and "FINISHED" in done.stdout


def test_runs_piped_with_no_columns_set_keeps_each_run_on_one_line(local_run, penguin_dag_run):
    """`hpml runs | grep ...`: with no terminal and no COLUMNS, a long Airflow run id is not folded at 80."""
    env = {name: value for name, value in os.environ.items() if name != "COLUMNS"}
    done = subprocess.run([*HPML, "runs", "--pipeline", "penguin"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr
    run_id = penguin_dag_run["dag_run"].run_id
    assert len(run_id) > 30, run_id  # long enough that an 80-column table folds it
    line = next(line for line in done.stdout.splitlines() if penguin_dag_run["mlflow_run_id"][:8] in line)
    assert line.split()[1:3] == [run_id, "FINISHED"], done.stdout
    padded = [line for line in done.stdout.splitlines() if line != line.rstrip()]
    assert not padded, f"lines padded with trailing spaces: {padded}"


def test_ids_that_runs_shows_on_a_narrow_terminal_work_in_report_and_compare(local_run, penguin_dag_run):
    from hpml.pipelines import records

    done = _hpml("runs", "--pipeline", "penguin", columns=80)
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    shown = [line.split()[0] for line in done.stdout.splitlines() if "FINISHED" in line]
    dag_run_id = next(i for i in shown if penguin_dag_run["mlflow_run_id"].startswith(i))
    local_id = next(i for i in shown if records.recent("penguin", 1)[0].info.run_id.startswith(i))
    report = _hpml("report", dag_run_id)
    assert report.returncode == 0, report.stderr
    assert report.stdout.strip() == records.load(penguin_dag_run["mlflow_run_id"]).tags["hpml.report"]
    compare = _hpml("runs", "compare", dag_run_id, local_id)
    assert compare.returncode == 0, compare.stderr
    epochs_row = next(line for line in compare.stdout.splitlines() if "param epochs" in line)
    assert [cell.strip() for cell in epochs_row.split("│")][2:4] == ["3", "1"]


def test_compare_shows_differing_params_side_by_side(local_run, penguin_dag_run):
    from hpml.pipelines import records

    local_id = records.recent("penguin", 1)[0].info.run_id
    done = _hpml("runs", "compare", penguin_dag_run["mlflow_run_id"], local_id)
    assert done.returncode == 0, done.stderr
    epochs_row = next(line for line in done.stdout.splitlines() if "param epochs" in line)
    assert [cell.strip() for cell in epochs_row.split("│")][2:4] == ["3", "1"]
    assert "eval accuracy" in done.stdout
    rows = {cells[1]: cells[2:4] for line in done.stdout.splitlines()
            if len(cells := [c.strip() for c in line.split("│")]) > 3}
    assert rows["bad rows skipped"] == ["0", "2"], "the local run read a copy with two rows broken"
    dag_run, local = records.load(penguin_dag_run["mlflow_run_id"]), records.load(local_id)
    assert rows["examples train"] == [str(dag_run.examples["train"]), str(local.examples["train"])]
    # Durations in the order the components ran, to a tenth of a second (before: by name, to 4 decimals).
    timed = [(name, cells) for name, cells in rows.items() if name.endswith(" seconds")]
    assert [name for name, _ in timed] == ["ExampleGen seconds", "Transform seconds", "Trainer seconds",
                                           "Gate seconds", "Pusher seconds"]
    assert all(re.fullmatch(r"\d+\.\d", cell) for _, cells in timed for cell in cells), timed
    assert sum(local.examples.values()) == sum(dag_run.examples.values()) - 2
    plot = done.stdout.split("overlay plot: ")[1].split()[0]
    assert open(plot, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_compare_refuses_one_run_twice_and_tells_apart_runs_that_share_a_name():
    from hpml.pipelines import records

    first, second = (records.start("compare_test", "rerun", {"epochs": epochs}, {}) for epochs in (1, 2))
    done = _hpml("runs", "compare", first, first[:6].upper())
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-2] == \
        f"error: '{first}' and '{first[:6].upper()}' are the same run ({first[:8]})"
    done = _hpml("runs", "compare", first, second)
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if "rerun (" in line)
    assert f"rerun ({first[:8]})" in header and f"rerun ({second[:8]})" in header


def test_report_prints_the_run_reports_path(local_run):
    from hpml.pipelines import records

    run = records.load(records.recent("penguin", 1)[0].info.run_id)
    done = _hpml("report", run.run_name)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == run.tags["hpml.report"] and os.path.isfile(done.stdout.strip())
    assert f"report: {run.tags['hpml.report']}\n" in local_run.stdout
    page = open(done.stdout.strip(), encoding="utf-8").read()
    assert re.search(r"<h2>Data</h2><p>\d+ examples from 1 file: train \d+, eval \d+; <b>2 bad rows skipped</b>", page)


def test_report_open_hands_the_report_to_the_browser_or_says_it_could_not(local_run, tmp_path):
    from hpml.pipelines import records

    run = records.load(records.recent("penguin", 1)[0].info.run_id)
    browser = tmp_path / "browser.sh"
    browser.write_text(f"#!/bin/sh\necho \"$1\" > {tmp_path / 'opened'}\n")
    browser.chmod(0o755)
    env = dict(os.environ, BROWSER=str(browser))
    done = subprocess.run([*HPML, "report", run.run_name, "--open"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "opened").read_text().strip() == "file://" + run.tags["hpml.report"]
    assert "no web browser" not in done.stderr
    env["BROWSER"] = "false"  # a browser that fails to start, as where there is none
    done = subprocess.run([*HPML, "report", run.run_name, "--open"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.strip() == run.tags["hpml.report"]
    assert "note: no web browser could be started here" in done.stderr


def test_help_lists_the_commands_the_readme_documents():
    done = _hpml("--help")
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8").read()
    for command in ("run", "runs", "report", "bench"):
        assert re.search(rf"^    {command}\b", done.stdout, re.M), command
        assert f"hpml {command}" in readme, command
    bench = _hpml("bench", "--help").stdout
    assert "distributed, gpipe, distillation, input_pipeline" in bench


def test_version_names_hpml_and_the_libraries_it_runs_on():
    from importlib import metadata

    done = _hpml("--version")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"hpml {metadata.version('hpml')}"  # the package's version, not a second copy of it
    for library in ("tensorflow", "tensorflow-transform", "apache-beam", "apache-airflow", "mlflow"):
        assert f"  {library} {metadata.version(library)}" in lines, library


@pytest.mark.parametrize("args, first_line", [
    (("run", "penguin", "--param", "epochs=0"), "error: parameter 'epochs': 0 is less than the minimum of 1"),
    (("run", "penguin", "--param", "epochs"), "error: --param 'epochs' is not NAME=VALUE"),
    (("run", "walrus"), "error: unknown pipeline 'walrus'"),
    (("runs", "compare", "nope", "nada"), "error: no run 'nope' in the run records"),
    (("report", "nope"), "error: no run 'nope' in the run records"),
    (("runs", "--limit", "0"), "error: --limit must be at least 1, not 0"),
    (("runs", "--pipeline", "walrus"), "error: unknown pipeline 'walrus'"),
    (("runs", "list", "nope"), "error: runs list takes no run ids (got nope)"),
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


@pytest.mark.parametrize("engine", ["local", "airflow"])
def test_a_failed_component_ends_in_its_own_error_and_hint_on_either_engine(engine, airflow_db, tmp_path):
    """Under Airflow the component fails in a task process: the CLI reads its error and hint back from the
    run record instead of printing only the DAG run's state. Where tasks have retries, bad input uses none:
    every try would fail the same way."""
    from tests.helpers import write_csv

    csv = write_csv(tmp_path / "penguins.csv", "species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,"
                    "body_mass_g,sex,year", ["Adelie,Dream,39.1,18.7,181,3750,male,2007"] * 5
                    + ["Adelie,Dream,39.1,18.7,181,heavy,male,2007"])
    retries = {"HPML_TASK_RETRIES": "2", "HPML_TASK_RETRY_DELAY_S": "0"}
    done = _hpml("run", "penguin", "--engine", engine, "--param", f"data_path={csv}", **retries)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    where = "ExampleGen failed: InputDataError: " if engine == "airflow" else ""
    assert lines[-2:] == [f"error: {where}{csv}:7: column 'body_mass_g' must hold a number, got 'heavy'",
                          "hint: fix the row, or set skip_bad_rows=true"]
    if engine == "local":  # Beam logged the DoFn's exception with its traceback before re-raising it
        assert "Traceback" not in done.stderr, "the CLI's errors are one line plus a hint; --debug shows more"
    # Either engine prints hpml's lines alike, one per step: not Airflow's per-task lines in its own format.
    assert re.search(r"^\d\d:\d\d:\d\d hpml\.runner ExampleGen: starting$", done.stderr, re.M), done.stderr[-3000:]
    assert "[DAG TEST]" not in done.stdout + done.stderr and " loc=" not in done.stdout + done.stderr
    listed = _hpml("runs", "--pipeline", "penguin", "--limit", "1", columns=80).stdout.splitlines()
    row = next(i for i, line in enumerate(listed) if "FAILED" in line)
    assert listed[row + 1].split()[-1] == "ExampleGen", "the listing names the component a failed run stopped in"
    # The failed run's report was written where it failed (under Airflow, finish_run never runs), and the log
    # says where; before, only `hpml report RUN` wrote one.
    from hpml.pipelines import records

    tags = records.load(records.resolve(listed[row].split()[0])).tags
    page = open(tags["hpml.report"], encoding="utf-8").read()
    assert f"Failed in ExampleGen: InputDataError: {csv}:7: column &#x27;body_mass_g&#x27; must hold a number" in page
    assert "What to do: fix the row, or set skip_bad_rows=true" in page
    assert "<h2>Input pipeline</h2>" not in page, "no empty section for a component that never ran"
    assert f"run report (the run failed in ExampleGen): {tags['hpml.report']}" in done.stderr
    if engine == "airflow":
        from airflow.models import DagRun

        run = DagRun.find(dag_id="penguin", run_id=tags["airflow.run_id"])[0]
        tries = {ti.task_id: (ti.state, ti.try_number, ti.max_tries) for ti in run.get_task_instances()}
        assert tries["ExampleGen"] == ("failed", 1, 2), f"one try, with 2 retries left unused: {tries}"
        assert "hpml.retried.ExampleGen" not in tags


@pytest.mark.parametrize("engine", ["local", "airflow"])
def test_ctrl_c_ends_a_run_in_two_lines_and_its_record_says_where(tmp_path, engine):
    """Ctrl-C during training printed a 70-line traceback from inside TensorFlow's checkpointing. Under Airflow
    the task's failure hid it: the run exited 2, "Trainer failed: KeyboardInterrupt", as if for bad input."""
    import signal
    import time

    from hpml.pipelines import records

    log, out = tmp_path / "stderr.txt", tmp_path / "stdout.txt"  # dag.test echoes the task logs on stdout
    with open(log, "w", encoding="utf-8") as err, open(out, "w", encoding="utf-8") as stdout:
        # As at a terminal: a test run started in the background of a shell inherits SIGINT ignored.
        run = subprocess.Popen([*HPML, "run", "penguin", "--engine", engine, "--param", "epochs=500"],
                               stdout=stdout, stderr=err, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 300
        while "epoch 2/500" not in log.read_text(encoding="utf-8") + out.read_text(encoding="utf-8"):
            assert run.poll() is None and time.monotonic() < deadline, log.read_text(encoding="utf-8")[-3000:]
            time.sleep(0.2)
        run.send_signal(signal.SIGINT)
        status = run.wait(timeout=120)
    text = log.read_text(encoding="utf-8")
    assert status == 130, f"128 + SIGINT, as a shell reports it; got {status} after:\n{text[-4000:]}"
    assert text.strip().splitlines()[-2:] == ["error: interrupted",
                                              "hint: hpml runs lists it as FAILED, with the component it stopped in"]
    if engine == "local":  # under Airflow the task log, which the run echoes, holds Airflow's own traceback
        assert "Traceback" not in text
    tags = records.load(records.recent("penguin", 1)[0].info.run_id).tags
    assert (tags["hpml.failed_node"], tags["hpml.error"]) == ("Trainer", "KeyboardInterrupt")


_CLEAN_UP_FAILS = """
import os, signal, time
from hpml.components.spec import ComponentSpec
from hpml.pipelines.dsl import Node, Pipeline


def _interrupted_clean_up(inputs, outputs, params):
    try:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as the terminal sends it
        time.sleep(30)
    except KeyboardInterrupt:
        raise OSError("database is locked")  # the clean-up on the way out fails


PIPELINE = Pipeline(name="interrupted", params_schema={"type": "object", "properties": {}}, nodes=(
    Node("Cleaner", ComponentSpec("Cleaner", {}, {}, {}, _interrupted_clean_up)),))
"""


def test_ctrl_c_that_a_failing_clean_up_turned_into_another_error_still_ends_as_an_interruption(tmp_path):
    """A library's clean-up can fail while Ctrl-C unwinds it (a database session, a half-written file): its error
    replaced the KeyboardInterrupt, and the run ended in a traceback with exit status 1, recorded as a crash."""
    import signal

    from hpml.pipelines import records

    (tmp_path / "interrupted").mkdir()
    (tmp_path / "interrupted" / "pipeline.py").write_text(_CLEAN_UP_FAILS, encoding="utf-8")
    done = subprocess.run([*HPML, "run", "interrupted", "--engine", "local"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-2:] == [
        "error: interrupted", "hint: hpml runs lists it as FAILED, with the component it stopped in"]
    assert "Traceback" not in done.stderr
    summary = records.load(records.recent("interrupted", 1)[0].info.run_id)
    assert summary.status == "FAILED"
    assert (summary.tags["hpml.failed_node"], summary.tags["hpml.error"]) == ("Cleaner", "KeyboardInterrupt")


def _local_run_histories(conf: dict) -> tuple[str, dict]:
    """A local-engine penguin run with `conf`: its MLflow run id and every loss/accuracy history."""
    args = [part for name, value in conf.items() for part in ("--param", f"{name}={value}")]
    done = _hpml("run", "penguin", "--engine", "local", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = re.search(r"run record: MLflow run ([0-9a-f]+)", done.stdout).group(1)
    return run_id, _histories(run_id)


def _histories(run_id: str) -> dict:
    from hpml.pipelines import records

    # The champion a run's gate met depends on the runs pushed before it, not on what this run learned.
    keys = sorted(k for k in records.client().get_run(run_id).data.metrics if k.endswith(("loss", "accuracy"))
                  and not k.startswith("gate.champion."))
    return {key: records.history(run_id, key) for key in keys}


def test_a_local_run_reproduces_the_dag_run_exactly(penguin_dag_run):
    """Same data, same parameters (seed 42 by default): the local engine's run learns exactly
    what the Airflow DAG run learned, epoch by epoch, to the last bit."""
    _, local = _local_run_histories(penguin_dag_run["conf"])
    dag = _histories(penguin_dag_run["mlflow_run_id"])
    assert "Trainer.loss" in dag or "loss" in dag, sorted(dag)
    assert sorted(local) == sorted(dag)
    for key in dag:
        assert local[key] == dag[key], key


def test_another_seed_learns_another_model(penguin_dag_run):
    """The `seed` parameter reaches the Trainer: initial weights and shuffle order change, so the
    training loss differs from the first epoch on, and the run records the seed."""
    from hpml.pipelines import records

    run_id, other = _local_run_histories({**penguin_dag_run["conf"], "seed": 7})
    dag = _histories(penguin_dag_run["mlflow_run_id"])
    loss = "Trainer.loss" if "Trainer.loss" in dag else "loss"
    assert [step for step, _ in other[loss]] == [step for step, _ in dag[loss]]
    assert other[loss][0][1] != dag[loss][0][1]
    params = records.client().get_run(run_id).data.params
    assert params.get("seed") == "7", {k: v for k, v in params.items() if "seed" in k}
