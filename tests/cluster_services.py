"""Services on the test hosts (tests/cluster.py), each bound to its host's address as on a real machine.

- `ClusterStore`: the gs:// object store on the storage host (tests/object_store.py's emulator and TLS front).
- `beam_worker_pool`, `beam_job_service`: Beam's portable runner across hosts: a job service beside the driver,
  EXTERNAL SDK worker pools on the worker hosts.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tests.cluster import HOST_DIR, Cluster, Host
from tests.object_store import _self_signed

EMULATOR_PORT, FRONT_PORT = 9023, 9443
# Below the kernel's ephemeral range (32768-60999), where a client's port (srun's, say) could already hold them.
BEAM_POOL_PORT, BEAM_JOB_PORT = 25000, 8099


class ClusterStore:
    """gcp-storage-emulator and the TLS front TensorFlow goes through, on one host; `env(host)` points a process
    on any host (or the tests, with None) at it."""

    def __init__(self, cluster: Cluster, host: str = "storage", bucket: str = "hpml-test"):
        self.cluster, self.host, self.bucket = cluster, cluster[host], bucket
        self.root = f"gs://{bucket}"

    def start(self) -> "ClusterStore":
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

    def start(self, timeout: float = 60) -> "SlurmCluster":
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
