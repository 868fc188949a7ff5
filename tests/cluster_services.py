"""Services on the test hosts (tests/cluster.py), each bound to its host's address as on a real machine.

- `ClusterStore`: the gs:// object store on the storage host (tests/object_store.py's emulator and TLS front).
- `ClusterS3`: an S3-compatible store (moto's server) on the storage host.
- `beam_worker_pool`, `beam_job_service`: Beam's portable runner across hosts: a job service beside the driver,
  EXTERNAL SDK worker pools on the worker hosts.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tests.cluster import HOST_DIR, Cluster, Host
from tests.object_store import _self_signed, hard_deletes

EMULATOR_PORT, FRONT_PORT, S3_PORT = 9023, 9443, 9024
# Below the kernel's ephemeral range (32768-60999), where a client's port (srun's, say) could already hold them.
BEAM_POOL_PORT, BEAM_JOB_PORT = 25000, 8099


class ClusterStore:
    """gcp-storage-emulator and the TLS front TensorFlow goes through, on one host; `env(host)` points a process
    on any host (or the tests, with None) at it."""

    def __init__(self, cluster: Cluster, host: str = "storage", bucket: str = "hpml-test"):
        self.cluster, self.host, self.bucket = cluster, cluster[host], bucket
        self.root = f"gs://{bucket}"

    def start(self) -> ClusterStore:
        host = self.host
        config = host.dir / "etc" / "store"
        config.mkdir(parents=True, exist_ok=True)
        self.cert, key = _self_signed(config)
        (config / "credentials.json").write_text(json.dumps({
            "type": "authorized_user", "client_id": "hpml-test", "client_secret": "hpml-test",
            "refresh_token": "hpml-test"}))
        emulator = host.popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "0.0.0.0", "--port",
                               str(EMULATOR_PORT), "--in-memory", "--default-bucket", self.bucket],
                              log=host.dir / "emulator.log")
        host.wait_for_port(EMULATOR_PORT, process=emulator)
        hard_deletes(f"http://{host.address}:{EMULATOR_PORT}", self.bucket)
        code = ("import sys; from tests.object_store import _serve_front; "
                "_serve_front('', int(sys.argv[1]), sys.argv[2], sys.argv[3], '0.0.0.0', int(sys.argv[4]))")
        front = host.popen([sys.executable, "-c", code, str(EMULATOR_PORT), f"{HOST_DIR}/etc/store/front.pem",
                            f"{HOST_DIR}/etc/store/front.key", str(FRONT_PORT)], log=host.dir / "front.log")
        host.wait_for_port(FRONT_PORT, process=front)
        for other in self.cluster.hosts.values():  # every machine trusts the store, as a site installs its CA
            if other is not host:
                (other.dir / "etc" / "store").mkdir(parents=True, exist_ok=True)
                for name in ("front.pem", "credentials.json"):
                    shutil.copy(config / name, other.dir / "etc" / "store" / name)
        return self

    def env(self, host: Host | None) -> dict[str, str]:
        """The store's settings for a process on `host` (its own copy of the CA and credentials, as a machine would
        have them installed), or for the tests' own process (None)."""
        if host is None:
            config, address = self.host.dir / "etc" / "store", self.host.address
        else:
            config, address = Path(HOST_DIR) / "etc" / "store", self.host.name
        front = f"http://{address}:{FRONT_PORT}"
        direct = ",".join(["127.0.0.1", "localhost", *(h.name for h in self.cluster.hosts.values()),
                           *(h.address for h in self.cluster.hosts.values())])
        return {
            "GOOGLE_APPLICATION_CREDENTIALS": str(config / "credentials.json"),
            "STORAGE_EMULATOR_HOST": f"http://{address}:{EMULATOR_PORT}",
            "HTTPS_PROXY": front, "https_proxy": front, "HTTP_PROXY": front, "http_proxy": front,
            # gRPC (Beam's job service and workers) honours these too: the hosts talk to each other directly.
            "NO_PROXY": direct, "no_proxy": direct,
            "CURL_CA_BUNDLE": str(config / "front.pem"), "REQUESTS_CA_BUNDLE": str(config / "front.pem"),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "hpml-test", "NO_GCE_CHECK": "true", "GOOGLE_CLOUD_PROJECT": "hpml-test",
        }


class ClusterS3:
    """moto's S3 server on one host, reached over the network as any S3-compatible store is: `env(host)` holds the
    standard AWS variables for a process on `host` (or the tests' own, with None)."""

    def __init__(self, cluster: Cluster, host: str = "storage", bucket: str = "hpml-test"):
        self.cluster, self.host, self.bucket = cluster, cluster[host], bucket
        self.root = f"s3://{bucket}"

    def start(self) -> ClusterS3:
        import boto3

        server = self.host.popen([str(Path(sys.executable).parent / "moto_server"), "-H", "0.0.0.0", "-p",
                                  str(S3_PORT)], log=self.host.dir / "moto.log")
        self.host.wait_for_port(S3_PORT, process=server)
        settings = self.env(None)
        boto3.client("s3", endpoint_url=settings["AWS_ENDPOINT_URL_S3"], region_name=settings["AWS_REGION"],
                     aws_access_key_id=settings["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=settings["AWS_SECRET_ACCESS_KEY"]).create_bucket(Bucket=self.bucket)
        return self

    def env(self, host: Host | None) -> dict[str, str]:
        address = self.host.address if host is None else self.host.name
        return {"AWS_ACCESS_KEY_ID": "hpml-test", "AWS_SECRET_ACCESS_KEY": "hpml-test", "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL_S3": f"http://{address}:{S3_PORT}"}


def beam_worker_pool(host: Host, env: dict[str, str]):
    """Beam's EXTERNAL SDK worker pool on `host`: it starts `python` from PATH (the checkout's environment) for
    each worker a job asks for."""
    log = host.dir / "beam-pool.log"
    pool = host.popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                       f"--service_port={BEAM_POOL_PORT}"], env=env, log=log)
    try:
        host.wait_for_port(BEAM_POOL_PORT, process=pool)
    except (RuntimeError, TimeoutError) as err:
        raise RuntimeError(f"{err}: {log.read_text(errors='replace')[-2000:]}") from None
    return pool


def beam_job_service(host: Host, env: dict[str, str]):
    """Beam's Python job service on `host`: it listens on that host's localhost, so the driver runs there too."""
    service = host.popen([sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
                          f"--port={BEAM_JOB_PORT}"], env=env, log=host.dir / "beam-job-service.log")
    host.run(["python", "-c", f"""
import socket, time
deadline = time.monotonic() + 60
while True:
    try:
        socket.create_connection(("localhost", {BEAM_JOB_PORT}), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
"""], env=env)
    return service


def portable_args(pool_host: Host) -> list[str]:
    """Beam pipeline args that send a pipeline's work to `pool_host`'s worker pool through the driver host's job
    service."""
    return ["--runner=PortableRunner", f"--job_endpoint=localhost:{BEAM_JOB_PORT}", "--environment_type=EXTERNAL",
            f"--environment_config={pool_host.name}:{BEAM_POOL_PORT}"]


SLURM_CONF = """\
ClusterName=hpml
SlurmctldHost={controller}({controller_address})
AuthType=auth/munge
AuthInfo=socket={host_dir}/munge/munge.socket.2
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={host_dir}/slurm/state
SlurmdSpoolDir={host_dir}/slurm/spool
SlurmctldPidFile={host_dir}/slurm/slurmctld.pid
SlurmdPidFile={host_dir}/slurm/slurmd.pid
SlurmctldLogFile={host_dir}/slurm/slurmctld.log
SlurmdLogFile={host_dir}/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=5
KillWait=5
MinJobAge=600
{nodes}
PartitionName=hpml Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""
CGROUP_CONF = "CgroupPlugin=cgroup/v1\n"


class SlurmCluster:
    """Slurm's controller on one host and a node on each worker host, with a munged on every host that talks to
    Slurm (one key for all, as a site installs it). `env(host)` is what sbatch, srun and scontrol need there.

    slurmd runs with a tmpfs on /sys/fs/cgroup in its own mount namespace, and Slurm's linuxproc process tracking:
    the machine's real cgroup tree is left alone."""

    def __init__(self, cluster: Cluster, controller: str = "control", nodes: tuple[str, ...] = ("worker1", "worker2")):
        self.cluster, self.controller, self.nodes = cluster, cluster[controller], [cluster[n] for n in nodes]
        self.daemons: dict[str, object] = {}

    def env(self, host: Host) -> dict[str, str]:
        return {"SLURM_CONF": f"{HOST_DIR}/etc/slurm/slurm.conf"}

    def _configure(self, host: Host) -> None:
        import os
        import secrets

        key = self.cluster.base / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        for folder in ("munge", "slurm/state", "slurm/spool", "etc/slurm"):
            (host.dir / folder).mkdir(parents=True, exist_ok=True)
        (host.dir / "munge").chmod(0o755)
        shutil.copy(key, host.dir / "etc" / "munge.key")
        os.chmod(host.dir / "etc" / "munge.key", 0o400)
        nodes = "\n".join(f"NodeName={n.name} NodeAddr={n.address} CPUs={os.cpu_count()} State=UNKNOWN"
                          for n in self.nodes)
        (host.dir / "etc" / "slurm" / "slurm.conf").write_text(SLURM_CONF.format(
            controller=self.controller.name, controller_address=self.controller.address, host_dir=HOST_DIR,
            nodes=nodes, node_names=",".join(n.name for n in self.nodes)))
        (host.dir / "etc" / "slurm" / "cgroup.conf").write_text(CGROUP_CONF)

    def start_munge(self, host: Host):
        process = host.popen(["munged", "-F", "--force", f"--socket={HOST_DIR}/munge/munge.socket.2",
                              f"--key-file={HOST_DIR}/etc/munge.key", f"--pid-file={HOST_DIR}/munge/munged.pid",
                              f"--log-file={HOST_DIR}/munge/munged.log", f"--seed-file={HOST_DIR}/munge/seed"],
                             log=host.dir / "munged.out")
        self._wait(lambda: (host.dir / "munge" / "munge.socket.2").exists(), process, f"munged on {host.name}")
        self.daemons[f"munged@{host.name}"] = process
        return process

    def start_slurmd(self, host: Host):
        """slurmd on a node (again, after the host came back)."""
        process = host.popen(["sh", "-c", 'mount -t tmpfs cgroup /sys/fs/cgroup && exec slurmd -D -N "$0"',
                              host.name], env=self.env(host), log=host.dir / "slurmd.out")
        self.daemons[f"slurmd@{host.name}"] = process
        return process

    def start(self, timeout: float = 60) -> SlurmCluster:
        for host in [self.controller, *self.nodes]:
            self._configure(host)
            self.start_munge(host)
        ctld = self.controller.popen(["slurmctld", "-D", "-i"], env=self.env(self.controller),
                                     log=self.controller.dir / "slurmctld.out")
        self.daemons["slurmctld"] = ctld
        self.controller.wait_for_port(6817, process=ctld, timeout=timeout)
        for node in self.nodes:
            self.start_slurmd(node)
        self.wait_for_nodes(timeout)
        return self

    def node_states(self) -> dict[str, str]:
        out = self.controller.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env(self.controller),
                                  check=False).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_for_nodes(self, timeout: float = 60, state: str = "idle") -> None:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.node_states()
            if states and all(states.get(n.name, "").rstrip("*") == state for n in self.nodes):
                return
            time.sleep(0.5)
        raise TimeoutError(f"Slurm's nodes are not {state}: {self.node_states()}; "
                           f"see {self.controller.dir / 'slurm' / 'slurmctld.log'}")

    @staticmethod
    def _wait(ready, process, what: str, timeout: float = 30) -> None:
        import time

        deadline = time.monotonic() + timeout
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start (exit {process.poll()})")
            time.sleep(0.1)


AIRFLOW_PORT, POSTGRES_PORT, REDIS_PORT, MLFLOW_PORT = 8080, 5432, 6379, 5000
AIRFLOW_USER, AIRFLOW_PASSWORD = "admin", "hpml-cluster-test"


class ClusterAirflow:
    """Airflow with the CeleryExecutor across the test hosts: PostgreSQL (Airflow's metadata and MLflow's runs),
    Redis (Celery's broker), the MLflow tracking server and Airflow's api-server, scheduler and dag-processor on
    the control host; a Celery worker on each worker host. Artifacts go to the store; nothing is shared but it."""

    def __init__(self, cluster: Cluster, store: ClusterStore, workers: tuple[str, ...] = ("worker1", "worker2")):
        self.cluster, self.store = cluster, store
        self.control, self.workers = cluster["control"], [cluster[w] for w in workers]
        self.url = f"http://{self.control.address}:{AIRFLOW_PORT}"
        self.mlflow_uri = f"http://{self.control.address}:{MLFLOW_PORT}"  # as the root namespace reaches it
        self.processes: dict[str, object] = {}
        # Code every host has, as a deployment ships it: the DAG files, and the projects `hpml init` writes for
        # them, in the checkout (which each host keeps), apart from the repository's own dags/.
        import uuid

        self.code = Path(__file__).resolve().parents[1] / "test-artifacts" / f"cluster-{uuid.uuid4().hex[:8]}"
        self.dags = self.code / "dags"
        self.dags.mkdir(parents=True)
        shutil.copy(Path(__file__).resolve().parents[1] / "dags" / "penguin.py", self.dags / "penguin.py")

    def env(self, host: Host) -> dict[str, str]:
        control = self.control.name
        database = f"postgresql+psycopg2://hpml@{control}:{POSTGRES_PORT}"
        return {
            **self.store.env(host),
            "AIRFLOW_HOME": f"{HOST_DIR}/airflow",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{AIRFLOW_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": f"{HOST_DIR}/etc/airflow-passwords.json",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{control}:{AIRFLOW_PORT}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"{database}/airflow",
            "AIRFLOW__CELERY__BROKER_URL": f"redis://{control}:{REDIS_PORT}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://hpml@{control}:{POSTGRES_PORT}/airflow",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            "AIRFLOW__API__BASE_URL": f"http://{control}:{AIRFLOW_PORT}",
            "AIRFLOW__API__HOST": "0.0.0.0", "AIRFLOW__API__PORT": str(AIRFLOW_PORT), "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": "hpml-cluster-test-secret-of-more-than-64-bytes-for-sha512-0123456789",
            "AIRFLOW__API__SECRET_KEY": "hpml-cluster-test-secret-key",  # signs the log servers' requests
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
            "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "150",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "HPML_SCHEDULE": "none",
            # A task whose worker host died is noticed in 20 s (Airflow's default: 300) and tried again once.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
            "HPML_TASK_RETRIES": "1", "HPML_TASK_RETRY_DELAY_S": "1",
            "HPML_ARTIFACT_ROOT": f"{self.store.root}/airflow",
            "HPML_DATA_ROOTS": f"/tmp:{self.store.root}",
            "MLFLOW_TRACKING_URI": f"http://{control}:{MLFLOW_PORT}",
            "HPML_PROGRESS": "plain",
        }

    def _airflow(self, *args: str) -> list[str]:
        return [str(Path(sys.executable).with_name("airflow")), *args]

    def start(self, timeout: float = 300) -> ClusterAirflow:
        import time

        control = self.control
        for host in [control, *self.workers]:
            (host.dir / "etc" / "airflow-passwords.json").write_text(json.dumps({AIRFLOW_USER: AIRFLOW_PASSWORD}))
            (host.dir / "airflow").mkdir(exist_ok=True)
        # PostgreSQL as Debian's postgres user (it refuses root), its data on the control host's disk.
        from tests.services import postgres_bin

        pg_bin = postgres_bin()
        (control.dir / "pg").mkdir(exist_ok=True)
        shutil.chown(control.dir / "pg", "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
        control.run([*as_postgres, f"{pg_bin}/initdb", "-D", f"{HOST_DIR}/pg/data", "-U", "hpml", "--auth=trust",
                     "-E", "UTF8"])
        with open(control.dir / "pg" / "data" / "pg_hba.conf", "a") as hba:  # the test hosts' /24, no other
            hba.write(f"host all all {control.address.rsplit('.', 1)[0]}.0/24 trust\n")
        self.processes["postgres"] = control.popen(
            [*as_postgres, f"{pg_bin}/postgres", "-D", f"{HOST_DIR}/pg/data", "-p", str(POSTGRES_PORT), "-k",
             f"{HOST_DIR}/pg", "-c", "listen_addresses=*", "-c", "max_connections=200"],
            log=control.dir / "postgres.log")
        control.wait_for_port(POSTGRES_PORT, process=self.processes["postgres"])
        for database in ("airflow", "mlflow"):
            control.run([f"{pg_bin}/createdb", "-h", control.address, "-p", str(POSTGRES_PORT), "-U", "hpml", database])
        self.processes["redis"] = control.popen(
            ["redis-server", "--bind", "0.0.0.0", "--port", str(REDIS_PORT), "--protected-mode", "no", "--save", "",
             "--appendonly", "no"], log=control.dir / "redis.log")
        control.wait_for_port(REDIS_PORT, process=self.processes["redis"])
        env = self.env(control)
        self.processes["mlflow"] = control.popen(
            [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
             f"postgresql+psycopg2://hpml@{control.name}:{POSTGRES_PORT}/mlflow", "--artifacts-destination",
             f"{self.store.root}/mlflow", "--host", "0.0.0.0", "--port", str(MLFLOW_PORT), "--workers", "1",
             # MLflow refuses Host headers it does not know (DNS-rebinding protection): the names clients use.
             "--allowed-hosts", f"{control.name},{control.name}:{MLFLOW_PORT},{control.address}:{MLFLOW_PORT}"],
            env={**env, "MLFLOW_DISABLE_TELEMETRY": "true"}, log=control.dir / "mlflow.log")
        control.run(self._airflow("db", "migrate"), env=env, timeout=600)
        for name, args in (("api-server", ("api-server",)), ("scheduler", ("scheduler",)),
                           ("dag-processor", ("dag-processor",))):
            self.processes[name] = control.popen(self._airflow(*args), env=env, log=control.dir / f"{name}.log")
        for worker in self.workers:
            self.start_worker(worker)
        control.wait_for_port(MLFLOW_PORT, process=self.processes["mlflow"], timeout=timeout)
        control.wait_for_port(AIRFLOW_PORT, process=self.processes["api-server"], timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.api("dags/penguin/details")
                return self
            except OSError:
                time.sleep(2)
        raise TimeoutError(f"the penguin DAG was not parsed in {timeout:.0f}s; see {control.dir}")

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Until the dag-processor has parsed a DAG file added to the dags folder."""
        import time
        import urllib.error

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.api(f"dags/{dag_id}/details")
                return
            except urllib.error.HTTPError as err:
                if err.code != 404:
                    raise
            time.sleep(2)
        raise TimeoutError(f"DAG {dag_id} was not parsed in {timeout:.0f}s; see {self.control.dir}")

    def restart_redis(self):
        """Celery's broker goes down (SIGKILL, as in a crash) and comes back on the same address, empty."""
        import os
        import signal

        os.killpg(self.processes["redis"].pid, signal.SIGKILL)
        self.processes["redis"].wait(10)
        self.processes["redis"] = self.control.popen(
            ["redis-server", "--bind", "0.0.0.0", "--port", str(REDIS_PORT), "--protected-mode", "no", "--save", "",
             "--appendonly", "no"], log=self.control.dir / "redis.log")
        self.control.wait_for_port(REDIS_PORT, process=self.processes["redis"])

    def start_worker(self, host: Host):
        process = host.popen(self._airflow("celery", "worker", "--concurrency", "1"), env=self.env(host),
                             log=host.dir / "celery-worker.log")
        self.processes[f"worker@{host.name}"] = process
        return process

    def token(self) -> str:
        import urllib.request

        request = urllib.request.Request(f"{self.url}/auth/token", method="POST",
                                         data=json.dumps({"username": AIRFLOW_USER,
                                                          "password": AIRFLOW_PASSWORD}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["access_token"]

    def api(self, path: str, method: str = "GET", body: dict | None = None) -> dict:
        import urllib.request

        request = urllib.request.Request(f"{self.url}/api/v2/{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self.token()}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def get(self, path: str) -> tuple[int, bytes]:
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"{self.url}{path}", headers={"Authorization": f"Bearer {self.token()}"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float) -> dict:
        import time
        import urllib.parse

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.api(f"dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}")
            if run["state"] in ("success", "failed"):
                return run
            time.sleep(3)
        raise TimeoutError(f"run {run_id} did not finish in {timeout:.0f}s; logs in {self.control.dir}")
