"""A private Airflow for `hpml run --engine airflow`: a SQLite metadata DB under HPML_HOME, no server, no account.

`configure()` must run before anything imports airflow. A DAG run here is a real Airflow DAG run (`dag.test`) in
this process. Its Airflow home is always HPML_HOME/airflow, whatever AIRFLOW_HOME says, so that it never writes
into a deployment's own Airflow; its dags_folder holds one generated DAG file per pipeline run this way.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hpml.components.errors import HpmlError
from hpml.pipelines import locks
from hpml.pipelines.paths import hpml_home


def configure() -> Path:
    home = hpml_home() / "airflow"
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(home / "dags")
    (home / "dags").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
    return home


def migrate() -> None:
    """`airflow db migrate`: creates or upgrades the SQLite metadata DB (idempotent). One process at a
    time: two runs started at once on a fresh home both created the tables, and one failed."""
    home = configure()
    airflow = Path(sys.executable).with_name("airflow")
    if not airflow.exists():
        raise HpmlError("the airflow engine needs Apache Airflow, which is not installed here",
                        hint="pip install 'hpml[airflow]', or use --engine local")
    with locks.held(home / ".migrate.lock"):
        done = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True)
    if done.returncode != 0:
        raise HpmlError("airflow db migrate failed:\n" + done.stderr[-2000:])


def load_airflow() -> None:
    """Imports Airflow configured for this private home; its import sets up the process's logging."""
    configure()
    import airflow.settings  # noqa: F401


def test_run(reference: str, conf: dict):
    """One real DAG run of the pipeline `reference` names, in this process (`dag.test`); returns the DagRun."""
    home = configure()
    from hpml.pipelines import discovery
    from hpml.pipelines.airflow.dag_file import dag_file_text, write_dag_file

    pipeline, stable_reference = discovery.resolve(reference)
    dag_file = home / "dags" / f"{pipeline.name}.py"
    with locks.held(home / ".dags.lock"):
        write_dag_file(str(dag_file), dag_file_text(stable_reference, pipeline.description, schedule=None))
    from hpml.pipelines.airflow.dag import build_dag

    return build_dag(pipeline, schedule=None).test(run_conf=conf)
