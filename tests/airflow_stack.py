"""A real Airflow on loopback: api-server, scheduler and dag-processor, on SQLite unless told another database.

Started as separate processes in their own AIRFLOW_HOME, exactly as `airflow standalone` would,
but with a known admin password, a free port and the project's dags/ folder.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
USERNAME, PASSWORD = "admin", "hpml-browser-test"
# A viewer whom the stack's auth manager (tests/restricted_auth_manager.py) denies the penguin DAG.
OUTSIDER, OUTSIDER_PASSWORD = "outsider", "hpml-outsider-test"


def quote_run_id(run_id: str) -> str:
    """A run id as one URL path segment: every '.' as %2E too, so that a run id '.' is not a dot segment."""
    return urllib.parse.quote(run_id, safe="").replace(".", "%2E")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AirflowStack:
    def __init__(self, home: Path, extra_env: dict[str, str] | None = None):
        self.home = Path(home)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []
        passwords = self.home / "passwords.json"
        self.home.mkdir(parents=True, exist_ok=True)
        passwords.write_text(json.dumps({USERNAME: PASSWORD, OUTSIDER: OUTSIDER_PASSWORD}))
        self.env = dict(
            os.environ,
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(PROJECT_ROOT / "dags"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="False",
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__PARALLELISM="2",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"{USERNAME}:admin,{OUTSIDER}:viewer",
            AIRFLOW__CORE__AUTH_MANAGER="restricted_auth_manager.RestrictedAuthManager",
            PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent),
                                                     os.environ.get("PYTHONPATH")])),
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords),
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{self.url}/execution/",
            AIRFLOW__API__BASE_URL=self.url,
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__API__WORKERS="1",
            AIRFLOW__API_AUTH__JWT_SECRET="hpml-browser-test-secret",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            # On a loaded 2-core CI box a DAG file can parse slowly while tasks run beside it; a parse
            # that outlives the stale threshold marks the DAG stale and the UI answers 404.
            AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT="120",
            AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT="150",
            AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD="300",
            AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="2",
            AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",  # the default: task logs as a deployment's users read them
            HPML_PROGRESS="plain",
        )
        self.env.update(extra_env or {})  # may override any of the above (the executor, the database)
        self.logs = self.home / "logs-stack"
        self.logs.mkdir(exist_ok=True)

    def _airflow(self, *args) -> list[str]:
        return [str(Path(sys.executable).with_name("airflow")), *args]

    def start(self, timeout: float = 240) -> AirflowStack:
        subprocess.run(self._airflow("db", "migrate"), env=self.env, check=True, capture_output=True)
        for name, args in (("api-server", ("api-server", "--port", str(self.port), "--host", "127.0.0.1")),
                           ("scheduler", ("scheduler",)), ("dag-processor", ("dag-processor",))):
            log = open(self.logs / f"{name}.log", "w")
            self.processes.append(subprocess.Popen(self._airflow(*args), env=self.env, stdout=log,
                                                   stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(2)
        raise TimeoutError(f"the Airflow api-server did not come up on {self.url}: see {self.logs}")

    def wait_for_dag(self, dag_id: str, timeout: float = 240) -> None:
        """Until the dag-processor has parsed `dag_id` and the API serves it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                self.api(f"dags/{dag_id}/details")
                return
            except OSError:
                time.sleep(2)
        raise TimeoutError(f"DAG {dag_id} was not parsed in {timeout}s: see {self.logs}")

    def _check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{' '.join(process.args[1:2])} exited with {process.returncode}; "
                                   f"logs in {self.logs}")

    def token(self, username: str = USERNAME, password: str = PASSWORD) -> str:
        request = urllib.request.Request(f"{self.url}/auth/token", method="POST",
                                         data=json.dumps({"username": username, "password": password}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["access_token"]

    def api(self, path: str, method: str = "GET", body: dict | None = None) -> dict:
        request = urllib.request.Request(f"{self.url}/api/v2/{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self.token()}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def get(self, path: str, token: str | None = None, cookie: str | None = None) -> tuple[int, bytes]:
        """(HTTP status, body) of a GET of any path on the api-server, with a bearer token, the UI's session cookie
        (`_token`) or neither: how the tests reach a plugin's endpoints as a browser or a script would."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if cookie:
            headers["Cookie"] = f"_token={cookie}"
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{self.url}{path}", headers=headers),
                                        timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        found = self.api(f"dags/{dag_id}/dagRuns/{quote_run_id(run_id)}/taskInstances")
        return {t["task_id"]: t["state"] for t in found["task_instances"]}

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> list[str]:
        """A task's log as the UI shows it, one line per event, from the REST API."""
        found = self.api(f"dags/{dag_id}/dagRuns/{quote_run_id(run_id)}/taskInstances/{task_id}/"
                         f"logs/{try_number}?full_content=true")
        content = found["content"]
        if isinstance(content, str):
            return content.splitlines()
        return [" ".join(str(part) for part in (event.get("logger", ""), event.get("event", "")) if part)
                for event in content]

    def why_failed(self, dag_id: str, run_id: str, lines: int = 40) -> str:
        """The states of a run's tasks and the end of each failed try's log, for an assertion message."""
        found = self.api(f"dags/{dag_id}/dagRuns/{quote_run_id(run_id)}/taskInstances")["task_instances"]
        parts = [f"{run_id}: " + str({t["task_id"]: t["state"] for t in found})]
        for task in found:
            if task["state"] in ("failed", "up_for_retry"):
                try:
                    tail = self.task_log(dag_id, run_id, task["task_id"], task["try_number"])[-lines:]
                except Exception as err:  # noqa: BLE001 - the message must still be made
                    tail = [f"(log not read: {err!r})"]
                parts.append(f"--- {task['task_id']} try {task['try_number']} ({task['state']}) ---\n"
                             + "\n".join(tail))
        return "\n".join(parts)

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float) -> dict:
        """Until the run succeeded or failed; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.api(f"dags/{dag_id}/dagRuns/{quote_run_id(run_id)}")
            if run["state"] in ("success", "failed"):
                return run
            time.sleep(3)
        raise TimeoutError(f"run {run_id} did not finish in {timeout:.0f}s; logs in {self.logs}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
