"""What the Report view in Airflow's UI reads: the Trainer's live progress file, a run's status, and the checks
on which report files it may serve. The view itself is tested against a real Airflow in test_browser.py."""
import json
import os

import pytest


def test_the_progress_file_holds_epochs_eta_the_loss_so_far_and_each_epochs_metrics(tmp_path):
    import numpy as np
    import tf_keras

    from hpml.components.trainer.progress_reporter import TRACE_POINTS, ProgressReporter
    from hpml.components.trainer.progress_state import read_progress, read_step_progress

    seen = []

    class Peek(tf_keras.callbacks.Callback):  # what a reader sees at the end of each epoch, mid-run
        def on_epoch_end(self, epoch, logs=None):
            seen.append(read_progress(str(tmp_path)))

    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"])
    x = np.random.default_rng(0).normal(size=(400, 2)).astype("float32")
    model.fit(x, x[:, :1], validation_data=(x[:40], x[:40, :1]), batch_size=2, epochs=3, verbose=0,
              callbacks=[ProgressReporter(str(tmp_path), every_seconds=0), Peek()])
    final = read_progress(str(tmp_path))
    assert final["event"] == "end" and final["step"] == 600 and (final["epoch"], final["epochs"]) == (3, 3)
    assert final["steps_per_epoch"] == 200 and final["eta_s"] == 0 and final["steps_per_s"] > 0
    assert [row["epoch"] for row in final["history"]] == [1, 2, 3]
    assert {"loss", "mae", "val_loss", "val_mae"} <= set(final["history"][0])
    assert final["history"][2]["loss"] < final["history"][0]["loss"]
    trace = final["loss_trace"]
    assert TRACE_POINTS // 2 <= len(trace) <= TRACE_POINTS, "the trace keeps to its size over 600 steps"
    assert trace[0][0] < 50 and trace[-1][0] > 550, "and covers the whole run"
    # Mid-run, after epoch 1: the first epoch's metrics, and an ETA for the two epochs left.
    assert seen[0]["epoch"] == 1 and len(seen[0]["history"]) == 1 and seen[0]["eta_s"] > 0
    assert seen[0]["step"] == 200
    assert final["grain"] == "step" and read_step_progress(str(tmp_path)) == final


def test_an_epoch_reporter_has_no_batch_hook_and_gives_epochs_eta_and_metrics_at_each_epochs_end(tmp_path):
    """Parameter-server training allows no batch-level callback (tf_keras refuses one that has a batch hook), so it
    gets the epoch reporter. Its file names no resume step: launchers measure a restart's cost only from steps."""
    import numpy as np
    import tf_keras

    from hpml.components.trainer.progress_reporter import EpochProgressReporter
    from hpml.components.trainer.progress_state import read_progress, read_step_progress

    reporter = EpochProgressReporter(str(tmp_path))
    assert not reporter._implements_train_batch_hooks(), "tf_keras would refuse it under parameter servers"
    seen = []

    class Peek(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(read_progress(str(tmp_path)))

    model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"])
    x = np.random.default_rng(0).normal(size=(400, 2)).astype("float32")
    model.fit(x, x[:, :1], validation_data=(x[:40], x[:40, :1]), batch_size=4, epochs=3, verbose=0,
              callbacks=[reporter, Peek()])
    # Within an epoch the file holds what the epoch's beginning wrote: nothing per step. From the second epoch on,
    # with the first's metrics and an ETA at its pace.
    assert {(p["event"], p["epoch"], p["step"]) for p in seen[:100]} == {("epoch_begin", 1, 0)}
    assert "eta_s" not in seen[0], "no pace before an epoch has ended"
    assert {(p["event"], p["epoch"], p["step"]) for p in seen[100:200]} == {("epoch_begin", 2, 100)}
    assert seen[100]["eta_s"] > 0 and seen[100]["history"][0]["epoch"] == 1
    assert set(seen[100]["logs"]) == {"loss", "mae"}
    final = read_progress(str(tmp_path))
    assert final["grain"] == "epoch" and final["resumed_from_step"] is None and final["loss_trace"] == []
    assert final["event"] == "end" and final["step"] == 300 and (final["epoch"], final["epochs"]) == (3, 3)
    assert final["eta_s"] == 0 and final["steps_per_s"] > 0
    assert [row["epoch"] for row in final["history"]] == [1, 2, 3] and "val_mae" in final["history"][2]
    assert read_step_progress(str(tmp_path)) is None


def test_a_restart_is_recorded_with_its_reason(tmp_path):
    from hpml.components.trainer.progress_state import read_restarts, record_restart

    record_restart(str(tmp_path), 1, "worker-1 exited with -9 (killed)")
    record_restart(str(tmp_path), 2, "worker-0 exited with 1", alone="worker-0")
    restarts = read_restarts(str(tmp_path))
    assert [(r["restarts"], r["process"]) for r in restarts] == [(1, None), (2, "worker-0")]
    assert restarts[0]["reason"] == "worker-1 exited with -9 (killed)"


def test_a_finished_runs_status_names_its_components_report_and_how_to_open_it(penguin_dag_run):
    from hpml.pipelines import run_status

    run = penguin_dag_run["dag_run"]
    found = run_status.find_run("penguin", run.run_id)
    assert found == penguin_dag_run["mlflow_run_id"]
    assert run_status.find_run("distillation", run.run_id) is None, "another DAG's view finds no such run"
    status = run_status.status(found)
    assert status["status"] == "FINISHED" and status["report"] is True and status["training"] == {}
    assert [(c["node"], c["state"]) for c in status["components"]] == [
        ("ExampleGen", "done"), ("Transform", "done"), ("Trainer", "done"), ("Gate", "done"), ("Pusher", "done")]
    assert all(c["seconds"] > 0 for c in status["components"])
    assert status["tensorboard"].startswith("tensorboard --logdir '") and "Trainer/model_run" in status["tensorboard"]
    assert status["mlflow_url"] is None, "a SQLite store has no UI to link to"
    assert 0 <= status["input_stall"] < 1
    json.dumps(status)  # served as JSON as it is


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd", "a/../../secret.txt", "", ".", "link.txt",
                                  "sub\\..\\..\\secret.txt", "nope.png", "sub", "report.html\x00.png"])
def test_only_files_inside_the_report_are_served(tmp_path, path):
    from fastapi import HTTPException

    from hpml.pipelines.airflow.report_app import report_file

    report = tmp_path / "run" / "report"
    (report / "sub").mkdir(parents=True)
    (report / "report.html").write_text("<html>")
    (report / "sub" / "plot.png").write_bytes(b"png")
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(tmp_path / "secret.txt", report / "link.txt")
    assert report_file(str(report), "report.html") == str(report / "report.html")
    assert report_file(str(report), "sub/plot.png") == str(report / "sub" / "plot.png")
    with pytest.raises(HTTPException) as err:
        report_file(str(report), path)
    assert err.value.status_code == 404
