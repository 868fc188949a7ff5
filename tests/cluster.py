"""Test hosts: network namespaces on one Linux bridge, each a machine of its own as far as hpml can tell.

Each host has
- its own network stack (a veth pair on the bridge, one address of a private /24 that is used only here, no route
  anywhere else): a service on the root namespace's 127.0.0.1 is out of its reach, as on another machine;
- its own hostname (a UTS namespace per process) and hosts file naming every host, so that a name another host
  hands out (Beam's callback address, Airflow's log server, Slurm's node names) resolves to the right host;
- its own disk: in a mount namespace of its own, /tmp is the host's folder and HPML_HOME lives in it, so a path
  written on one host is not there on another and a test that relies on that fails instead of passing silently.
  Only the checkout and its environments stay visible, as an identical image would be on every machine.

Needs root (CI runs as root). `Cluster.up()` creates everything, `down()` removes it; `python -m tests.cluster up`
starts one to look at by hand (`make cluster`).
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUBNET = "10.213.51"  # a /24 used only on the test bridge: .1 is the root namespace (the tests), hosts from .10
HOST_DIR = "/run/hpml-host"  # where each host sees its own folder (its /tmp, HPML_HOME and configuration)
STATE = Path("/run/hpml-cluster.json")  # the cluster that is up, for `down` and for a stale one's clean-up
DEFAULT_HOSTS = ("control", "storage", "worker1", "worker2")

# Run by `ip netns exec NS unshare --uts -- sh -c SCRIPT hpml-host ARGV...`: give the process its host's name,
# folder and hosts file, hide every other host's folder (and the tests' own /tmp), keep the checkout.
_ENTER = r"""
set -e
hostname "$HPML_HOST_NAME"
mount --bind "$HPML_HOST_ROOT_DIR" /run/hpml-host
mount --bind /run/hpml-host/etc/hosts /etc/hosts
i=0
for keep in $HPML_HOST_KEEP; do
  mkdir -p "/run/hpml-host/.keep/$i"; mount --bind "$keep" "/run/hpml-host/.keep/$i"; i=$((i+1))
done
mount --bind /run/hpml-host/tmp /tmp
i=0
for keep in $HPML_HOST_KEEP; do mkdir -p "$keep"; mount --bind "/run/hpml-host/.keep/$i" "$keep"; i=$((i+1)); done
unset HPML_HOST_ROOT_DIR HPML_HOST_KEEP
cd "${HPML_HOST_CWD:-/tmp}"
exec "$@"
"""


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


class Host:
    """One test host: run commands on it, kill everything on it, cut its network."""

    def __init__(self, cluster: Cluster, name: str, index: int):
        self.cluster, self.name = cluster, name
        self.address = f"{SUBNET}.{10 + index}"
        self.netns = f"{cluster.prefix}-{name}"
        self.veth = f"{cluster.prefix[:8]}v{index}"  # the root namespace's end, on the bridge (15 chars at most)
        self.dir = cluster.base / name  # the root namespace's view of the host's folder

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.address})"

    def path(self, host_path: str) -> Path:
        """Where a path under the host's /tmp or HPML_HOST_DIR lies, seen from the tests."""
        for prefix, local in ((HOST_DIR, self.dir), ("/tmp", self.dir / "tmp")):
            if host_path == prefix or host_path.startswith(prefix + "/"):
                return local / host_path[len(prefix):].lstrip("/")
        raise ValueError(f"{host_path} is not on {self.name}'s own disk")

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A process's environment on this host: this checkout's Python first on PATH, hpml's state on the host."""
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("PYTEST_", "HPML_", "AIRFLOW", "MLFLOW_", "STORAGE_EMULATOR", "GOOGLE_"))
               and key.lower() not in ("http_proxy", "https_proxy", "no_proxy")}
        env.update(PATH=os.pathsep.join([str(Path(sys.executable).parent), "/usr/sbin", "/usr/bin", "/sbin", "/bin"]),
                   HOME=f"{HOST_DIR}/home", TMPDIR="/tmp", HPML_HOME=f"{HOST_DIR}/hpml", HPML_DATA_ROOTS="/tmp",
                   TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
                   PYTHONPATH=str(REPO), HPML_HOST_NAME=self.name, HPML_HOST_ROOT_DIR=str(self.dir),
                   HPML_HOST_KEEP=" ".join(self.cluster.keep))
        env.update(extra or {})
        return env

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "--", "sh", "-c", _ENTER, "hpml-host",
                *argv]

    def popen(self, argv: list[str], env: dict[str, str] | None = None, log: str | Path | None = None
              ) -> subprocess.Popen:
        """Start `argv` on this host in the background, in its /tmp (HPML_HOST_CWD in `env` names another folder);
        its output goes to `log`, a file of the tests'."""
        out = open(log or os.devnull, "ab")
        try:
            process = subprocess.Popen(self.command(argv), env=self.env(env), stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=str(REPO), start_new_session=True)
        finally:
            out.close()
        self.cluster.processes.append(process)
        return process

    def run(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 300,
            check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(self.command(argv), env=self.env(env), capture_output=True, text=True,
                                timeout=timeout, cwd=str(REPO))
        if check and result.returncode:
            raise RuntimeError(f"on {self.name}: {shlex.join(argv)} exited {result.returncode}:\n"
                               f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def python(self, code: str, env: dict[str, str] | None = None, timeout: float = 300,
               check: bool = True) -> subprocess.CompletedProcess:
        return self.run([sys.executable, "-c", code], env, timeout, check)

    def pids(self) -> list[int]:
        """Every process in the host's network namespace."""
        return [int(pid) for pid in _sh("ip", "netns", "pids", self.netns, check=False).stdout.split()]

    def kill(self) -> int:
        """The host dies: every process on it is SIGKILLed at once. Returns how many there were."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def disconnect(self) -> None:
        """Cut the host off the network (its cable pulled): packets to and from it are dropped."""
        _sh("ip", "link", "set", self.veth, "down")

    def reconnect(self) -> None:
        _sh("ip", "link", "set", self.veth, "up")

    def wait_for_port(self, port: int, timeout: float = 60, process: subprocess.Popen | None = None) -> None:
        """Until something listens on this host's address and `port` (asked from the root namespace)."""
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"{process.args[-3:]} on {self.name} exited with {process.returncode}")
            try:
                socket.create_connection((self.address, port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"nothing listens on {self.name}:{port} after {timeout:.0f}s")


class Cluster:
    """Test hosts on one bridge. One cluster at a time on a machine (it owns the /24)."""

    def __init__(self, names: tuple[str, ...] = DEFAULT_HOSTS, base: str | None = None):
        self.prefix = f"hpml{os.getpid()}"
        self.bridge = f"{self.prefix[:10]}br"
        self.base = Path(base or tempfile.mkdtemp(prefix="hpml-cluster-"))
        self.hosts = {name: Host(self, name, index) for index, name in enumerate(names)}
        self.processes: list[subprocess.Popen] = []
        # What every host keeps seeing: the checkout (with its .venv) and the interpreter it runs on.
        # Only what lies under /tmp needs keeping (a clone in /tmp, as CI's); a folder inside another is kept with it.
        under_tmp = sorted({p for p in (str(REPO), str(Path(sys.prefix).resolve()),
                                        str(Path(sys.base_prefix).resolve())) if p.startswith("/tmp/")})
        self.keep = [p for p in under_tmp if not any(p.startswith(q + "/") for q in under_tmp)]

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def up(self) -> Cluster:
        if os.geteuid() != 0:
            raise RuntimeError("test hosts are network namespaces: the tests that use them run as root (CI does)")
        remove_stale()
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        STATE.write_text(json.dumps({"pid": os.getpid(), "prefix": self.prefix, "bridge": self.bridge,
                                     "base": str(self.base), "hosts": [h.netns for h in self.hosts.values()]}))
        _sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        os.makedirs(HOST_DIR, exist_ok=True)
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts.values())
        for host in self.hosts.values():
            for folder in ("etc", "tmp", "home", "hpml", ".keep"):
                (host.dir / folder).mkdir(parents=True, exist_ok=True)
            (host.dir / "tmp").chmod(0o1777)
            (host.dir / "etc" / "hosts").write_text(hosts_file)
            _sh("ip", "netns", "add", host.netns)
            _sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            _sh("ip", "link", "set", host.veth, "master", self.bridge)
            _sh("ip", "link", "set", host.veth, "up")
            for args in (("addr", "add", f"{host.address}/24", "dev", "eth0"), ("link", "set", "eth0", "up"),
                         ("link", "set", "lo", "up")):
                _sh("ip", "netns", "exec", host.netns, "ip", *args)
        return self

    def down(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for host in self.hosts.values():
            host.kill()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                pass
        _remove(self.prefix, self.bridge, [h.netns for h in self.hosts.values()])
        shutil.rmtree(self.base, ignore_errors=True)
        STATE.unlink(missing_ok=True)


def _remove(prefix: str, bridge: str, namespaces: list[str]) -> None:
    for netns in namespaces:
        for pid in _sh("ip", "netns", "pids", netns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _sh("ip", "netns", "delete", netns, check=False)
    _sh("ip", "link", "delete", bridge, check=False)


def remove_stale() -> None:
    """Remove a cluster left by a test session that died (its process is gone); refuse to share with a live one."""
    if not STATE.exists():
        return
    state = json.loads(STATE.read_text())
    try:
        os.kill(state["pid"], 0)
        alive = state["pid"] != os.getpid()
    except ProcessLookupError:
        alive = False
    if alive:
        raise RuntimeError(f"another test cluster is up (process {state['pid']}): `python -m tests.cluster down`")
    _remove(state["prefix"], state["bridge"], state["hosts"])
    shutil.rmtree(state["base"], ignore_errors=True)
    STATE.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    """`up`: start a cluster and keep it until Ctrl-C; `down`: remove one left behind."""
    if argv[:1] == ["down"]:
        if STATE.exists():
            state = json.loads(STATE.read_text())
            try:
                os.kill(state["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
            time.sleep(1)
        remove_stale()
        return 0
    cluster = Cluster().up()
    try:
        for host in cluster.hosts.values():
            print(f"{host.name:10} {host.address:14} ip netns exec {host.netns} bash   (its disk: {host.dir})")
        print("Ctrl-C removes the cluster.")
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.down()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
