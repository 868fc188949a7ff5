"""One self-contained HTML report per pipeline run, with its plots as PNGs beside it.

Built from the run record (MLflow) and the run's artifacts (`collect`): parameters, the strategy Plan and its
reasons, loss and metric curves, throughput and step time, the input pipeline's per-stage breakdown and stall, the
GPipe schedule, restarts and recovery, component durations, and for pipelines with several models (distillation)
each model's validation curve and the Evaluator's table. `plots` draws, `render` writes the page; `build` publishes
them under the run's folder. `report.json` holds the plotted numbers so they can be checked against the record.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from hpml.components import files, publishing
from hpml.components.errors import HpmlError
from hpml.pipelines import records
from hpml.pipelines.report.collect import collect
from hpml.pipelines.report.plots import draw_all, plot_overlay
from hpml.pipelines.report.render import open_commands, render

__all__ = ["REPORT_DIR", "REPORT_FILE", "build", "collect", "open_commands", "plot_overlay", "render", "report_dir",
           "report_path", "write_local"]

REPORT_DIR = "report"
REPORT_FILE = "report.html"
DATA_FILE = "report.json"


def report_dir(run_dir: str) -> str:
    return os.path.join(run_dir, REPORT_DIR)


def report_path(run_dir: str) -> str:
    return os.path.join(report_dir(run_dir), REPORT_FILE)


def write_local(data: dict, out: str) -> None:
    """The report's plots, report.json and report.html into the local folder `out`."""
    pngs = draw_all(data, out)
    files.write_text(os.path.join(out, DATA_FILE),
                     json.dumps({k: v for k, v in data.items() if k != "input_stages"}, indent=2, default=str))
    files.write_text(os.path.join(out, REPORT_FILE), render(data, pngs))


def build(mlflow_run_id: str, log_to_mlflow: bool = True) -> str:
    """Write the report (atomically) under the run directory, local or on an object store; returns report.html's
    path."""
    data = collect(mlflow_run_id)
    if not data["run_dir"]:
        raise HpmlError(f"run {mlflow_run_id} has no run directory tag", hint="was it started by hpml?")
    final = report_dir(data["run_dir"])
    # Rendered on local disk (matplotlib and MLflow's log_artifacts write and read local files), then published.
    with tempfile.TemporaryDirectory(prefix="hpml-report-") as out:
        write_local(data, out)
        with publishing.publish(final) as published:
            for name, _ in files.walk_files(out):
                with open(os.path.join(out, name), "rb") as source, \
                        files.open_file(os.path.join(published, name), "wb") as target:
                    shutil.copyfileobj(source, target)
        if log_to_mlflow:
            records.client().log_artifacts(mlflow_run_id, out, artifact_path=REPORT_DIR)
    return os.path.join(final, REPORT_FILE)
