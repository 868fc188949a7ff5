"""What a run's report shows, gathered as plain data from its run record (MLflow) and its artifacts."""
from __future__ import annotations

import json
import os
import re

from hpml.components import artifacts, files
from hpml.pipelines import records, shipping
from hpml.components.trainer.record import TIME_METRIC
from hpml.components.trainer.time_breakdown import PARTS
from hpml.pipelines.report.plots import CURVE_GROUPS


def _read_json(path: str | None):
    if path and files.isfile(path):
        return json.loads(files.read_text(path))
    return None


def _in(folder: str | None, name: str):
    """The JSON file `name` of an artifact folder, or None where the run has no such folder or file."""
    return _read_json(os.path.join(folder, name)) if folder else None


def collect(mlflow_run_id: str) -> dict:
    """Everything the report shows, as plain data."""
    summary = records.load(mlflow_run_id)
    run = records.client().get_run(mlflow_run_id)
    metrics = run.data.metrics
    names = {n for group in CURVE_GROUPS.values() for panel in group[1] for n in panel}
    # Pipelines with several Trainers record each one's curves under its node id (Teacher_0.val_accuracy).
    node_curves = sorted(k for k in metrics if re.fullmatch(r"[A-Za-z0-9_-]+\.val_accuracy", k))
    series = {name: [list(p) for p in records.history(mlflow_run_id, name)]
              for name in sorted(names) + node_curves if name in metrics}
    evaluation_dir = next((out["evaluation"] for out in summary.outputs.values() if "evaluation" in out), None)
    pipeline_dir = summary.outputs.get("Transform", {}).get("input_pipeline")
    run_dir = summary.outputs.get("Trainer", {}).get("model_run")
    return {
        "run_name": summary.run_name, "mlflow_run_id": mlflow_run_id, "status": summary.status,
        "pipeline": summary.tags.get("hpml.pipeline", ""), "params": dict(sorted(summary.params.items())),
        "data": {"examples": summary.examples, "bad_rows": summary.bad_rows, "input_files": summary.input_files,
                 "empty_columns": summary.empty_columns, "constant_features": summary.constant_features},
        "eval_metrics": summary.eval_metrics, "durations": summary.durations, "series": series,
        "plan": _in(run_dir, artifacts.PLAN_FILE),
        "gpipe": _in(run_dir, artifacts.GPIPE_RECORD_FILE),
        "classification": _in(run_dir, artifacts.CLASSIFICATION_FILE),
        "model_run_dir": run_dir,
        "experiment_id": run.info.experiment_id, "tracking_uri": records.tracking_uri(),
        "input_stall": _in(run_dir, artifacts.STALL_FILE),
        "tuned_step": _in(run_dir, artifacts.TUNED_STEP_FILE),
        "input_stages": _in(pipeline_dir, artifacts.STAGES_FILE),
        "input_stages_png": os.path.join(pipeline_dir, artifacts.STAGES_PLOT_FILE) if pipeline_dir else None,
        "input_decisions": _input_decisions(summary, pipeline_dir),
        "trainer_time": {part: metrics[TIME_METRIC.format(part)] for part in PARTS
                         if TIME_METRIC.format(part) in metrics},
        "distributed": {k: metrics[k] for k in ("restarts", "steps_lost", "recovery_seconds", "rejoin_seconds")
                        if k in metrics},
        "failed_node": summary.tags.get("hpml.failed_node"), "error": summary.tags.get("hpml.error"),
        "error_hint": summary.tags.get("hpml.error_hint"),
        "retried": {k[len(records.RETRIED_TAG):]: v for k, v in sorted(summary.tags.items())
                    if k.startswith(records.RETRIED_TAG)},
        "run_dir": summary.tags.get("hpml.run_dir"),
        "node_curves": node_curves,
        "evaluation": _in(evaluation_dir, artifacts.EVALUATION_FILE),
        "shipping": shipping.outcome(summary.outputs),
    }


def _input_decisions(summary, pipeline_dir: str | None) -> list[tuple[str, str, str]]:
    """(knob, value, why) for each choice the tuner made: from the InputPipeline spec where it is still on disk,
    else the values the run record kept."""
    from hpml.components.input_pipeline.spec import SPEC_FILE

    spec = _in(pipeline_dir, SPEC_FILE)
    if spec and isinstance(spec.get("decisions"), list):
        return sorted((str(d.get("what")), str(d.get("value")), str(d.get("why", ""))) for d in spec["decisions"])
    return sorted((k[len("input_pipeline."):], v, "") for k, v in summary.tags.items()
                  if k.startswith("input_pipeline."))
