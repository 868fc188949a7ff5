"""What ExampleGen adds to the run record: examples per split, bad rows, input files, empty columns, the schema."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpml.components.artifacts import SCHEMA_FILE
from hpml.components.results import EMPTY_COLUMNS_TAG, RunRecord


def run_record(result: Mapping[str, Any]) -> RunRecord:
    metrics = {f"examples.{split}": count for split, count in (result.get("split_counts") or {}).items()}
    metrics.update({key: result[key] for key in ("bad_rows", "input_files") if key in result})
    tags = {EMPTY_COLUMNS_TAG: ", ".join(result["empty_columns"])} if result.get("empty_columns") else {}
    return RunRecord(metrics, tags, files={"schema": (SCHEMA_FILE,)})
