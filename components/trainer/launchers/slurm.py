"""Slurm launcher: the Trainer's cluster job as one sbatch job, one task per node, on TF's own gRPC runtime.

Each task runs `hpml.components.trainer.launchers.slurm_task`, which finds its role from Slurm's environment (TF's
SlurmClusterResolver), runs the worker entry point, and copies its log to the artifact store, where this launcher
reads it back. Live progress and backups go through the store too: the nodes share nothing with the Trainer task
but the store (gs://) or a mount every node has.

A job that fails (a node lost, a worker killed) is submitted again, up to `max_restarts` times, and resumes from
the last backup; bad input or parameters (USER_ERROR_EXIT) end it at once. The job is cancelled when the wait
ends before it does: the Airflow task stopped, Ctrl-C, the timeout.
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field

from hpml.components import files
from hpml.components.errors import USER_ERROR_EXIT, HpmlError, SpecError
from hpml.components.trainer.launchers.cluster_job import ClusterJob
from hpml.components.trainer.launchers.polling import poll
from hpml.components.trainer.launchers.stopping import wait_or_stop_job
from hpml.components.trainer.progress_state import read_step_progress, record_restart, without_unmeasured_recovery

log = logging.getLogger("hpml.launcher.slurm")

TASK_MODULE = "hpml.components.trainer.launchers.slurm_task"
LOG_DIR = "slurm"  # under the job's working dir: each task's log, as `<job id>/<role>-<index>.log`
DONE = "COMPLETED"
# States a job never leaves (Slurm's job_state_string names).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}


class SlurmJobFailed(HpmlError):
    """A Slurm job ended in a state other than COMPLETED."""


@dataclass
class SlurmState:
    state: str
    exit_code: int = 0
    reason: str = ""
    nodes: str = ""

    @classmethod
    def parse(cls, line: str) -> SlurmState:
        """From one line of `scontrol show job -o ID`."""
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        state = fields.get("JobState", "UNKNOWN")
        exit_code = int(fields.get("ExitCode", "0:0").split(":")[0] or 0)
        return cls(state, exit_code, fields.get("Reason", "None"), fields.get("NodeList", ""))


@dataclass
class SlurmReport:
    launcher: str = "slurm"
    jobs: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    restarts: int = 0
    failures: list[str] = field(default_factory=list)
    recovery_seconds: list[float] = field(default_factory=list)
    steps_lost: int = 0
    seconds: float = 0.0


def script(job: ClusterJob, partition: str | None, python: str, port: int, timeout_s: float, nodes: int = 0) -> str:
    """The sbatch script: each task the task entry point on the job file, one task per node, or the tasks spread
    over `nodes` nodes (the first nodes take one more where they do not divide evenly)."""
    tasks = sum(job.roles().values())
    nodes = nodes or tasks
    if nodes > tasks:
        raise SpecError(f"Trainer: cluster.nodes is {nodes}, but the job has only {tasks} task(s) "
                        f"({', '.join(f'{n} {role}' for role, n in job.roles().items() if n)})",
                        hint="set cluster.nodes to at most the number of tasks, or 0 for one node per task")
    minutes = max(1, int(timeout_s // 60))
    spread = ["--ntasks-per-node=1"] if nodes == tasks else ["--distribution=block"]
    options = [f"--job-name={job.name}", f"--nodes={nodes}", f"--ntasks={tasks}", *spread,
               f"--time={minutes}", "--no-requeue", "--chdir=/tmp", "--output=hpml-slurm-%j.out", "--export=ALL"]
    if partition:
        options.append(f"--partition={partition}")
    if job.gpus_per_worker:
        options.append(f"--gpus-per-node={job.gpus_per_worker}")
    task = [python, "-m", TASK_MODULE, job.job_uri, job.strategy, str(job.num_workers), str(job.num_ps), str(port),
            str(job.gpus_per_worker)]
    lines = ["#!/bin/sh", *(f"#SBATCH {option}" for option in options),
             # One worker failing ends the step, so the job ends and the launcher can restart it.
             "exec srun --kill-on-bad-exit=1 " + shlex.join(task)]
    return "\n".join(lines) + "\n"


def _slurm(argv: list[str], stdin: str | None = None, timeout: float = 60) -> str:
    """A Slurm command's output; its own message when it fails, naming the command."""
    try:
        result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SpecError(f"launcher 'slurm' needs Slurm's {argv[0]} on this host's PATH",
                        hint="install Slurm's client commands (Debian: slurm-client) and set SLURM_CONF") from None
    if result.returncode:
        raise HpmlError(f"{shlex.join(argv[:3])} failed (exit {result.returncode}): "
                        f"{(result.stderr or result.stdout).strip()[-500:]}")
    return result.stdout


def submit(text: str) -> str:
    job_id = _slurm(["sbatch", "--parsable"], stdin=text).strip().split(";")[0]
    if not job_id.isdigit():
        raise HpmlError(f"sbatch answered {job_id!r}, not a job id")
    return job_id


def state(job_id: str) -> SlurmState:
    return SlurmState.parse(_slurm(["scontrol", "show", "job", "-o", job_id]))


def cancel(job_id: str) -> None:
    _slurm(["scancel", job_id])


class _Logs:
    """Echoes the tasks' logs as they reach the store: new lines of each file since the last look."""

    # A reader's file system may serve an object's old length for a few seconds after it was replaced (TF's GCS
    # stat cache: 5 s), so the last lines are waited for once the job has ended, this long at most.
    FINAL_WAIT_S = 15.0

    def __init__(self, folder: str):
        self.folder = folder
        self.seen: dict = {}
        self.ended: set = set()
        self.failed: dict[str, int] = {}  # task -> its non-zero exit code, as its log's last line says

    def finish(self) -> None:
        """After the job ended: until every task's log holds its last line (or FINAL_WAIT_S has passed)."""
        deadline = time.monotonic() + self.FINAL_WAIT_S
        while True:
            self.echo()
            if (self.seen and set(self.seen) <= self.ended) or time.monotonic() > deadline:
                return
            time.sleep(1.0)

    def echo(self) -> None:
        if not files.isdir(self.folder):
            return
        for name in files.listdir(self.folder):
            try:
                lines = files.read_text(os.path.join(self.folder, name)).splitlines()
            except OSError:  # being replaced
                continue
            task, seen = name.removesuffix(".log"), self.seen.get(name, 0)
            for line in lines[seen:]:
                log.info("[%s] %s", task, line)
                if line.startswith(f"{task} exited with "):
                    self.ended.add(name)
                    code = int(line.rsplit(" ", 1)[1])
                    if code:
                        self.failed[task] = code
            self.seen[name] = max(seen, len(lines))  # an older copy read back while it is replaced adds nothing


def transient(err: Exception) -> bool:
    """Whether a failed status read is worth another try: a controller that is slow or restarting is, a missing
    Slurm command (SpecError) or a job the controller no longer knows is not."""
    if isinstance(err, subprocess.TimeoutExpired):
        return True
    return isinstance(err, HpmlError) and not isinstance(err, SpecError) and "Invalid job id" not in str(err)


def _wait(job_id: str, on_poll, timeout_s: float, poll_s: float, also_ended=lambda: False) -> SlurmState:
    """Poll the job until it ended (or is COMPLETING where `also_ended()`: cancelled by us, its lost node's share
    still being cleared up), calling `on_poll` at each look."""
    last = None
    for current in poll(lambda: state(job_id), what=f"Slurm job {job_id}", timeout_s=timeout_s, poll_s=poll_s,
                        transient=transient):
        on_poll()
        if current.state != last:
            log.info("Slurm job %s: %s%s", job_id, current.state,
                     f" on {current.nodes}" if current.nodes and current.nodes != "(null)" else "")
            last = current.state
        if current.state in ENDED or (current.state in ("COMPLETING", "CANCELLED") and also_ended()):
            return current
    raise AssertionError("unreachable")


class _Recovery:
    """After a restart: once the new chief trains past the step it resumed from, the steps lost (done before the
    failure, after the last backup) and the time from the failure to training again."""

    def __init__(self, progress: str, report: SlurmReport):
        self.progress, self.report = progress, report
        self.pending: tuple[dict, float] | None = None

    def failed(self) -> None:
        self.pending = (read_step_progress(self.progress) or {"step": 0, "pid": None}, time.monotonic())

    def check(self) -> None:
        if self.pending is None:
            return
        (before, failed_at), now = self.pending, read_step_progress(self.progress) or {}
        resumed = now.get("resumed_from_step")
        if now.get("started", 0) > before.get("time", 0) and resumed is not None and now.get("step", 0) > resumed:
            self.report.steps_lost += max(before.get("step", 0) - resumed, 0)
            self.report.recovery_seconds.append(time.monotonic() - failed_at)
            self.pending = None


class _Attempt:
    """One submission of the job: submits it, echoes its tasks' logs while it runs, and cancels it as soon as a
    task has failed (srun may otherwise wait on a dead host's tasks until Slurm declares the node down)."""

    def __init__(self, text: str, job: ClusterJob, working_dir: str, recovery: _Recovery, deadline: float,
                 poll_s: float):
        self.text, self.job, self.working_dir, self.recovery = text, job, working_dir, recovery
        self.deadline, self.poll_s = deadline, poll_s
        self.job_id = ""
        self.lost: dict = {}

    def submit(self) -> None:
        self.job_id = submit(self.text)
        self.recovery.report.jobs.append(self.job_id)
        log.info("Slurm job %s submitted: %s", self.job_id,
                 ", ".join(f"{n} {role}" for role, n in self.job.roles().items() if n))

    def wait(self) -> SlurmState:
        logs = _Logs(os.path.join(self.working_dir, LOG_DIR, self.job_id))

        def look():
            logs.echo()
            self.recovery.check()
            if logs.failed and not self.lost:
                self.lost.update(logs.failed)
                log.warning("Slurm job %s: %s failed; cancelling the job", self.job_id,
                            ", ".join(f"{task} (exit {code})" for task, code in sorted(self.lost.items())))
                cancel(self.job_id)

        ended = _wait(self.job_id, look, self.deadline - time.monotonic(), self.poll_s,
                      also_ended=lambda: bool(self.lost))
        logs.finish()
        self.recovery.check()
        return ended

    def cancel(self) -> None:
        if self.job_id:
            cancel(self.job_id)


def run(job: ClusterJob, working_dir: str, progress: str, *, partition: str | None = None, python: str = "python",
        port: int = 8888, max_restarts: int = 2, timeout_s: float = 24 * 3600.0, poll_s: float = 5.0,
        nodes: int = 0) -> dict:
    """Submit the job and wait for it, submitting it again after a failure; returns what the run record keeps."""
    report, started = SlurmReport(), time.monotonic()
    recovery = _Recovery(progress, report)
    text = script(job, partition, python, port, timeout_s, nodes)
    while True:
        attempt = _Attempt(text, job, working_dir, recovery, started + timeout_s, poll_s)
        ended = wait_or_stop_job("the Slurm job", attempt.wait, attempt.cancel, SlurmJobFailed, submit=attempt.submit)
        job_id, lost = attempt.job_id, attempt.lost
        if ended.nodes and ended.nodes != "(null)":
            report.nodes.append(ended.nodes)
        if ended.state == DONE and ended.exit_code == 0:
            report.seconds = time.monotonic() - started
            return without_unmeasured_recovery({**report.__dict__, "job": ",".join(report.jobs)})
        failure = (f"Slurm job {job_id} ended {ended.state} (exit {ended.exit_code}, reason {ended.reason}; srun's "
                   f"own output: /tmp/hpml-slurm-{job_id}.out on the job's first node)")
        if lost:
            failure = f"Slurm job {job_id}: " + ", ".join(f"{task} exited with {code}" for task, code in
                                                          sorted(lost.items())) + "; the job was cancelled"
        report.failures.append(failure)
        if ended.exit_code == USER_ERROR_EXIT or USER_ERROR_EXIT in lost.values():
            raise SlurmJobFailed(f"training failed on bad input or parameters, not restarted: {failure}",
                                 hint=f"the tasks' logs are in {os.path.join(working_dir, LOG_DIR, job_id)}")
        if (ended.state == "CANCELLED" and not lost) or report.restarts >= max_restarts:
            raise SlurmJobFailed(f"training failed after {report.restarts} restart(s): {failure}",
                                 hint="the backup is kept: a retry of this task resumes from it")
        report.restarts += 1
        log.warning("submitting the job again (%d/%d) after: %s", report.restarts, max_restarts, failure)
        recovery.failed()
        record_restart(progress, report.restarts, failure)
