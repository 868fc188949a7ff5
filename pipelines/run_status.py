"""Where a run is now, as plain data: each component's state, the Trainer's live progress (steps, epochs, ETA, the
loss so far, restarts, the input stall), the report once written, and how to open the run in MLflow and TensorBoard.

Read from the run record and the files the Trainer rewrites while it trains; the Airflow plugin serves it to the
Report view, which redraws from it every few seconds.
"""
from __future__ import annotations

import os

from hpml.components import files
from hpml.components.trainer.input_stall import STALL_FILE, describe_stall
from hpml.components.trainer.progress_state import (progress_dir, read_json, read_progress, read_restarts,
                                                    working_dir_for)
from hpml.pipelines import records
from hpml.pipelines.report import report_path
from hpml.pipelines.runner import output_uri

RUNNING, FINISHED, FAILED = "RUNNING", "FINISHED", "FAILED"


def find_run(dag_id: str, run_id: str) -> str | None:
    """The run record of Airflow run `run_id` of DAG `dag_id` (an hpml pipeline's DAG id is its name), or None
    where that DAG has no hpml run of that id."""
    mlflow_run_id = records.find("airflow.run_id", run_id, dag_id)
    if mlflow_run_id is None:
        return None
    tags = records.client().get_run(mlflow_run_id).data.tags
    return mlflow_run_id if tags.get("airflow.dag_id") == dag_id else None


def _components(summary, nodes: list[str]) -> list[dict]:
    failed = summary.tags.get("hpml.failed_node")
    rows, running_seen = [], False
    for node in nodes:
        if node in summary.durations:
            state = "done"
        elif node == failed:
            state = "failed"
        elif summary.status == RUNNING and not running_seen and not failed:
            state, running_seen = "running", True
        else:
            state = "waiting" if summary.status == RUNNING and not failed else "not run"
        rows.append({"node": node, "state": state, "seconds": summary.durations.get(node)})
    return rows


def _training(run_dir: str, node: str) -> dict | None:
    """The live state of a Trainer node, from its working directory (gone once the model is published)."""
    directory = progress_dir(working_dir_for(output_uri(run_dir, node, "model")))
    progress = read_progress(directory)
    if progress is None:
        return None
    live = {**progress, "restarts": read_restarts(directory)}
    stall = read_json(os.path.join(directory, STALL_FILE))  # measured once the first epoch is over
    if stall:
        live["input_stall"] = {"fraction": stall["stall_fraction"], "text": describe_stall(stall)}
    return live


def mlflow_link(summary, experiment_id: str) -> str | None:
    """The run's page in the MLflow UI, where the tracking store is a server the browser can reach."""
    uri = records.tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{summary.mlflow_run_id}"


def status(mlflow_run_id: str) -> dict:
    summary = records.load(mlflow_run_id)
    experiment_id = records.client().get_run(mlflow_run_id).info.experiment_id
    run_dir = summary.tags.get("hpml.run_dir", "")
    nodes = [n for n in summary.tags.get(records.NODES_TAG, "").split(",") if n]
    components = _components(summary, nodes)
    training = {}
    for row in components:
        if row["state"] == "running":
            live = _training(run_dir, row["node"])
            if live is not None:
                training[row["node"]] = live
    report = summary.tags.get("hpml.report")
    model_run = next((out["model_run"] for out in summary.outputs.values() if "model_run" in out), None)
    return {
        "run_id": summary.run_name, "mlflow_run_id": mlflow_run_id, "status": summary.status,
        "components": components, "training": training,
        "report": bool(report) and files.exists(report_path(run_dir)),
        "error": summary.tags.get("hpml.error"), "error_hint": summary.tags.get("hpml.error_hint"),
        "metrics": {k: v for k, v in summary.eval_metrics.items()},
        "input_stall": _metric(mlflow_run_id, "input_stall_fraction"),
        "mlflow_url": mlflow_link(summary, experiment_id),
        "tensorboard": f"tensorboard --logdir '{model_run}'" if model_run else
        (f"tensorboard --logdir '{run_dir}'" if run_dir else None),
    }


def _metric(mlflow_run_id: str, name: str) -> float | None:
    return records.client().get_run(mlflow_run_id).data.metrics.get(name)
