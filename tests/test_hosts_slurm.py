"""The Trainer on a cluster scheduler: launcher `slurm` submits the MultiWorkerMirrored job to Slurm on the test hosts,
one task per worker host; the tasks address each other through TF's SlurmClusterResolver and share nothing with the
Trainer but the object store. With every artifact on s3://, which TensorFlow cannot read, each task downloads its
inputs into its own host's cache; a worker host that dies mid-training (every process on it SIGKILLed, Slurm's daemon
included) costs a resubmission that resumes from the last backup in the bucket, and the model ends as the same
training without a failure over the gs:// store does (run by the local launcher: MultiWorkerMirrored is
deterministic). A ParameterServer job (chief, server, worker) shares the two hosts, survives losing its worker's host
by resuming after its last epoch backup on the gs:// store, and completes once the chief is done."""
import json
import os
import re
import threading
import time

import pytest

from tests.helpers import REPO, assert_same_weights, served_weights, store_env

LOGS = REPO / "test-artifacts" / "hosts"  # each Trainer task's log, to read after a run
EPOCHS, BATCH, STEPS_PER_EPOCH = 5, 16, 14  # penguin's 217 training rows in batches of 16
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
TRAIN = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from hpml.components.trainer import TRAINER
inputs, outputs, params = json.loads(sys.argv[1])
properties = TRAINER.run(inputs, outputs, params)
print("LAUNCH " + json.dumps(properties["launch"]))
"""


def _params(**cluster) -> dict:
    return {"module": "hpml.examples.penguin.module", "launcher": "slurm", "strategy": "multi_worker_mirrored",
            "num_workers": 2, "backup_save_freq": 5, "max_restarts": 2,
            "hyperparameters": {"epochs": EPOCHS, "batch_size": BATCH},
            "cluster": {"poll_seconds": 1, "timeout_seconds": 900, **cluster}}


def _inputs(store_penguin) -> dict:
    transform = store_penguin["Transform"]
    return {"examples": transform["transformed_examples"], "transform_graph": transform["transform_graph"],
            "input_pipeline": transform["input_pipeline"], "schema": store_penguin["ExampleGen"]["schema"]}


def _train(cluster, cluster_store, slurm, inputs, outputs, params):
    """The Trainer task on the control host, as a Celery worker there would run it; returns (launch report, log)."""
    control = cluster["control"]
    env = {**cluster_store.env(control), **(slurm.env(control) if slurm else {})}
    result = control.run(["python", "-c", TRAIN, json.dumps([inputs, outputs, params])], env=env, timeout=900,
                         check=False)
    log = result.stdout + result.stderr
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / f"trainer-{outputs['model'].split('/')[-2]}.log").write_text(log)
    assert result.returncode == 0, log[-5000:]
    launch = json.loads(next(line for line in log.splitlines() if line.startswith("LAUNCH "))[len("LAUNCH "):])
    return launch, log


@pytest.fixture(scope="module")
def uninterrupted(cluster, cluster_store, store_penguin):
    """The same training without a failure, as two local worker processes on the control host (launcher local):
    MultiWorkerMirrored with two workers computes the same weights wherever its workers run, bit for bit, so the
    Slurm job that lost a host must end with these."""
    outputs = {"model": f"{cluster_store.root}/slurm/plain/model", "model_run": f"{cluster_store.root}/slurm/plain/run"}
    params = {key: value for key, value in _params().items() if key != "cluster"}
    launch, _ = _train(cluster, cluster_store, None, _inputs(store_penguin), outputs, {**params, "launcher": "local"})
    assert launch["restarts"] == 0, launch
    with store_env(cluster_store.env(None)):
        return served_weights(outputs["model"])


def test_a_job_spread_over_fewer_nodes_shares_them_and_more_nodes_than_tasks_is_refused():
    from hpml.components.errors import SpecError
    from hpml.components.trainer.launchers import slurm
    from hpml.components.trainer.launchers.cluster_job import ClusterJob
    from hpml.components.trainer.launchers.remote import RemoteCluster

    job = ClusterJob(name="hpml-ps", image="", job_uri="gs://b/job.json", strategy="parameter_server",
                     num_workers=1, num_ps=1)
    shared = slurm.script(job, None, "python", 8888, 3600, nodes=2)
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks=3\n#SBATCH --distribution=block\n" in shared
    assert "--ntasks-per-node" not in shared
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks=3\n#SBATCH --ntasks-per-node=1\n" in slurm.script(
        job, None, "python", 8888, 3600)
    with pytest.raises(SpecError, match=r"cluster.nodes is 4, but the job has only 3 task\(s\) \(1 chief, 1 worker, "
                                        r"1 ps\)"):
        slurm.script(job, None, "python", 8888, 3600, nodes=4)
    with pytest.raises(SpecError, match="cluster.nodes must be a whole number >= 0, got -1"):
        RemoteCluster.from_params("slurm", {"nodes": -1})


def test_a_local_artifact_root_is_refused_before_anything_is_submitted(cluster, cluster_store, slurm, store_penguin):
    control = cluster["control"]
    env = {**cluster_store.env(control), **slurm.env(control)}
    outputs = {"model": "/tmp/local/model", "model_run": "/tmp/local/run"}
    result = control.run(["python", "-c", TRAIN, json.dumps([_inputs(store_penguin), outputs, _params()])],
                         env=env, check=False)
    assert result.returncode != 0
    assert "launcher 'slurm' runs the workers on other hosts, which cannot read /tmp/local/model.work" in result.stderr
    assert "Submitted" not in result.stdout + result.stderr and "submitted" not in result.stdout + result.stderr


def _kill_mid_training(host, slurm, cluster_store, moment):
    """A thread that kills `host` (every process on it) at the `moment` of training, then brings the host's Slurm
    daemons back 15 s later; and what it saw: ({"step", "processes"} once it killed, {"reads", "steps", "error"}).
    `moment(seen)`, called with the store's settings every 0.2 s for at most 600 s, returns the step to kill at, or
    None for not yet."""
    killed, seen = {}, {}

    def kill_mid_training():
        deadline = time.monotonic() + 600
        with store_env(cluster_store.env(None)):
            while time.monotonic() < deadline:
                try:
                    step = moment(seen)
                except Exception as err:  # noqa: BLE001 - replaced as it is read, or the store slow: read again
                    step, seen["error"] = None, f"{type(err).__name__}: {err}"[:300]
                seen["reads"] = seen.get("reads", 0) + 1
                if step is not None:
                    killed.update(step=step, processes=host.kill())
                    break
                time.sleep(0.2)
        if not killed:
            return
        time.sleep(15)  # the host is down; Slurm marks its node down and ends the job
        slurm.start_munge(host)  # the host is back: its daemons start again
        slurm.start_slurmd(host)

    killer = threading.Thread(target=kill_mid_training, daemon=True)
    killer.start()
    return killer, killed, seen


def _between_steps(work: str, after: int, before: int):
    """The moment the job's progress on the store is past step `after` and before step `before`."""
    from hpml.components.trainer.progress_state import progress_dir, read_progress

    def moment(seen):
        step = (read_progress(progress_dir(work)) or {}).get("step")
        if step is not None and step not in seen.setdefault("steps", []):
            seen["steps"].append(step)
        return step if step is not None and after < step < before else None
    return moment


def test_a_parameter_server_job_over_both_hosts_resumes_after_losing_its_worker_host_and_ends_with_its_chief(
        cluster, cluster_store, slurm, store_penguin):
    """strategy parameter_server: the coordinator (chief), a parameter server and a worker as one Slurm job over both
    worker hosts (cluster.nodes 2: three tasks on two nodes, the only worker on worker2). worker2 dies once an epoch
    was backed up: the coordinator cannot go on without a worker, the launcher submits the job again once the host is
    back, and the coordinator resumes after the last epoch it backed up, not from the start. Servers serve until
    stopped, so each ends once the chief's log on the store says it finished, and the job completes. Asynchronous
    training computes no set weights; the model is exported and has learned."""
    from hpml.components import artifacts, files
    from hpml.components.trainer.progress_state import working_dir_for
    from hpml.components.trainer.resume import backed_up_steps, backup_dir

    root, epochs = f"{cluster_store.root}/slurm/ps-killed", 6
    outputs = {"model": f"{root}/model", "model_run": f"{root}/run"}
    params = {**_params(nodes=2), "strategy": "parameter_server", "num_workers": 1, "num_ps": 1,
              "hyperparameters": {"epochs": epochs, "batch_size": BATCH}}
    work = working_dir_for(outputs["model"])
    # A parameter-server job reports no step as it trains (tf_keras runs no batch-level callback under it), and backs
    # up at each epoch's end: the moment is its first backup.
    killer, killed, seen = _kill_mid_training(cluster["worker2"], slurm, cluster_store,
                                              lambda seen: backed_up_steps(backup_dir(work)) or None)
    launch, log = _train(cluster, cluster_store, slurm, _inputs(store_penguin), outputs, params)
    killer.join(timeout=60)
    assert killed, f"training ended before worker2 could be killed; last seen {seen}"
    assert launch["launcher"] == "slurm" and launch["restarts"] == 1 and len(launch["jobs"]) == 2, launch
    assert launch["nodes"][-1] == "worker[1-2]", "the job ran again on both worker hosts, the lost one back"
    assert "steps_lost" not in launch and "recovery_seconds" not in launch, "a PS job reports no step to measure them"
    assert killed["step"] < (epochs - 1) * STEPS_PER_EPOCH, f"killed too late to tell a resume: {killed}"
    # Whichever saw the host gone first ended the job: a task on worker1 watching its peers (the chief or the
    # parameter server; each watches every peer), or Slurm.
    assert re.match(r"Slurm job \d+: ((chief|ps)-0 exited with 75\b|ended NODE_FAIL)", launch["failures"][0]), \
        launch["failures"]
    assert "NODE_FAIL" in launch["failures"][0] or "worker2:8888 has been unreachable" in log, log[-4000:]
    # TF's resolver hands ranks to the roles in name order, a port per task on a node: chief and ps on worker1.
    spec = "{'chief': ['worker1:8888'], 'ps': ['worker1:8889'], 'worker': ['worker2:8888']}"
    assert f"[chief-0] chief-0 on worker1: {spec}" in log, log[-4000:]
    assert f"[ps-0] ps-0 on worker1: {spec}" in log and f"[worker-0] worker-0 on worker2: {spec}" in log
    assert "strategy plan: parameter_server" in log and "a slurm job of 1 worker(s) and 1 parameter server(s)" in log
    for task in ("ps-0", "worker-0"):
        assert f"[{task}] chief-0 finished: this server's work is done" in log, log[-4000:]
    for task in ("chief-0", "ps-0", "worker-0"):
        assert f"[{task}] {task} exited with 0" in log, log[-4000:]
    with store_env(cluster_store.env(None)):
        logged = [json.loads(line)["epoch"] for line in
                  files.read_text(f"{outputs['model_run']}/{artifacts.METRICS_FILE}").splitlines() if line.strip()]
        evaluated = json.loads(files.read_text(f"{outputs['model_run']}/{artifacts.EVAL_METRICS_FILE}"))
        assert any("kernel" in key for key in served_weights(outputs["model"]))
    assert logged.count(1) == 1, f"the second job began at epoch 1, not after its backup: {logged}"
    assert sorted(set(logged)) == list(range(1, epochs + 1)) and logged[-1] == epochs, logged
    assert evaluated["accuracy"] > 0.8, evaluated
    slurm.wait_for_nodes()


def test_a_job_over_artifacts_on_s3_that_loses_a_worker_host_resumes_on_both_hosts_and_ends_with_the_same_weights(
        cluster, cluster_store, cluster_s3, slurm, store_penguin, uninterrupted):
    """The Trainer's inputs and outputs on s3://: each task downloads what it reads by its s3:// URI into a cache on
    its own host, backs up to the bucket, and the chief uploads the model, which the Trainer on the control host
    publishes. worker2 dies mid-training: the launcher submits the job again once the host is back, the tasks resume
    from the last backup in the bucket, and the weights are those of the same training over the gs:// store without
    a failure."""
    from hpml.components import artifacts, files, publishing, s3_files
    from hpml.components.trainer.progress_state import working_dir_for

    root = f"{cluster_s3.root}/slurm"
    inputs = {}
    with store_env({**cluster_store.env(None), **cluster_s3.env(None)}):
        s3_files.forget_clients()
        for name, uri in _inputs(store_penguin).items():
            with publishing.publish(f"{root}/{name}") as target:
                files.copy_tree(uri, target)
            inputs[name] = f"{root}/{name}"
        shards = [path.rsplit("/", 1)[-1] for split in ("train", "eval")
                  for path in files.glob(artifacts.transformed_examples_file_pattern(inputs["examples"], split))]
    s3_files.forget_clients()
    outputs = {"model": f"{root}/model", "model_run": f"{root}/run"}
    store = _WithEnv(cluster_s3, HPML_CACHE_DIR="/tmp/hpml-cache")  # each host's own /tmp
    # Past the first epoch (a backup every 5 steps), well before the end.
    killer, killed, seen = _kill_mid_training(cluster["worker2"], slurm, cluster_s3, _between_steps(
        working_dir_for(outputs["model"]), STEPS_PER_EPOCH, TOTAL_STEPS - 2 * STEPS_PER_EPOCH))
    launch, log = _train(cluster, store, slurm, inputs, outputs, _params())
    killer.join(timeout=60)
    assert killed, f"training ended before worker2 could be killed; last seen {seen}"
    assert killed["processes"] >= 3, "slurmd, munged and the task all died with the host"
    assert launch["launcher"] == "slurm" and launch["restarts"] == 1 and len(launch["jobs"]) == 2, launch
    assert "a slurm job of 2 worker(s)" in log, "the plan says where the workers run"
    # Each task's log came back through the store: the chief on worker1, the other worker on worker2, each
    # addressing the other by its host's name; the second job's tasks ended well.
    assert "[chief-0] chief-0 on worker1: {'chief': ['worker1:8888'], 'worker': ['worker2:8888']}" in log, log[-4000:]
    assert "[worker-0] worker-0 on worker2:" in log
    assert "[chief-0] chief-0 exited with 0" in log and "[worker-0] worker-0 exited with 0" in log, log[-4000:]
    # The chief's task ended (TF's heartbeat found its peer gone, or the task's own watch of its peer's port);
    # the launcher cancelled the job, whose lost node Slurm had not yet declared down.
    assert re.fullmatch(r"Slurm job \d+: chief-0 exited with (1|75); the job was cancelled", launch["failures"][0]), \
        launch["failures"]
    assert launch["nodes"][-1] == "worker[1-2]", "the job ran again on both worker hosts, the lost one back"
    assert len(launch["recovery_seconds"]) == 1 and launch["recovery_seconds"][0] > 0, launch
    # Backups every 5 steps, progress read at most ~1 s late: a few steps to redo, never an epoch.
    assert 0 <= launch["steps_lost"] <= STEPS_PER_EPOCH, launch
    print(f"worker2 killed at step {killed['step']}; training again after {launch['recovery_seconds'][0]:.1f}s; "
          f"{launch['steps_lost']} step(s) lost")
    for name in ("worker1", "worker2"):  # the dead host's cache outlived it, and its second task read from it
        cache = cluster[name].path("/tmp/hpml-cache/s3")
        copies = sorted(os.listdir(cache)) if cache.is_dir() else []
        assert len([c for c in copies if (cache / c).is_dir()]) == 2, (name, copies)  # transform graph, input pipeline
        assert len([c for c in copies if (cache / c).is_file()]) == len(shards) + 1, (name, copies, shards)
    with store_env(cluster_s3.env(None)):
        s3_files.forget_clients()
        trained = served_weights(outputs["model"])
        assert files.isfile(f"{outputs['model_run']}/{artifacts.EVAL_METRICS_FILE}")
        assert not [path for path in files.glob(f"{root}/*") if path.endswith(".work")], "the working dir is removed"
    s3_files.forget_clients()
    assert_same_weights(trained, uninterrupted)
    slurm.wait_for_nodes()


class _WithEnv:
    """A store's settings with more variables for the Trainer's process (and, through Slurm, its tasks)."""

    def __init__(self, store, **extra: str):
        self.store, self.extra = store, extra

    def env(self, host) -> dict[str, str]:
        return {**self.store.env(host), **self.extra}


def test_a_task_ends_once_a_peer_it_saw_up_stays_unreachable():
    """The task's own watch (slurm_task.watch_peers), on its own: a peer that was up and then refuses connections
    PEER_LOST_AFTER checks in a row is lost; one that never came up (still starting) is not."""
    from hpml.components.trainer.launchers import slurm_task

    config = {"cluster": {"chief": ["worker1:8888"], "worker": ["worker2:8888", "worker3:8888"]},
              "task": {"type": "chief", "index": 0}}
    answers = {"worker2:8888": iter([True, True, False, False, True, False, False, False]),
               "worker3:8888": iter([False] * 20)}
    asked = []

    def reachable(peer):
        asked.append(peer)
        return next(answers[peer], False)

    lost, stop = slurm_task.PeerLost(), threading.Event()
    original = slurm_task.PEER_CHECK_S
    slurm_task.PEER_CHECK_S = 0.001
    try:
        slurm_task.watch_peers(config, lost, stop, reachable)
    finally:
        slurm_task.PEER_CHECK_S = original
    assert lost.is_set() and lost.peer == "worker2:8888"
    assert asked.count("worker2:8888") == 8, "two misses then up again start the count over"
    assert "worker1:8888" not in asked, "a task does not watch itself"


def test_only_a_controller_that_may_come_back_is_polled_again():
    import subprocess

    from hpml.components.errors import HpmlError, SpecError
    from hpml.components.trainer.launchers.slurm import transient

    assert transient(subprocess.TimeoutExpired(["scontrol"], 60))
    assert transient(HpmlError("scontrol show job failed (exit 1): Unable to contact slurm controller"))
    assert not transient(HpmlError("scontrol show job failed (exit 1): slurm_load_jobs error: Invalid job id "
                                   "specified"))
    assert not transient(SpecError("launcher 'slurm' needs Slurm's scontrol on this host's PATH"))
    assert not transient(ValueError("unexpected"))


def _running_jobs(slurm) -> list[str]:
    out = slurm.controller.run(["squeue", "-h", "-o", "%i %T"], env=slurm.env(slurm.controller), check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _training_tasks(host) -> list[int]:
    """The pids of Trainer tasks (slurm_task) running on a host."""
    from hpml.components.trainer.launchers.slurm import TASK_MODULE

    found = []
    for pid in host.pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if TASK_MODULE.encode() in handle.read():
                    found.append(pid)
        except OSError:  # ended meanwhile
            continue
    return found


def test_a_stopped_trainer_cancels_its_slurm_job_and_leaves_no_task_on_the_worker_hosts(
        cluster, cluster_store, slurm, store_penguin):
    """Airflow stops a task with SIGTERM (tests/test_airflow_stop.py shows it on a real Airflow): the Trainer
    waiting on its Slurm job cancels the job, and no training task goes on running on a worker host."""
    import signal

    from hpml.components import files
    from hpml.components.trainer.progress_state import progress_dir, read_progress, working_dir_for

    control, workers = cluster["control"], [cluster["worker1"], cluster["worker2"]]
    root = f"{cluster_store.root}/slurm/stopped"
    outputs = {"model": f"{root}/model", "model_run": f"{root}/run"}
    params = _params()
    params["hyperparameters"] = {"epochs": 500, "batch_size": BATCH}  # far longer than the test waits
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / "trainer-stopped.log"
    trainer = control.popen(["python", "-c", TRAIN, json.dumps([_inputs(store_penguin), outputs, params])],
                            env={**cluster_store.env(control), **slurm.env(control)}, log=log_path)
    deadline, step = time.monotonic() + 300, 0
    with store_env(cluster_store.env(None)):
        while step < 2 * STEPS_PER_EPOCH:
            assert trainer.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, f"no training progress; {log_path.read_text()[-4000:]}"
            try:
                step = (read_progress(progress_dir(working_dir_for(outputs["model"]))) or {}).get("step", 0)
            except OSError:  # replaced as it was read
                pass
            time.sleep(0.5)
    assert len(_running_jobs(slurm)) == 1 and all(_training_tasks(host) for host in workers)

    stopped_at = time.monotonic()
    trainer.send_signal(signal.SIGTERM)  # what Airflow's supervisor sends a task it stops
    assert trainer.wait(timeout=120) != 0
    while (_running_jobs(slurm) or any(_training_tasks(host) for host in workers)) and \
            time.monotonic() < stopped_at + 60:
        time.sleep(0.5)
    assert _running_jobs(slurm) == [] and [_training_tasks(host) for host in workers] == [[], []], \
        log_path.read_text()[-4000:]
    print(f"job and tasks gone {time.monotonic() - stopped_at:.1f}s after SIGTERM")
    log = log_path.read_text()
    assert "stopping the Slurm job: the wait for it ended first (Stopped)" in log, log[-4000:]
    with store_env(cluster_store.env(None)):
        assert not files.exists(outputs["model"]) and not files.exists(outputs["model_run"])  # nothing published
    slurm.wait_for_nodes()  # both nodes idle again for the tests after this one
