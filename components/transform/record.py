"""What Transform adds to the run record: constant features, the tuned input pipeline's decisions and files."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpml.components.artifacts import INPUT_PIPELINE_SPEC_FILE, STAGES_FILE, STAGES_PLOT_FILE
from hpml.components.results import CONSTANT_FEATURES_TAG, RunRecord


def run_record(result: Mapping[str, Any]) -> RunRecord:
    tags = {}
    if result.get("constant_features"):
        tags[CONSTANT_FEATURES_TAG] = ", ".join(result["constant_features"])
    pipeline = result.get("input_pipeline")
    if pipeline:
        tags["hpml.input_pipeline"] = pipeline["recommendation"]
        tags.update({f"input_pipeline.{k}": str(v) for k, v in pipeline["decisions"].items()})
    return RunRecord(tags=tags, files={"input_pipeline": (INPUT_PIPELINE_SPEC_FILE, STAGES_FILE, STAGES_PLOT_FILE)})
