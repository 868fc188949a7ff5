"""Run reports: written by the real DAG run, plots that exist and match the MLflow record."""
import json
import os
import re

import pytest

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(penguin_dag_run):
    from hpml.pipelines import records

    path = records.load(penguin_dag_run["mlflow_run_id"]).tags["hpml.report"]
    folder = os.path.dirname(path)
    return {"path": path, "folder": folder, "html": open(path, encoding="utf-8").read(),
            "data": json.load(open(os.path.join(folder, "report.json"))), "run": penguin_dag_run}


def test_the_dag_run_wrote_its_report_under_the_run_dir(report):
    summary = report["run"]["summary"]
    assert report["path"] == os.path.join(summary.tags["hpml.run_dir"], "report", "report.html")
    for name in ("curves.png", "throughput.png", "durations.png", "trainer_time.png", "input_stages.png",
                 "confusion.png"):
        raw = open(os.path.join(report["folder"], name), "rb").read()
        assert raw.startswith(PNG) and len(raw) > 5000, name
    # Self-contained: every plot is embedded, nothing is linked.
    assert len(re.findall(r'src="data:image/png;base64,', report["html"])) == 6
    assert "<img" in report["html"] and 'src="http' not in report["html"]


def test_plotted_curves_are_the_recorded_metrics(report):
    from hpml.pipelines import records

    run_id = report["run"]["mlflow_run_id"]
    series = report["data"]["series"]
    for name in ("loss", "val_loss", "accuracy", "val_accuracy", "examples_per_sec", "step_time_ms"):
        assert [tuple(p) for p in series[name]] == records.history(run_id, name), name
    assert len(series["loss"]) == report["run"]["conf"]["epochs"]
    assert report["data"]["durations"] == report["run"]["summary"].durations


def test_report_shows_params_plan_input_pipeline_and_durations(report):
    page, conf = report["html"], report["run"]["conf"]
    assert f"<td>epochs</td><td>{conf['epochs']}</td>" in page
    assert "Strategy plan: one_device" in page and "<li>" in page
    assert "<h2>Input pipeline</h2>" in page and "Input stall:" in page and "Slowest stage:" in page
    assert "Component durations" in page and "ExampleGen" in report["data"]["durations"]


def test_the_report_shows_where_the_trainers_time_went(report):
    """Each part of the Trainer's time is what its own record says: the epochs are metrics.jsonl's seconds, the
    tuning (with the step's trace apart) and the stall probe their files' seconds; together they fit inside the
    Trainer's duration."""
    from hpml.components import artifacts
    from hpml.components.trainer.callbacks import read_metrics
    from hpml.components.trainer.time_breakdown import PARTS

    spent = report["data"]["trainer_time"]
    run_dir = report["run"]["summary"].outputs["Trainer"]["model_run"]
    assert list(spent) == list(PARTS) and min(spent.values()) >= 0.0, spent
    assert spent["epochs"] == pytest.approx(sum(epoch["seconds"] for epoch in read_metrics(run_dir)))
    assert len(read_metrics(run_dir)) == report["run"]["conf"]["epochs"]
    tuned = json.load(open(os.path.join(run_dir, artifacts.TUNED_STEP_FILE)))
    assert spent["step_tuning"] + spent["step_trace"] == pytest.approx(tuned["seconds"])
    assert spent["step_trace"] == pytest.approx(tuned["trace_s"]) and tuned["trace_s"] > 0.0
    assert spent["input_stall_probe"] == pytest.approx(
        json.load(open(os.path.join(run_dir, artifacts.STALL_FILE)))["seconds"])
    assert spent["input_stall_probe"] > 0.0 and spent["preparing"] > 0.0 and spent["after_training"] > 0.0
    trainer = report["run"]["summary"].durations["Trainer"]
    assert 0.5 * trainer < sum(spent.values()) <= trainer + 0.05, (spent, trainer)
    assert "<h2>Where the Trainer's time went</h2>" in report["html"]
    assert all(f"<td>{part.replace('_', ' ')}</td>" in report["html"] for part in PARTS)


def test_a_classifier_report_has_per_class_metrics_and_a_confusion_matrix(report):
    """Counted from the model's own predictions on the eval split: every eval example lands in one cell, and
    recall is each row's diagonal share."""
    classification = report["data"]["classification"]
    summary = report["run"]["summary"]
    assert classification["classes"] == ["Adelie", "Gentoo", "Chinstrap"] or \
        sorted(classification["classes"]) == ["Adelie", "Chinstrap", "Gentoo"]
    matrix = classification["confusion_matrix"]
    assert sum(map(sum, matrix)) == classification["examples"] == summary.examples["eval"]
    for i, row in enumerate(classification["per_class"]):
        assert row["support"] == sum(matrix[i])
        assert row["recall"] == pytest.approx(matrix[i][i] / sum(matrix[i]))
    correct = sum(matrix[i][i] for i in range(len(matrix)))
    assert correct / classification["examples"] == pytest.approx(summary.eval_metrics["accuracy"], abs=1e-6)
    page = report["html"]
    assert "<h2>Per class</h2>" in page and "<th>precision</th>" in page and 'alt="confusion matrix"' in page


def test_report_says_how_to_open_the_run_in_mlflow_and_tensorboard(report):
    from hpml.pipelines import records

    summary, page = report["run"]["summary"], report["html"]
    experiment = records.client().get_run(summary.mlflow_run_id).info.experiment_id
    assert f"mlflow ui --backend-store-uri &#x27;{records.tracking_uri()}&#x27;" in page
    assert f"/#/experiments/{experiment}/runs/{summary.mlflow_run_id}" in page
    assert f"tensorboard --logdir &#x27;{summary.outputs['Trainer']['model_run']}&#x27;" in page


def test_epoch_axes_have_whole_number_ticks(tmp_path):
    """Three epochs plotted: matplotlib's default would tick 0.5, 1.0, 1.5, ..."""
    import matplotlib

    matplotlib.use("Agg")
    from hpml.pipelines.report import plots

    plt = plots._plt()
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [1.0, 0.5, 0.2])
    plots._epoch_axis(ax)
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if 0 <= t <= 2]
    plt.close(fig)
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_report_is_logged_to_mlflow(report):
    from hpml.pipelines import records

    logged = {a.path for a in records.client().list_artifacts(report["run"]["mlflow_run_id"], "report")}
    assert {"report/report.html", "report/curves.png", "report/report.json"} <= logged


def test_progress_mode_follows_the_terminal(monkeypatch):
    import io

    from hpml.components.trainer.callbacks import progress_mode

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("HPML_PROGRESS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert progress_mode(io.StringIO()) == "plain" and progress_mode(Tty()) == "bar"
    monkeypatch.setenv("CI", "true")
    assert progress_mode(Tty()) == "plain"
    monkeypatch.setenv("HPML_PROGRESS", "bar")
    assert progress_mode(io.StringIO()) == "bar"


def test_terminal_progress_bar_counts_every_step_with_an_eta():
    import io

    import numpy as np
    import tf_keras
    from rich.console import Console

    from hpml.components.trainer.callbacks import TerminalProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.ones((40, 2), "float32")
    model.fit(x, x[:, :1], batch_size=10, epochs=3, verbose=0, callbacks=[TerminalProgress(3, console=console)])
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "12/12 steps" in text and "epoch 3/3 loss=" in text
    assert re.search(r"\d+:\d\d:\d\d", text), "an ETA column"


def test_log_lines_print_above_the_bar_and_a_failed_fit_leaves_no_bar_behind():
    """A log line written while the bar was live went straight to the terminal, where the bar's next redraw
    erased it: at a terminal, most per-epoch lines vanished. A fit that raised left the bar live, redrawing
    itself among the error's lines, with the terminal's cursor hidden after the process ended."""
    import io
    import logging
    import sys

    import numpy as np
    import tf_keras
    from rich.console import Console

    from hpml.components.trainer.callbacks import terminal_progress as callbacks
    from hpml.components.trainer.executor import _run_in_process

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    stderr = sys.stderr
    handler = logging.StreamHandler(stderr)
    log = logging.getLogger("hpml.test_progress")
    log.addHandler(handler)
    log.setLevel(logging.INFO)

    class LogsThenFails(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            log.info("epoch %d done", epoch + 1)
            if epoch == 1:
                raise RuntimeError("stopped in epoch 2")

    def run_fn(_):
        model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        x = np.ones((40, 2), "float32")
        model.fit(x, x[:, :1], batch_size=10, epochs=3, verbose=0,
                  callbacks=[LogsThenFails(), callbacks.TerminalProgress(3, console=console)])

    try:
        with pytest.raises(RuntimeError, match="stopped in epoch 2"):
            _run_in_process(run_fn, None, "GZIP")
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    assert "epoch 1 done\n" in text and "epoch 2 done\n" in text, "the log lines went through rich"
    assert text.endswith("\x1b[?25h"), "the bar stopped and showed the cursor again"
    assert sys.stderr is stderr and handler.stream is stderr and not callbacks._LIVE
