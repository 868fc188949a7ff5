"""Local multi-process launcher: the same TF gRPC runtime as a real cluster, on loopback.

Each process gets its own TF_CONFIG with free ports picked at launch. Output streams with a
per-process prefix. The first process to fail stops the whole cluster; the launcher then
restarts it (BackupAndRestore resumes training) up to `max_restarts` times, unless that process
exited with USER_ERROR_EXIT (bad input or parameters, which no restart mends). The exception is a
worker under parameter servers: the coordinator carries on with the other workers and takes the
dead one back once it serves again, so only that worker is restarted, on its old address. No
process is left behind on success, failure, Ctrl-C or SIGTERM, and each worker dies with the launcher
even when the launcher is killed outright (SIGKILL).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field

from hpml.components.errors import USER_ERROR_EXIT, HpmlError
from hpml.components.trainer.progress_state import read_step_progress, record_restart
from hpml.components.trainer.launchers.exits import error_summary
from hpml.components.trainer.launchers.stopping import LAUNCHER_PID_ENV, raise_if_stopped, sigterm_raises

log = logging.getLogger("hpml.launcher")


@dataclass
class LaunchReport:
    restarts: int = 0  # of the cluster or of one process; all count against max_restarts
    restarted_in_place: list[str] = field(default_factory=list)  # processes restarted alone (PS workers)
    steps_lost: int = 0
    recovery_seconds: list[float] = field(default_factory=list)
    # For each process restarted alone: its death noticed -> its replacement accepting connections on the old
    # address, the earliest the coordinator can take it back (its lost closures were rescheduled, no steps lost).
    rejoin_seconds: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class LaunchError(HpmlError):
    """A process of the job failed and no restarts are left."""


def free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_spec(num_workers: int, num_ps: int, with_chief: bool) -> dict[str, list[str]]:
    roles = (["chief"] if with_chief else []) + ["worker"] * num_workers + ["ps"] * num_ps
    ports = iter(free_ports(len(roles)))
    spec: dict[str, list[str]] = {}
    for role in roles:
        spec.setdefault(role, []).append(f"127.0.0.1:{next(ports)}")
    return spec


# Shared by every process being stopped, and well inside the 5 s Airflow allows after its SIGTERM.
STOP_GRACE_S = 3.0


class _Process:
    def __init__(self, name: str, argv: list[str], env: dict, echo):
        self.name, self.argv, self.env, self.echo = name, argv, env, echo
        self.tail: deque[str] = deque(maxlen=30)
        self.popen = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, bufsize=1, start_new_session=True)
        self._reader = threading.Thread(target=self._pump, args=(echo,), daemon=True)
        self._reader.start()

    def _pump(self, echo):
        for line in self.popen.stdout:
            line = line.rstrip("\n")
            self.tail.append(line)
            echo(f"[{self.name}] {line}")

    def terminate(self) -> None:
        """SIGTERM to the process's whole session: TF may have started helpers of its own."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def reap(self, deadline: float) -> None:
        """Wait for it until `deadline` (time.monotonic()), then SIGKILL its session."""
        try:
            self.popen.wait(max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait()
        self._reader.join(timeout=2)

    def kill(self, grace: float = STOP_GRACE_S) -> None:
        self.terminate()
        self.reap(time.monotonic() + grace)


_STOPPED_FROM_OUTSIDE = {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
def _exit_reason(proc: _Process, code: int) -> str:
    if code == 0:
        return f"{proc.name} exited early"
    reason = f"{proc.name} exited with code {code}"
    if code < 0:
        reason += f" ({signal.Signals(-code).name})"
    # A process stopped from outside (SIGKILL, SIGTERM...) did not fail by itself: what it printed last is
    # unrelated log noise. SIGABRT, SIGSEGV and the like are its own crash, and a fatal check says why.
    summary = error_summary(list(proc.tail), tail_if_no_exception=-code not in _STOPPED_FROM_OUTSIDE)
    return reason + (": " + summary if summary else "")


def _same_every_time(failures: list[str]) -> str:
    """A note when every attempt failed with one and the same exception (whichever worker raised it): a
    lost worker or a network fault would not repeat exactly, and a bug in run_fn or its data does."""
    causes = {failure.partition(": ")[2] for failure in failures}
    if len(failures) < 2 or len(causes) != 1 or not causes.pop():
        return ""
    return "; every attempt failed with this same error, which restarts do not mend: look for a bug in the module " \
           "or its data"


class LocalLauncher:
    """Runs `python -m hpml.components.trainer.worker JOB` once per cluster task."""

    def __init__(self, num_workers: int, num_ps: int = 0, max_restarts: int = 2, echo=None):
        if num_workers < 1 or num_ps < 0 or max_restarts < 0:
            raise HpmlError("the local launcher needs num_workers >= 1, num_ps >= 0, max_restarts >= 0")
        self.num_workers, self.num_ps, self.max_restarts = num_workers, num_ps, max_restarts
        self._progress_dir: str | None = None  # where restarts are recorded for the UI, once run() knows it
        self._echo = echo or (lambda line: log.info("%s", line))
        self.processes: list[_Process] = []
        self._lock = threading.Lock()
        self._launch_over = threading.Event()  # ends the recovery watches: a parameter-server job reports no progress
        self._watches: list[threading.Thread] = []

    @property
    def parameter_server(self) -> bool:
        return self.num_ps > 0

    def pids(self) -> dict[str, int]:
        with self._lock:
            return {p.name: p.popen.pid for p in self.processes if p.popen.poll() is None}

    def _write_pids(self, path: str) -> None:
        from hpml.components import files

        files.write_text(path, json.dumps(self.pids()))

    def run(self, job_path: str, progress_dir: str) -> LaunchReport:
        report = LaunchReport()
        self._launch_over.clear()
        self._progress_dir = progress_dir
        started = time.perf_counter()
        with sigterm_raises("the local training cluster"):
            try:
                while True:
                    failure = self._attempt(job_path, report)
                    if failure is None:
                        break
                    report.failures.append(failure)
                    before = read_step_progress(progress_dir)
                    failed_at = time.perf_counter()
                    if report.restarts >= self.max_restarts:
                        raise LaunchError(f"training failed after {report.restarts} restart(s): {failure}"
                                          + _same_every_time(report.failures),
                                          hint="the backup is kept: a retry of this task resumes from it")
                    report.restarts += 1
                    log.warning("restarting the cluster (%d/%d) after: %s", report.restarts, self.max_restarts, failure)
                    record_restart(progress_dir, report.restarts, failure)
                    self._watch_recovery(report, before, failed_at, progress_dir)
                report.seconds = time.perf_counter() - started
                return report
            finally:
                self._stop_all()
                self._launch_over.set()
                for watch in self._watches:
                    watch.join(timeout=5)

    def _watch_recovery(self, report, before, failed_at, progress_dir):
        """Once the restarted chief moves past its resume point, record steps lost and recovery time."""
        # A failure before the chief's first progress (during start-up) cost no steps; without this, its
        # recovery was only noticed when training ended, and counted the whole rest of the run.
        before = before or {"step": 0, "pid": None}

        def watch():
            while True:
                over = self._launch_over.is_set()  # then one last look at the progress, and no more
                now = read_step_progress(progress_dir)
                resumed = (now or {}).get("resumed_from_step")
                if now and now.get("pid") != before.get("pid") and resumed is not None and now["step"] > resumed:
                    report.steps_lost += max(before["step"] - now["resumed_from_step"], 0)
                    report.recovery_seconds.append(time.perf_counter() - failed_at)
                    return
                if now and now.get("event") == "end" and now.get("pid") != before.get("pid"):
                    report.recovery_seconds.append(time.perf_counter() - failed_at)
                    return
                if over:
                    return
                self._launch_over.wait(0.05)
        self._watches.append(threading.Thread(target=watch, daemon=True, name="hpml-recovery-watch"))
        self._watches[-1].start()

    def _attempt(self, job_path: str, report: LaunchReport) -> str | None:
        """Start the cluster and watch it: None once it finished, else why it stopped."""
        spec = cluster_spec(self.num_workers, self.num_ps, with_chief=self.parameter_server)
        with self._lock:
            self.processes = []
            for role, addresses in spec.items():
                for index in range(len(addresses)):
                    env = dict(os.environ, TF_CONFIG=json.dumps(
                        {"cluster": spec, "task": {"type": role, "index": index}}), PYTHONUNBUFFERED="1",
                        **{LAUNCHER_PID_ENV: str(os.getpid())})
                    argv = [sys.executable, "-m", "hpml.components.trainer.worker", job_path]
                    self.processes.append(_Process(f"{role}-{index}", argv, env, self._echo))
        pids_path = os.path.join(os.path.dirname(job_path), "pids.json")
        self._write_pids(pids_path)
        # Under parameter servers only the coordinator (chief) finishes; servers run until stopped.
        finishers = [p for p in self.processes if not self.parameter_server or p.name.startswith("chief")]
        while True:
            for proc in list(self.processes):
                code = proc.popen.poll()
                if code is None or (code == 0 and proc in finishers):
                    continue
                reason = _exit_reason(proc, code)
                if code == USER_ERROR_EXIT:
                    self._stop_all()
                    report.failures.append(reason)
                    raise LaunchError(f"training failed on bad input or parameters, not restarted: {reason}",
                                      hint="a restart would fail the same way: fix what the error names")
                if self._restartable_alone(proc) and report.restarts < self.max_restarts:
                    self._restart_alone(proc, reason, report)
                    self._write_pids(pids_path)
                    continue
                self._stop_all()
                return reason
            if all(p.popen.poll() == 0 for p in finishers):
                self._stop_all()
                return None
            raise_if_stopped()
            time.sleep(0.1)

    def _restartable_alone(self, proc: _Process) -> bool:
        """A ParameterServer worker: the coordinator reschedules its work and takes it back later.
        A dead coordinator or parameter server loses the variables, so those restart the cluster."""
        return self.parameter_server and proc.name.startswith("worker-")

    def _restart_alone(self, proc: _Process, reason: str, report: LaunchReport) -> None:
        report.restarts += 1
        report.failures.append(reason)
        report.restarted_in_place.append(proc.name)
        log.warning("restarting %s alone (%d/%d); the coordinator goes on with the other workers. It %s",
                    proc.name, report.restarts, self.max_restarts, reason.split(" ", 1)[1])
        if self._progress_dir:
            record_restart(self._progress_dir, report.restarts, reason, alone=proc.name)
        noticed = time.perf_counter()
        proc.kill()
        with self._lock:
            replacement = _Process(proc.name, proc.argv, proc.env, proc.echo)
            self.processes[self.processes.index(proc)] = replacement
        threading.Thread(target=self._watch_rejoin, args=(replacement, noticed, report), daemon=True).start()

    @staticmethod
    def _watch_rejoin(proc: _Process, noticed: float, report: LaunchReport) -> None:
        """Record when a process restarted alone serves again: its gRPC port accepts a connection."""
        task = json.loads(proc.env["TF_CONFIG"])
        host, port = task["cluster"][task["task"]["type"]][task["task"]["index"]].rsplit(":", 1)
        while proc.popen.poll() is None:
            try:
                with socket.create_connection((host, int(port)), timeout=1):
                    report.rejoin_seconds.append(time.perf_counter() - noticed)
                    return
            except OSError:
                time.sleep(0.05)

    def _stop_all(self):
        """SIGTERM every process first, then wait for them all against one deadline."""
        with self._lock:
            for proc in self.processes:
                proc.terminate()
            deadline = time.monotonic() + STOP_GRACE_S
            for proc in self.processes:
                proc.reap(deadline)
