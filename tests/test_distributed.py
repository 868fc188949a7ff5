"""Strategies and the local launcher on real TF processes over loopback."""
import glob
import json
import os
import signal
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from hpml.components.errors import SpecError
from hpml.components.trainer import TRAINER
from hpml.components.trainer.progress_state import read_progress
from hpml.components.trainer.launchers.local import LaunchError
from tests.helpers import trainer_inputs, trainer_outputs

TOY = os.path.join(os.path.dirname(__file__), "assets", "toy_run_fn.py")
PS_BATCHES = os.path.join(os.path.dirname(__file__), "assets", "ps_batches_run_fn.py")


def _weights(outputs):
    with np.load(os.path.join(outputs["model_run"], "weights.npz")) as data:
        return [data[k] for k in sorted(data.files, key=lambda k: int(k.split("_")[1]))]


def test_two_mwms_workers_end_with_the_weights_of_one_process(penguin_outputs, tmp_path):
    one, two = trainer_outputs(tmp_path, "one"), trainer_outputs(tmp_path, "two")
    TRAINER.run(trainer_inputs(penguin_outputs), one, {"module": TOY, "strategy": "one_device"})
    result = TRAINER.run(trainer_inputs(penguin_outputs), two, {"module": TOY, "num_workers": 2, "max_restarts": 0})
    assert result["plan"]["strategy"] == "multi_worker_mirrored"
    assert result["launch"]["restarts"] == 0
    moved = max(np.abs(w).max() for w in _weights(one))
    assert moved > 0.1
    for single, cluster in zip(_weights(one), _weights(two)):
        np.testing.assert_allclose(cluster, single, atol=1e-5, rtol=1e-5)


def test_central_storage_retry_resumes_from_its_backup_with_the_uninterrupted_weights(penguin_outputs, tmp_path):
    """tf_keras's BackupAndRestore refuses CentralStorage; ours allows it. A run that dies after
    epoch 2 of 3 is retried: the retry trains epoch 3 only and ends with the weights of a run
    that never died."""
    whole, retried = trainer_outputs(tmp_path, "cs_whole"), trainer_outputs(tmp_path, "cs_retried")
    params = {"module": TOY, "strategy": "central_storage"}
    TRAINER.run(trainer_inputs(penguin_outputs), whole, dict(params, hyperparameters={"crash_once_after_epoch": 0}))
    faulty = dict(params, hyperparameters={"crash_once_after_epoch": 2})
    with pytest.raises(RuntimeError, match="transient fault after epoch 2"):
        TRAINER.run(trainer_inputs(penguin_outputs), retried, faulty)
    result = TRAINER.run(trainer_inputs(penguin_outputs), retried, faulty)
    assert result["plan"]["strategy"] == "central_storage"
    assert json.load(open(os.path.join(whole["model_run"], "epochs_run.json"))) == [0, 1, 2]
    assert json.load(open(os.path.join(retried["model_run"], "epochs_run.json"))) == [2], \
        "the retry started over instead of resuming from the backup"
    for uninterrupted, resumed in zip(_weights(whole), _weights(retried)):
        np.testing.assert_allclose(resumed, uninterrupted, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("strategy, replicas", [("mirrored", 4), ("central_storage", 4)])
def test_mirrored_and_central_storage_on_logical_cpus(penguin_outputs, tmp_path, strategy, replicas):
    from hpml.components.trainer.strategies import make_strategy

    assert make_strategy(strategy).num_replicas_in_sync == replicas
    result = TRAINER.run(trainer_inputs(penguin_outputs), trainer_outputs(tmp_path, strategy), {
        "module": "hpml.examples.penguin.module", "strategy": strategy,
        "hyperparameters": {"epochs": 3, "batch_size": 16}})
    assert result["plan"]["strategy"] == strategy
    losses = [row["loss"] for row in result["history"]]
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_mirrored_and_central_storage_on_exactly_two_logical_cpus(penguin_outputs, tmp_path):
    import json
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "assets", "two_logical_cpus.py")
    inputs = trainer_inputs(penguin_outputs)
    done = subprocess.run([sys.executable, script, inputs["examples"], inputs["transform_graph"], inputs["schema"],
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.split("RESULTS ", 1)[1])
    for strategy in ("mirrored", "central_storage"):
        assert results[strategy]["replicas"] == 2 and results[strategy]["plan"] == strategy
        losses = results[strategy]["losses"]
        assert len(losses) == 3 and losses[-1] < losses[0]
        assert os.path.isfile(tmp_path / strategy / "model" / "Format-Serving" / "saved_model.pb")


def test_parameter_server_training_with_two_workers_and_one_ps(penguin_outputs, tmp_path):
    """Through the tuned input pipeline, as the DAG wires it; the restart tests below read through TFXIO."""
    outputs = trainer_outputs(tmp_path, "pss")
    inputs = dict(trainer_inputs(penguin_outputs), input_pipeline=penguin_outputs["Transform"]["input_pipeline"])
    result = TRAINER.run(inputs, outputs, {
        "module": "hpml.examples.penguin.module", "num_workers": 2, "num_ps": 1, "max_restarts": 0,
        # The module's default rate: at 0.05 Adam drives the loss to ~0 by epoch 2 and asynchronous
        # updates then throw it back up (epoch 4 at 0.0001-0.93x epoch 1 over 9 runs, one over 0.7x).
        "hyperparameters": {"epochs": 4, "batch_size": 16, "learning_rate": 0.01}})
    assert result["plan"]["strategy"] == "parameter_server"
    losses = [row["loss"] for row in result["history"]]
    assert len(losses) == 4 and losses[-1] < 0.2 * losses[0], losses
    assert result["eval_metrics"]["accuracy"] > 0.7
    # Validated every epoch on the whole eval split: the last epoch's figures are the final evaluation's.
    assert all({"val_loss", "val_accuracy"} <= set(row) for row in result["history"]), result["history"]
    assert all(0 < row["val_seconds"] < row["seconds"] for row in result["history"]), "timed apart from training"
    assert result["history"][-1]["val_loss"] == pytest.approx(result["eval_metrics"]["loss"], rel=1e-6)
    assert result["history"][-1]["val_accuracy"] == pytest.approx(result["eval_metrics"]["accuracy"], rel=1e-6)
    assert os.path.isfile(os.path.join(outputs["model"], "Format-Serving", "saved_model.pb"))


@pytest.mark.parametrize("accessor", ["tfxio", "input_pipeline"])
def test_parameter_server_workers_each_shuffle_in_their_own_order(penguin_outputs, tmp_path, accessor):
    """One traced dataset function runs on every worker: with the module's fixed seed both workers
    read the same examples in the same order, so 100 steps see only about 50 distinct examples.
    Seeds drawn per worker make the two orders independent: about 100 - 50 * 50 / rows distinct."""
    outputs = trainer_outputs(tmp_path, f"ps_order_{accessor}")
    inputs = trainer_inputs(penguin_outputs)
    if accessor == "input_pipeline":
        inputs["input_pipeline"] = penguin_outputs["Transform"]["input_pipeline"]
    # One restart, as the Trainer allows by default (2): TF's coordinator has crashed (SIGSEGV, in join) in about
    # one run of this test in several dozen; a restart runs the whole run_fn again and rewrites batches.json.
    result = TRAINER.run(inputs, outputs, {"module": PS_BATCHES, "num_workers": 2, "num_ps": 1, "max_restarts": 1})
    assert result["plan"]["strategy"] == "parameter_server"
    examples = [tuple(row) for row in json.load(open(os.path.join(outputs["model_run"], "batches.json")))]
    rows = sum(1 for _ in tf.data.TFRecordDataset(
        tf.io.gfile.glob(os.path.join(penguin_outputs["Transform"]["transformed_examples"], "Split-train", "*")),
        compression_type="GZIP"))
    assert len(examples) == 100 and rows > 150
    assert len(set(examples)) >= 80, (len(set(examples)), rows)


def _kill_when(ready, work: str, process: str, within_s: float) -> tuple[threading.Thread, dict]:
    """A thread that SIGKILLs the launcher's `process` (by the pids file in `work`) once `ready()`
    returns a dict of what it saw; that dict fills the returned one, which stays empty if it never does."""
    killed: dict = {}

    def assassin():
        deadline = time.time() + within_s
        while time.time() < deadline:
            seen = ready()
            if seen:
                pid = json.load(open(os.path.join(work, "pids.json")))[process]
                os.kill(pid, signal.SIGKILL)
                killed.update(seen, pid=pid)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=assassin, daemon=True)
    thread.start()
    return thread, killed


def _watch_pids(work: str) -> tuple[threading.Event, dict]:
    """Until the returned event is set, every pid the launcher's pids file names, per process."""
    stop, seen = threading.Event(), {}

    def watch():
        while not stop.is_set():
            try:
                for name, pid in json.load(open(os.path.join(work, "pids.json"))).items():
                    seen.setdefault(name, set()).add(pid)
            except (OSError, ValueError):
                pass  # not written yet, or being replaced
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    return stop, seen


def _watch_progress(work: str) -> tuple[threading.Event, list[dict]]:
    """Until the returned event is set, each new state of the live progress file in `work`."""
    stop, seen = threading.Event(), []

    def watch():
        while not stop.is_set():
            progress = read_progress(os.path.join(work, "progress"))
            if progress and (not seen or progress["time"] != seen[-1]["time"]):
                seen.append(progress)
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    return stop, seen


def _ps_epoch_backed_up(outputs, work):
    """Once the coordinator has logged an epoch and written its backup (the run dir is a temporary until published)."""
    def ready():
        logged = [open(path).read() for path in glob.glob(outputs["model_run"] + ".tmp-*/metrics.jsonl")]
        return {"epoch_logged": True} if any(t.strip() for t in logged) and os.path.isdir(
            os.path.join(work, "backup")) else None
    return ready


def _epochs_logged(outputs) -> list[int]:
    return [json.loads(line)["epoch"] for line in open(os.path.join(outputs["model_run"], "metrics.jsonl"))
            if line.strip()]


def test_parameter_server_cluster_resumes_from_the_epoch_backup(penguin_outputs, tmp_path):
    """A parameter server killed after the coordinator backed up an epoch: the variables are gone, so the
    cluster is restarted, and the coordinator resumes after that epoch instead of from the start."""
    outputs = trainer_outputs(tmp_path, "pss_kill")
    work, epochs = outputs["model"] + ".work", 10
    thread, killed = _kill_when(_ps_epoch_backed_up(outputs, work), work, "ps-0", within_s=300)
    stop_watching, progress = _watch_progress(work)
    result = TRAINER.run(trainer_inputs(penguin_outputs), outputs, {
        "module": "hpml.examples.penguin.module", "num_workers": 2, "num_ps": 1, "max_restarts": 1,
        "backup_save_freq": 5, "hyperparameters": {"epochs": epochs, "batch_size": 8, "learning_rate": 0.05}})
    thread.join()
    stop_watching.set()
    assert killed, "the parameter server was never killed"
    assert result["plan"]["strategy"] == "parameter_server"
    assert result["launch"]["restarts"] == 1 and result["launch"]["restarted_in_place"] == []
    assert "ps-0 exited with code -9 (SIGKILL)" in result["launch"]["failures"][0]
    logged = _epochs_logged(outputs)
    # The killed attempt logged epoch 1 before the kill; a restart from scratch would log it again.
    assert logged.count(1) == 1, f"the restarted coordinator began at epoch 1, not after its backup: {logged}"
    assert logged[-1] == epochs and sorted(set(logged)) == list(range(1, epochs + 1)), logged
    assert [row["epoch"] for row in result["history"]] == list(range(1, epochs + 1))
    assert os.path.isfile(os.path.join(outputs["model"], "Format-Serving", "saved_model.pb"))
    assert not os.path.exists(work), "the backup is removed once training succeeded"
    # The coordinator's progress, for the Airflow UI, comes at each epoch's end: the epoch, the step, an ETA, each
    # epoch's metrics. The restarted coordinator's first epoch is the one after its backup.
    assert progress and all(p["grain"] == "epoch" and p["resumed_from_step"] is None for p in progress), progress
    ends = [p for p in progress if p["event"] == "epoch"]
    assert ends and all(p["eta_s"] > 0 or p["epoch"] == epochs for p in ends), ends
    assert all(p["history"][-1]["epoch"] == p["epoch"] and p["step"] > 0 for p in ends), ends
    pids = list(dict.fromkeys(p["pid"] for p in progress))
    assert len(pids) == 2, f"one coordinator before the kill, one after: {pids}"
    begun = [p["epoch"] for p in progress if p["event"] == "epoch_begin" and p["pid"] == pids[1]]
    assert begun and min(begun) > 1, f"the restarted coordinator's epochs begin after its backup: {progress}"
    # It names no resume step, so the launcher's watch for the restart's recovery measures nothing from it (the
    # end of training is no recovery), and ends with the launch, not with this process.
    assert "recovery_seconds" not in result["launch"] and "steps_lost" not in result["launch"], result["launch"]
    assert "hpml-recovery-watch" not in [thread.name for thread in threading.enumerate()]


def test_parameter_server_worker_is_restarted_alone_and_taken_back(penguin_outputs, tmp_path):
    """The only worker of a parameter-server cluster killed mid-training: the launcher restarts that
    worker alone, on its old address, and the same coordinator (never restarted) takes it back and
    finishes; with no other worker, it could not have finished without it."""
    outputs = trainer_outputs(tmp_path, "pss_worker_kill")
    work, epochs = outputs["model"] + ".work", 6
    stop_watching, pids = _watch_pids(work)
    thread, killed = _kill_when(_ps_epoch_backed_up(outputs, work), work, "worker-0", within_s=300)
    result = TRAINER.run(trainer_inputs(penguin_outputs), outputs, {
        "module": "hpml.examples.penguin.module", "num_workers": 1, "num_ps": 1, "max_restarts": 1,
        "hyperparameters": {"epochs": epochs, "batch_size": 8, "learning_rate": 0.05}})
    thread.join()
    stop_watching.set()
    assert killed, "the worker was never killed"
    launch = result["launch"]
    assert launch["restarts"] == 1 and launch["restarted_in_place"] == ["worker-0"]
    # Timed to the replacement serving on its old address: after a new TF runtime starts, within the run.
    assert len(launch["rejoin_seconds"]) == 1 and 0.1 < launch["rejoin_seconds"][0] < launch["seconds"], launch
    assert "worker-0 exited with code -9 (SIGKILL)" in launch["failures"][0]
    assert len(pids["chief-0"]) == 1 and len(pids["ps-0"]) == 1, f"only the worker may be restarted: {pids}"
    assert len(pids["worker-0"]) == 2 and killed["pid"] in pids["worker-0"], pids
    assert _epochs_logged(outputs) == list(range(1, epochs + 1)), "each epoch once: the coordinator never restarted"
    assert os.path.isfile(os.path.join(outputs["model"], "Format-Serving", "saved_model.pb"))


def test_killed_worker_is_restarted_and_training_resumes_from_backup(penguin_outputs, tmp_path):
    outputs = trainer_outputs(tmp_path, "kill")
    work = outputs["model"] + ".work"
    epochs, batch = 8, 8

    def step_40_backed_up():
        progress = read_progress(os.path.join(work, "progress"))
        backups = os.path.join(work, "backup")
        has_backup = os.path.isdir(backups) and any("ckpt" in f or "checkpoint" in f
                                                    for _, _, files in os.walk(backups) for f in files)
        return {"step": progress["step"]} if progress and has_backup and progress["step"] >= 40 else None

    thread, killed = _kill_when(step_40_backed_up, work, "worker-1", within_s=240)
    result = TRAINER.run(trainer_inputs(penguin_outputs), outputs, {
        "module": "hpml.examples.penguin.module", "num_workers": 2, "max_restarts": 2, "backup_save_freq": 5,
        "hyperparameters": {"epochs": epochs, "batch_size": batch}})
    thread.join()
    assert killed, "the worker was never killed"
    launch = result["launch"]
    assert launch["restarts"] == 1
    assert "worker-1 exited with code -9 (SIGKILL)" in launch["failures"][0]
    assert 0 <= launch["steps_lost"] <= 5 + 2, "at most save_freq steps (plus the kill latency) are redone"
    assert len(launch["recovery_seconds"]) == 1 and launch["recovery_seconds"][0] > 0
    assert [row["epoch"] for row in result["history"]] == list(range(1, epochs + 1))
    model = tf.saved_model.load(os.path.join(outputs["model"], "Format-Serving"))
    raw = next(iter(tf.data.TFRecordDataset(
        tf.io.gfile.glob(os.path.join(penguin_outputs["ExampleGen"]["examples"], "Split-eval", "*.gz")),
        compression_type="GZIP").batch(5)))
    assert model.signatures["serving_default"](examples=raw)["probabilities"].shape == (5, 3)
    assert not os.path.exists(work), "the backup is removed once training succeeded"


def test_failure_past_retries_is_clear_and_keeps_the_backup(penguin_outputs, tmp_path):
    bad = tmp_path / "crash.py"
    bad.write_text("import os\n"
                   "def run_fn(fn_args):\n"
                   "    from hpml.components.trainer.strategies import make_strategy\n"
                   "    make_strategy(fn_args.custom_config['strategy'])\n"
                   "    os.makedirs(os.path.join(fn_args.working_dir, 'backup'), exist_ok=True)\n"
                   "    raise ValueError('out of coffee')\n")
    outputs = trainer_outputs(tmp_path, "crash")
    with pytest.raises(LaunchError, match=r"training failed after 1 restart\(s\): worker-\d exited with code 1: "
                                          r"ValueError: out of coffee") as err:
        TRAINER.run(trainer_inputs(penguin_outputs), outputs, {"module": str(bad), "num_workers": 2, "max_restarts": 1})
    assert str(err.value).endswith("ValueError: out of coffee; every attempt failed with this same error, which "
                                   "restarts do not mend: look for a bug in the module or its data")
    assert "resumes from it" in err.value.hint
    assert os.path.isdir(outputs["model"] + ".work/backup"), "the backup must survive for the next attempt"
    assert not os.path.exists(outputs["model"])


def test_bad_input_in_a_worker_fails_at_once_without_restarts(penguin_outputs, tmp_path):
    """A restart cannot mend bad data or parameters: the worker exits with USER_ERROR_EXIT, and the
    launcher stops the job on the first attempt instead of spending its restarts on it."""
    bad = tmp_path / "bad_input.py"
    bad.write_text("import os, time\n"
                   "def run_fn(fn_args):\n"
                   "    from hpml.components.errors import InputDataError\n"
                   "    from hpml.components.trainer.strategies import make_strategy, is_chief\n"
                   "    make_strategy(fn_args.custom_config['strategy'])\n"
                   "    if not is_chief():\n"
                   "        time.sleep(120)\n"
                   "    with open(os.path.join(fn_args.working_dir, 'attempts'), 'a') as handle:\n"
                   "        handle.write('attempt\\n')\n"
                   "    raise InputDataError('data.csv:7: row 7 is bad', hint='fix row 7')\n")
    outputs = trainer_outputs(tmp_path, "bad_input")
    with pytest.raises(LaunchError, match=r"not restarted: worker-0 exited with code 2: "
                                          r"hpml.components.errors.InputDataError: data.csv:7: row 7 is bad") as err:
        TRAINER.run(trainer_inputs(penguin_outputs), outputs, {"module": str(bad), "num_workers": 2, "max_restarts": 2})
    assert "would fail the same way" in err.value.hint
    with open(outputs["model"] + ".work/attempts") as handle:
        assert handle.read().count("attempt") == 1, "the job was restarted for an error no restart mends"


def test_worker_count_needs_a_cluster_strategy(penguin_outputs, tmp_path):
    with pytest.raises(SpecError, match="needs strategy multi_worker_mirrored or parameter_server"):
        TRAINER.run(trainer_inputs(penguin_outputs), trainer_outputs(tmp_path, "x"),
                    {"module": TOY, "num_workers": 2, "strategy": "mirrored"})


def _proc_state(pid: int) -> str:
    """The kernel's state letter and wait channel for `pid` (D: uninterruptible), or 'gone'."""
    try:
        with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/wchan") as wchan:
            return f"{stat.read().rsplit(')', 1)[1].split()[0]} {wchan.read()}"
    except OSError:
        return "gone"


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie is gone for our purposes
        return handle.read().split()[2] != "Z"


def test_no_process_outlives_a_failed_job(penguin_outputs, tmp_path):
    bad = tmp_path / "crash_late.py"
    bad.write_text("import os, time\n"
                   "def run_fn(fn_args):\n"
                   "    from hpml.components.trainer.strategies import make_strategy, is_chief\n"
                   "    make_strategy(fn_args.custom_config['strategy'])\n"
                   "    if is_chief():\n"
                   "        raise SystemExit(3)\n"
                   "    time.sleep(120)\n")
    outputs = trainer_outputs(tmp_path, "late")
    with pytest.raises(LaunchError, match="exited with code 3"):
        TRAINER.run(trainer_inputs(penguin_outputs), outputs, {"module": str(bad), "num_workers": 2, "max_restarts": 0})
    pids = json.load(open(outputs["model"] + ".work/pids.json"))
    assert set(pids) == {"worker-0", "worker-1"}
    time.sleep(0.5)
    assert not any(_alive(pid) for pid in pids.values()), "the sleeping worker must have been stopped"


def _start_sleeping_cluster(tmp_path, prelude: str = ""):
    """A real local launcher running two workers whose run_fn sleeps; returns it and the workers' pids."""
    import subprocess
    import sys

    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ndef run_fn(fn_args):\n    time.sleep(120)\n")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"module": str(sleeper), "run_fn": "run_fn", "strategy": "one_device",
                               "fn_args": {"working_dir": str(tmp_path), "train_files": [], "eval_files": [],
                                           "train_steps": None, "eval_steps": None, "schema_path": None,
                                           "transform_graph_path": None, "serving_model_dir": str(tmp_path / "m"),
                                           "eval_model_dir": str(tmp_path / "e"), "model_run_dir": str(tmp_path),
                                           "base_model": None, "hyperparameters": {}, "custom_config": {}}}))
    script = (f"{prelude}from hpml.components.trainer.launchers.local import LocalLauncher; "
              f"LocalLauncher(2, max_restarts=0).run({str(job)!r}, {str(tmp_path)!r})")
    # -X faulthandler: if it ever hangs, SIGABRT makes it print every thread's stack.
    with open(tmp_path / "launcher.err", "w") as stderr:
        launcher = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", script], stderr=stderr)
    deadline = time.time() + 60
    while not (tmp_path / "pids.json").exists() and time.time() < deadline:
        time.sleep(0.1)
    pids = json.load(open(tmp_path / "pids.json"))
    assert len(pids) == 2 and all(_alive(p) for p in pids.values())
    return launcher, pids


def _wait_for_launcher(launcher, pids, tmp_path, sent: str) -> None:
    import subprocess

    try:
        launcher.wait(timeout=30)
    except subprocess.TimeoutExpired:
        states = {name: _proc_state(pid) for name, pid in pids.items()}
        launcher.send_signal(signal.SIGABRT)
        launcher.wait(timeout=30)
        stacks = (tmp_path / "launcher.err").read_text()
        for pid in pids.values():
            _kill_group(pid)
        pytest.fail(f"the launcher did not stop within 30 s of {sent}; workers {states}; its stacks:\n{stacks[-6000:]}")


def _wait_gone(pids: dict[str, int], timeout: float = 15.0) -> dict[str, int]:
    """The workers still alive after `timeout` seconds (killed here, so none is left behind)."""
    deadline = time.time() + timeout
    while time.time() < deadline and any(_alive(pid) for pid in pids.values()):
        time.sleep(0.1)
    alive = {name: pid for name, pid in pids.items() if _alive(pid)}
    for pid in alive.values():
        _kill_group(pid)
    return alive


def test_ctrl_c_stops_every_process(tmp_path):
    # As from a terminal: a shell's background job (`cmd &`, no job control) inherits SIGINT ignored,
    # and Python then never raises KeyboardInterrupt, so the launcher starts with Python's own handler.
    launcher, pids = _start_sleeping_cluster(
        tmp_path, prelude="import signal; signal.signal(signal.SIGINT, signal.default_int_handler); ")
    launcher.send_signal(signal.SIGINT)
    _wait_for_launcher(launcher, pids, tmp_path, "SIGINT")
    assert launcher.returncode != 0
    assert _wait_gone(pids, timeout=0.5) == {}


def test_sigterm_stops_every_process(tmp_path):
    """`kill PID`, a service manager, or a container runtime stopping the launcher: it stops its workers
    before it exits, and says why it stopped."""
    launcher, pids = _start_sleeping_cluster(tmp_path)
    launcher.send_signal(signal.SIGTERM)
    _wait_for_launcher(launcher, pids, tmp_path, "SIGTERM")
    assert launcher.returncode != 0
    assert _wait_gone(pids, timeout=0.5) == {}
    assert "stopped by SIGTERM" in (tmp_path / "launcher.err").read_text()


def test_no_worker_outlives_a_killed_launcher(tmp_path):
    """SIGKILL (the OOM killer; Airflow 5 s after its SIGTERM) runs no cleanup in the launcher: each
    worker must notice its parent is gone and exit by itself."""
    launcher, pids = _start_sleeping_cluster(tmp_path)
    launcher.kill()
    launcher.wait(timeout=30)
    assert _wait_gone(pids, timeout=15) == {}


def test_airflow_style_sigterm_then_sigkill_leaves_no_worker(tmp_path):
    """What Airflow 3's task runner does when a running task is marked failed or its heartbeat is
    refused: SIGTERM, whose handler only calls the operator's on_kill() and returns, then SIGKILL 5 s
    later. The launcher must still take its workers down within that grace."""
    prelude = ("import signal; calls = []; "
               "signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum)); ")
    launcher, pids = _start_sleeping_cluster(tmp_path, prelude=prelude)
    launcher.send_signal(signal.SIGTERM)
    deadline = time.time() + 5
    while time.time() < deadline and launcher.poll() is None:
        time.sleep(0.1)
    stopped_in_grace = launcher.poll() is not None
    launcher.kill()
    launcher.wait(timeout=30)
    alive = _wait_gone(pids, timeout=0.5)
    assert stopped_in_grace and alive == {}, (stopped_in_grace, alive)


def test_exit_reason_quotes_a_crash_but_not_the_noise_before_a_kill():
    """A process that fails by itself (an exit code, or a crash such as SIGABRT) is reported with its last
    words; one stopped from outside only with the signal: what it logged last (TF start-up lines, say) has
    nothing to do with its death."""
    import sys

    from hpml.components.trainer.launchers.local import _exit_reason, _Process

    crashed = _Process("worker-1", [sys.executable, "-c", "print('loading shard 3'); print('disk full'); "
                                    "raise SystemExit(3)"], dict(os.environ), echo=lambda line: None)
    assert crashed.popen.wait(30) == 3
    crashed.kill()
    assert _exit_reason(crashed, 3) == "worker-1 exited with code 3: loading shard 3 | disk full"

    killed = _Process("worker-0", [sys.executable, "-u", "-c", "print('I0000 starting', flush=True); "
                                   "import time; time.sleep(60)"], dict(os.environ), echo=lambda line: None)
    deadline = time.time() + 30
    while not killed.tail and time.time() < deadline:
        time.sleep(0.05)
    os.kill(killed.popen.pid, signal.SIGKILL)
    assert killed.popen.wait(30) == -signal.SIGKILL
    killed.kill()
    assert list(killed.tail) == ["I0000 starting"]
    assert _exit_reason(killed, -signal.SIGKILL) == "worker-0 exited with code -9 (SIGKILL)"

    abort = ("import os, resource; resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
             "print('F0000 Check failed: shape ok', flush=True); os.abort()")
    aborted = _Process("ps-0", [sys.executable, "-u", "-c", abort], dict(os.environ), echo=lambda line: None)
    assert aborted.popen.wait(30) == -signal.SIGABRT
    aborted.kill()
    assert _exit_reason(aborted, -signal.SIGABRT) == \
        "ps-0 exited with code -6 (SIGABRT): F0000 Check failed: shape ok"
