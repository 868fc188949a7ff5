"""A resume that loses nothing: training processes SIGKILLed at seeded random moments (start-up, mid-epoch,
during a backup), under MultiWorkerMirrored and as one process, end with the weights of a run never killed."""
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import tensorflow as tf

from hpml.components.trainer import TRAINER
from hpml.components.trainer.progress_state import PROGRESS_FILE, read_progress
from hpml.components.trainer.resume import backed_up_steps, backup_dir
from tests.helpers import REPO, assert_same_weights, served_weights, trainer_inputs, trainer_outputs

EPOCHS, BATCH, KILLS = 12, 8, 3
TOTAL_STEPS = EPOCHS * 28  # penguin's 217 training rows in batches of 8
PARAMS = {"module": "hpml.examples.penguin.module", "backup_save_freq": 5,
          "hyperparameters": {"epochs": EPOCHS, "batch_size": BATCH}}


def _backed_up(work: str) -> int:
    try:
        return backed_up_steps(backup_dir(work))
    except (tf.errors.OpError, ValueError):  # a backup being written or removed as it is read
        return -1


def _kill_plan(rng: random.Random) -> list[str]:
    """When each of the KILLS kills comes: one during start-up among the first two, the others at training steps;
    the last always in training, so that the attempt that finishes resumes from a backup."""
    return [*rng.sample(["start-up", "training"], 2), *["training"] * (KILLS - 2)]


def _wait_for_a_kill_moment(rng: random.Random, work: str, kind: str, alive) -> bool:
    """Waits, from the start of an attempt, for a seeded random moment of `kind` to kill it: 0.5-4 s into its
    start-up, or a random training step past the backup it resumed from (a backup may be being written then).
    False if the attempt ended first."""
    started, resumed = time.time(), max(_backed_up(work), 0)
    previous = (read_progress(os.path.join(work, "progress")) or {}).get("pid")  # the last attempt's, if any
    in_training = kind == "training" and resumed + 5 < TOTAL_STEPS - 100
    target = rng.randint(resumed + 5, TOTAL_STEPS - 100) if in_training else None
    delay = rng.uniform(0.5, 4.0) if target is None else rng.uniform(0.0, 0.2)
    while alive():
        progress = read_progress(os.path.join(work, "progress")) or {}
        if target is None and time.time() - started >= delay:
            return True
        if target is not None and progress.get("pid") not in (None, previous) and progress["step"] >= target:
            time.sleep(delay)
            return alive()
        time.sleep(0.02)
    return False


def _kill_workers_at_random(work: str, rng: random.Random, kills: int) -> tuple[threading.Thread, list]:
    """A thread that, `kills` times (as `_kill_plan` says), waits for a fresh set of worker pids, then a random
    moment of that attempt, and SIGKILLs one worker drawn at random; it records what the backup held at each kill."""
    done: list = []
    plan = _kill_plan(rng)

    def pids():
        try:
            return json.load(open(os.path.join(work, "pids.json")))
        except (OSError, ValueError):
            return {}

    def running(pid):
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    def assassin():
        seen: set = set()
        deadline = time.time() + 600
        while len(done) < kills and time.time() < deadline:
            workers = {name: pid for name, pid in pids().items() if name.startswith("worker")}
            if len(workers) < 2 or set(workers.values()) <= seen:
                time.sleep(0.05)
                continue
            seen |= set(workers.values())
            alive = lambda workers=workers: all(running(pid) for pid in workers.values())  # noqa: E731
            if not _wait_for_a_kill_moment(rng, work, plan[len(done)], alive):
                continue  # that attempt failed or ended on its own: wait for the next one
            name = rng.choice(sorted(workers))
            os.kill(workers[name], signal.SIGKILL)
            done.append({"worker": name, "moment": plan[len(done)], "backed_up_steps": _backed_up(work)})

    thread = threading.Thread(target=assassin, daemon=True)
    thread.start()
    return thread, done


def test_mwms_workers_killed_at_random_moments_end_with_the_uninterrupted_weights(penguin_outputs, tmp_path):
    """Read through Transform's tuned input pipeline (the one-process test reads through TFXIO)."""
    params = dict(PARAMS, num_workers=2, max_restarts=KILLS + 1)
    inputs = dict(trainer_inputs(penguin_outputs), input_pipeline=penguin_outputs["Transform"]["input_pipeline"])
    whole, killed = trainer_outputs(tmp_path, "whole"), trainer_outputs(tmp_path, "killed")
    TRAINER.run(inputs, whole, params)
    thread, kills = _kill_workers_at_random(killed["model"] + ".work", random.Random(43), KILLS)
    result = TRAINER.run(inputs, killed, params)
    thread.join(timeout=5)
    assert len(kills) == KILLS, kills
    assert result["launch"]["restarts"] == KILLS
    assert kills[-1]["backed_up_steps"] > 0, f"the last kill came before any backup: {kills}"
    assert result["history"][-1]["epoch"] == EPOCHS
    assert_same_weights(served_weights(killed["model"]), served_weights(whole["model"]))
    assert len(result["launch"]["recovery_seconds"]) == KILLS


TRAIN_ONCE = """
import json, sys
from hpml.components.trainer import TRAINER
from hpml.components.trainer.progress_state import PROGRESS_FILE, read_progress
inputs, outputs, params = json.loads(sys.argv[1])
TRAINER.run(inputs, outputs, params)
"""


def _trainer_process(inputs, outputs, params, log, logged: bool = False) -> subprocess.Popen:
    """The Trainer in a process of its own, its output in the file `log` (a pipe nobody reads would fill up);
    `logged` adds hpml's INFO lines."""
    code = ("import logging; logging.basicConfig(level=logging.INFO)\n" if logged else "") + TRAIN_ONCE
    return subprocess.Popen([sys.executable, "-c", code, json.dumps([inputs, outputs, params])], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT)


def _finished(process: subprocess.Popen, log) -> None:
    """Wait for a Trainer process; its log's tail is the failure where it did not succeed."""
    if process.wait(timeout=300) != 0:
        log.seek(0)
        raise AssertionError(log.read()[-3000:])


def test_one_process_killed_at_random_moments_and_retried_ends_with_the_uninterrupted_weights(penguin_outputs,
                                                                                               tmp_path):
    """As Airflow retries a Trainer task whose process died: the same outputs, run again. Read through TFXIO."""
    inputs, params = trainer_inputs(penguin_outputs), dict(PARAMS, strategy="one_device")
    whole, killed = trainer_outputs(tmp_path, "whole"), trainer_outputs(tmp_path, "killed")
    work = killed["model"] + ".work"
    log = open(tmp_path / "trainer.log", "w+")
    finished = functools.partial(_finished, log=log)

    finished(_trainer_process(inputs, whole, params, log))
    rng, kills = random.Random(7), []
    plan = _kill_plan(rng)
    while len(kills) < KILLS:
        process = _trainer_process(inputs, killed, params, log)
        if not _wait_for_a_kill_moment(rng, work, plan[len(kills)], lambda process=process: process.poll() is None):
            finished(process)
            raise AssertionError(f"an attempt ended before its kill moment: {kills}")
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills.append(_backed_up(work))
    finished(_trainer_process(inputs, killed, params, log))
    assert kills[-1] > 0, f"the last kill came before any backup: {kills}"
    assert_same_weights(served_weights(killed["model"]), served_weights(whole["model"]))
    # The input stall, measured at the end of epoch 0 by an attempt that was later killed, reaches the published
    # model_run of the attempt that finished (which resumed past epoch 0 and measured nothing).
    stall = os.path.join(killed["model_run"], "input_stall.json")
    assert max(kills) >= TOTAL_STEPS // EPOCHS and os.path.exists(stall), (kills, os.listdir(killed["model_run"]))


def test_recovery_from_a_failure_during_start_up_ends_when_the_restarted_chief_trains(tmp_path):
    """A cluster killed before its chief reported any progress: recovery is the restart until the new chief's
    first step, not (as when nothing was compared against) the whole rest of the run."""
    from hpml.components.trainer.launchers.local import LaunchReport, LocalLauncher

    def progress(**state):
        (tmp_path / PROGRESS_FILE).write_text(json.dumps(state))

    report = LaunchReport()
    LocalLauncher(num_workers=2)._watch_recovery(report, None, time.perf_counter(), str(tmp_path))
    progress(step=0, resumed_from_step=None, pid=101, event="begin")
    time.sleep(0.3)
    assert report.recovery_seconds == [], "training has not moved yet"
    progress(step=1, resumed_from_step=0, pid=101, event="step")
    deadline = time.time() + 5
    while not report.recovery_seconds and time.time() < deadline:
        time.sleep(0.05)
    assert len(report.recovery_seconds) == 1 and report.steps_lost == 0


def test_a_backup_without_a_train_counter_is_named(tmp_path):
    """A checkpoint in the backup's place that BackupAndRestore did not write stops the resume with its path."""
    import pytest

    from hpml.components.errors import SpecError

    checkpoint = tf.train.Checkpoint(weights=tf.Variable([1.0, 2.0]))
    tf.train.CheckpointManager(checkpoint, str(tmp_path / "backup" / "chief"), max_to_keep=1).save()
    with pytest.raises(SpecError, match=r"backup .*chief/ckpt-1 holds no train counter"):
        backed_up_steps(str(tmp_path / "backup"))
    assert backed_up_steps(str(tmp_path / "none")) == 0


def test_a_trainer_killed_on_one_machine_resumes_on_another_from_its_backup_on_s3(penguin_outputs, s3, tmp_path,
                                                                                   monkeypatch):
    """The model on s3://: each backup is uploaded, checkpoint index last. The process is killed mid-training, the
    store is given the first half of a newer checkpoint (an upload cut short), and the retry runs with an empty
    local disk (another machine): it restores the last whole backup and ends with the uninterrupted weights."""
    from hpml.components import files
    from hpml.components.artifacts import WRITER_FILE
    from hpml.components.trainer.progress_state import PROGRESS_DIR

    inputs, params = trainer_inputs(penguin_outputs), dict(PARAMS, strategy="one_device")
    whole = trainer_outputs(tmp_path, "whole")
    root = f"{s3.root}/{tmp_path.name}"
    killed = {"model": f"{root}/model", "model_run": f"{root}/model_run"}
    work, chief = f"{root}/model.work", f"{root}/model.work/backup/chief"
    log = open(tmp_path / "trainer.log", "w+")
    finished = functools.partial(_finished, log=log)

    finished(_trainer_process(inputs, whole, params, log))
    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "first-machine"))
    process = _trainer_process(inputs, killed, params, log)
    deadline = time.time() + 300
    while process.poll() is None and time.time() < deadline:
        progress = read_progress(f"{work}/{PROGRESS_DIR}") or {}  # the live progress, on the store
        if progress.get("step", 0) >= TOTAL_STEPS // 2 and files.isfile(f"{chief}/checkpoint"):
            break
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "killed mid-training"
    # Nothing was published: on the store the killed attempt left only its signature as the model's writer.
    assert [name for name, _ in files.walk_files(killed["model"])] == [WRITER_FILE]
    index = files.read_text(f"{chief}/checkpoint")
    files.write_text(f"{chief}/ckpt-999.index", "the first half of an upload")  # no index names it

    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "second-machine"))
    log.seek(0, os.SEEK_END)
    started = log.tell()
    finished(_trainer_process(inputs, killed, params, log, logged=True))
    log.seek(started)
    retry = log.read()
    assert f"restored the backup from {work}/backup" in retry
    resumed = int(retry.split("resuming from the backup after ")[1].split()[0])
    assert resumed >= TOTAL_STEPS // 2 - 5 * 28, (resumed, index)
    served = files.tf_readable(killed["model"])
    assert_same_weights(served_weights(served), served_weights(whole["model"]))
    assert not files.exists(work), "the working dir on the store is removed once the model is published"
