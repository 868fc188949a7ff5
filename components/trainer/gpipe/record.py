"""Record a GPipe model's schedule for the run record: K, M, the balance, profiled per-stage costs and the
bubble they imply, and the executed timeline of one traced training step."""
from __future__ import annotations

import json
import os

from hpml.components.artifacts import GPIPE_RECORD_FILE
from hpml.components.trainer.gpipe import profile, trace


def record_pipeline_schedule(model, batch, model_run_dir: str) -> dict:
    """Profile and trace one training step of `model` (a PipelineModel) on `batch` (features, labels), and write
    what was found to the ModelRun, where the run report draws the schedule from it."""
    features, labels = batch[0], batch[1]
    costs = profile.layer_costs(model.pipeline_layers, features, repeats=3)
    stage_costs = profile.stage_costs(costs, model.stages)
    events = trace.trace_train_step(model, features, labels)
    executed = trace.executed_order(events, model.num_stages)
    record = dict(model.describe(), stage_costs_s=stage_costs,
                  measured_bubble=profile.measured_bubble(model.order, stage_costs),
                  executed_bubble=trace.measured_bubble(events, model.num_stages),
                  executed_order=executed, executed_in_schedule_order=executed == model.order,
                  executed_events=[[e.stage, e.kind, e.micro, round(e.start_ms, 4), round(e.end_ms, 4), e.name]
                                   for e in events])
    with open(os.path.join(model_run_dir, GPIPE_RECORD_FILE), "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=2)
    return record
