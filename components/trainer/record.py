"""What the Trainer adds to the run record: per-epoch metrics, the eval metrics, the plan, the launch's restarts,
the GPipe schedule, the input stall, the tuned step, where its time went, and the ModelRun's small files."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpml.components import artifacts
from hpml.components.results import RunRecord, history_series
from hpml.components.trainer.progress_state import without_unmeasured_recovery

MODEL_RUN_FILES = (artifacts.METRICS_FILE, artifacts.EVAL_METRICS_FILE, artifacts.CLASSIFICATION_FILE,
                   artifacts.PLAN_FILE, artifacts.GPIPE_RECORD_FILE, artifacts.STALL_FILE, artifacts.TUNED_STEP_FILE,
                   artifacts.FIT_WINDOW_FILE)
# The run record's metric for each part of the Trainer's time (`time_breakdown.PARTS`), in seconds.
TIME_METRIC = "trainer_seconds.{}"
_GPIPE_TAGS = ("num_stages", "num_micro_batches", "balance", "remat", "schedule", "stage_costs_s")


def run_record(result: Mapping[str, Any]) -> RunRecord:
    metrics = {f"eval_{key}": value for key, value in (result.get("eval_metrics") or {}).items()}
    tags: dict[str, str] = {}
    plan = result.get("plan")
    if plan:
        tags.update({"hpml.strategy": plan["strategy"], "hpml.plan": "; ".join(plan["reasons"])})
    _gpipe(result.get("gpipe"), metrics, tags)
    _launch(result.get("launch"), metrics, tags)
    stall = result.get("input_stall")
    if stall:
        metrics.update(input_stall_fraction=stall["stall_fraction"], input_step_seconds=stall["real_step_s"],
                       in_memory_step_seconds=stall["in_memory_step_s"])
    step = result.get("tuned_step")
    if step:
        tags.update({f"hpml.step.{knob}": str(value) for knob, value in step["choice"].items()})
        metrics["step_tuning_seconds"] = step["seconds"]
    for part, seconds in (result.get("time_breakdown") or {}).items():
        metrics[TIME_METRIC.format(part)] = seconds
    if "skipped_shards" in result:
        metrics["skipped_shards"] = len(result["skipped_shards"])
    if result.get("input_cache"):  # the Trainer read its data once: later than Transform's, this tag wins
        tags["input_pipeline.cache"] = result["input_cache"]
    node_tags = {f"distillation.{k}": str(v) for k, v in (result.get("distillation") or {}).items()}
    return RunRecord(metrics, tags, files={"model_run": MODEL_RUN_FILES},
                     series=history_series(result.get("history") or []), node_tags=node_tags)


def _gpipe(gpipe: Mapping[str, Any] | None, metrics: dict, tags: dict) -> None:
    if not gpipe:
        return
    tags.update({f"gpipe.{k}": str(gpipe[k]) for k in _GPIPE_TAGS})
    metrics.update({f"gpipe.{k}": gpipe[k] for k in ("expected_bubble", "measured_bubble")})
    if "executed_bubble" in gpipe:  # from the profiler trace of one executed step
        metrics["gpipe.executed_bubble"] = gpipe["executed_bubble"]
        tags["gpipe.executed_in_schedule_order"] = str(gpipe["executed_in_schedule_order"])


def _launch(launch: Mapping[str, Any] | None, metrics: dict, tags: dict) -> None:
    if not launch:
        return
    if "job" in launch:  # a remote job (TFJob, Vertex AI CustomJob, Slurm job ids)
        tags["hpml.remote_job"] = f"{launch['launcher']}:{launch['job']}"
    if "restarts" in launch:  # a launcher that restarts the job itself (local, slurm)
        metrics["restarts"] = launch["restarts"]
        launch = without_unmeasured_recovery(launch)
        if "steps_lost" in launch:
            metrics.update(steps_lost=launch["steps_lost"], recovery_seconds=sum(launch["recovery_seconds"]))
        if launch.get("restarted_in_place"):  # parameter-server workers restarted without the cluster
            tags["hpml.restarted_in_place"] = ",".join(launch["restarted_in_place"])
        if launch.get("rejoin_seconds"):
            metrics["rejoin_seconds"] = sum(launch["rejoin_seconds"])
