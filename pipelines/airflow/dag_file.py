"""The text of a DAG file for a pipeline: what `hpml init` writes into a dags_folder, and what the private
Airflow of `hpml run --engine airflow` parses."""
from __future__ import annotations

from hpml.components import files


def dag_file_text(reference: str, description: str, schedule: str | None = "@daily") -> str:
    """A DAG file that builds the DAG of the pipeline `reference` names (see hpml.pipelines.discovery)."""
    return (f'"""{description or "An hpml pipeline"} (an Airflow DAG built by hpml)."""\n'
            "from hpml.v1 import load_pipeline\n"
            "from hpml.v1.airflow import build_dag\n\n"
            f"dag = build_dag(load_pipeline({reference!r}), schedule={schedule!r})\n\n"
            'if __name__ == "__main__":\n'
            "    dag.test()\n")


def write_dag_file(path: str, text: str) -> bool:
    """Write `text` to `path` atomically, so that a dag-processor never parses half a file; False when the file
    already holds exactly that text."""
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
    except FileNotFoundError:
        pass
    files.write_text(path, text)
    return True
