"""A project-local Airflow: SQLite metadata DB under HPML_HOME, no server, no account.

`configure()` must run before anything imports airflow.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from components.errors import HpmlError
from pipelines import locks
from pipelines.paths import PROJECT_ROOT, hpml_home


def configure() -> Path:
    home = Path(os.environ.setdefault("AIRFLOW_HOME", str(hpml_home() / "airflow")))
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(PROJECT_ROOT / "dags"))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
    return home


def migrate() -> None:
    """`airflow db migrate`: creates or upgrades the SQLite metadata DB (idempotent). One process at a
    time: two runs started at once on a fresh home both created the tables, and one failed."""
    home = configure()
    airflow = str(Path(sys.executable).with_name("airflow"))
    with locks.held(home / ".migrate.lock"):
        done = subprocess.run([airflow, "db", "migrate"], capture_output=True, text=True)
    if done.returncode != 0:
        raise HpmlError("airflow db migrate failed:\n" + done.stderr[-2000:])


def load_dag(dag_id: str):
    import importlib.util

    path = PROJECT_ROOT / "dags" / f"{dag_id}.py"
    if not path.exists():
        raise HpmlError(f"no DAG file {path}")
    spec = importlib.util.spec_from_file_location(f"hpml_dag_{dag_id}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def test_run(dag_id: str, conf: dict):
    """One real DAG run in this process (`dag.test`); returns the DagRun."""
    configure()
    dag = load_dag(dag_id)
    return dag.test(run_conf=conf)
