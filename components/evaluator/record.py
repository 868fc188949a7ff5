"""What the Evaluator adds to the run record: each model's accuracy, size and latency, and a distillation's gap."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpml.components.artifacts import EVALUATION_FILE, EVALUATION_TABLE_FILE
from hpml.components.results import RunRecord


def run_record(result: Mapping[str, Any]) -> RunRecord:
    metrics = {}
    evaluation = result.get("evaluation")
    if evaluation:
        for row in evaluation["rows"]:
            metrics.update({f"evaluation.{row['name']}.{k}": float(row[k])
                            for k in ("accuracy", "params", "size_bytes", "latency_us")})
        metrics.update({f"distillation.{k}": float(v) for k, v in (evaluation.get("distillation") or {}).items()})
    return RunRecord(metrics, files={"evaluation": (EVALUATION_FILE, EVALUATION_TABLE_FILE)})
