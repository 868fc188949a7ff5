"""One task of a Slurm training job (run by srun on each node): `python -m ...slurm_task JOB STRATEGY WORKERS PS
PORT GPUS`.

Finds this task's role and every task's address from Slurm's environment with TF's SlurmClusterResolver, runs the
worker entry point with that TF_CONFIG, and copies the worker's output to the artifact store every few seconds,
where the launcher reads it: the node's own disk is out of the Trainer's reach.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

LOG_EVERY_S = 5.0
# A peer whose TF port has refused connections this long is gone (its host died or was cut off). MultiWorker
# collectives would wait for it for ever, and Slurm notices a dead node only after its SlurmdTimeout: the task
# ends instead, with LOST_PEER_EXIT, so that the launcher restarts the job from the last backup.
PEER_CHECK_S, PEER_LOST_AFTER = 5.0, 3
LOST_PEER_EXIT = 75  # EX_TEMPFAIL: try again
CHIEF_CHECK_S = 2.0  # under parameter servers, how often a server looks whether the chief has finished


def roles(strategy: str, num_workers: int, num_ps: int) -> dict[str, int]:
    """Task counts by role. TF's resolver gives Slurm's task ranks to the roles in name order: rank 0 is the chief,
    then parameter servers, then workers."""
    if strategy == "parameter_server":
        return {"chief": 1, "worker": num_workers, "ps": num_ps}
    return {"chief": 1, "worker": num_workers - 1} if num_workers > 1 else {"chief": 1}


def tf_config(strategy: str, num_workers: int, num_ps: int, port: int, gpus: int) -> dict:
    """TF_CONFIG for this task, from SLURM_PROCID, the job's node list and `port` on every node."""
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (SlurmClusterResolver,
                                                                                      expand_tasks_per_node)

    # The resolver gives a node's tasks one port each, as far as the node's GPUs go: with no GPU it would ask
    # nvidia-smi, and a count of 0 divides by zero, so each task counts as having one.
    per_node = max(expand_tasks_per_node(os.environ["SLURM_STEP_TASKS_PER_NODE"]))
    resolver = SlurmClusterResolver(jobs=roles(strategy, num_workers, num_ps), port_base=port,
                                    gpus_per_node=max(gpus, 1) * per_node, gpus_per_task=max(gpus, 1),
                                    tasks_per_node=None, auto_set_gpu=bool(gpus))
    return {"cluster": resolver.cluster_spec().as_dict(),
            "task": {"type": resolver.task_type, "index": resolver.task_id}}


def _copy_log(lines: list[str], path: str, stop: threading.Event) -> None:
    from hpml.components import files

    written = -1
    while True:
        stopping = stop.wait(LOG_EVERY_S)
        if len(lines) != written:
            written = len(lines)
            try:
                files.write_text(path, "".join(lines[:written]))
            except Exception as err:  # noqa: BLE001 - the log is a convenience; training goes on
                print(f"slurm_task: could not copy the log to {path}: {err}", file=sys.stderr, flush=True)
        if stopping:
            return


def _reachable(address: str) -> bool:
    import socket

    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=PEER_CHECK_S).close()
        return True
    except OSError:
        return False


class PeerLost(threading.Event):
    """Set once a peer is lost; `peer` names it."""

    peer: str | None = None


def watch_peers(config: dict, lost: PeerLost, stop: threading.Event, reachable=_reachable) -> None:
    """Set `lost` once a peer that was up has been unreachable PEER_LOST_AFTER checks in a row."""
    me = config["cluster"][config["task"]["type"]][config["task"]["index"]]
    peers = [a for addresses in config["cluster"].values() for a in addresses if a != me]
    seen_up, misses = set(), dict.fromkeys(peers, 0)
    while not stop.wait(PEER_CHECK_S):
        for peer in peers:
            if reachable(peer):
                seen_up.add(peer)
                misses[peer] = 0
            elif peer in seen_up:
                misses[peer] += 1
                if misses[peer] >= PEER_LOST_AFTER:
                    lost.peer = peer
                    lost.set()
                    return


def main(argv: list[str]) -> int:
    job_uri, strategy, num_workers, num_ps, port, gpus = argv[0], argv[1], *map(int, argv[2:6])
    from hpml.components import files
    from hpml.components.trainer.launchers.slurm import LOG_DIR
    from hpml.components.trainer.launchers.stopping import LAUNCHER_PID_ENV

    job = json.loads(files.read_text(job_uri))
    logs = os.path.join(job["fn_args"]["working_dir"], LOG_DIR, os.environ.get("SLURM_JOB_ID", "job"))
    try:
        config = tf_config(strategy, num_workers, num_ps, port, gpus)
    except Exception:  # the launcher shows why, instead of a bare exit code
        import traceback

        task = f"task-{os.environ.get('SLURM_PROCID', '0')}"
        files.write_text(os.path.join(logs, f"{task}.log"), f"{task} on {os.uname().nodename}: no TF_CONFIG from "
                                                             f"Slurm's environment\n{traceback.format_exc()}")
        raise
    task = f"{config['task']['type']}-{config['task']['index']}"
    env = dict(os.environ, TF_CONFIG=json.dumps(config), PYTHONUNBUFFERED="1", **{LAUNCHER_PID_ENV: str(os.getpid())})
    worker = subprocess.Popen([sys.executable, "-m", "hpml.components.trainer.worker", job_uri], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = [f"{task} on {os.uname().nodename}: {config['cluster']}\n"]
    stop, lost = threading.Event(), PeerLost()
    copier = threading.Thread(target=_copy_log, args=(lines, os.path.join(logs, f"{task}.log"), stop), daemon=True)
    copier.start()
    done = threading.Event()  # a server's work is over: the chief (the coordinator) finished
    if strategy == "parameter_server" and config["task"]["type"] != "chief":
        chief_log = os.path.join(logs, "chief-0.log")
        threading.Thread(target=_end_when_the_chief_is_done, args=(chief_log, done, stop, worker, lines),
                         daemon=True).start()
    threading.Thread(target=_end_when_a_peer_is_lost, args=(config, lost, stop, done, worker, lines),
                     daemon=True).start()
    assert worker.stdout is not None  # stdout=PIPE
    for line in worker.stdout:
        sys.stdout.write(line)
        lines.append(line)
    code = worker.wait()
    if done.is_set():
        code = 0
    elif lost.is_set():
        code = LOST_PEER_EXIT
    lines.append(f"{task} exited with {code}\n")
    stop.set()
    copier.join(timeout=30)
    return code if code >= 0 else 128 - code


def _end_when_the_chief_is_done(chief_log: str, done, stop, worker, lines) -> None:
    """Under parameter servers, workers and servers serve until stopped: stop this one once the chief's log on the
    store says it exited with 0, so that the job completes."""
    from hpml.components import files

    while not stop.wait(CHIEF_CHECK_S):
        try:
            finished = files.read_text(chief_log).endswith("chief-0 exited with 0\n")
        except OSError:  # not written yet, or being replaced
            continue
        if finished:
            lines.append("chief-0 finished: this server's work is done\n")
            done.set()
            worker.terminate()
            return


def _end_when_a_peer_is_lost(config, lost, stop, done, worker, lines) -> None:
    watch_peers(config, lost, stop)
    if lost.is_set() and not done.is_set():
        lines.append(f"{lost.peer} has been unreachable for {PEER_CHECK_S * PEER_LOST_AFTER:.0f}s: ending this task "
                     "so that the job restarts from the last backup\n")
        worker.kill()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
