"""What a component's result adds to the run record: metrics, tags and small files, decided by the component.

An executor returns its properties (JSON, so that Airflow's XCom and TFX's execution properties carry them);
one that owns its record puts a `RunRecord` there under `RECORD_KEY`, and the run record logs it as it is.
A new field then touches only the component that produces it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping, Sequence

RECORD_KEY = "record"
# Tags the run summary reads back.
EMPTY_COLUMNS_TAG = "hpml.empty_columns"  # input columns with no value in any row (ExampleGen)
CONSTANT_FEATURES_TAG = "hpml.constant_features"  # transformed features with one value in every train example


@dataclass(frozen=True)
class RunRecord:
    """Metrics ({name: number}), tags ({name: text}) and, per output, the names of small files to attach;
    `series` are per-epoch metrics ({name: [(epoch, value)]}); `node_tags` are tags that, like every metric, take
    the node's prefix where a pipeline has several nodes of one component (a distillation's teachers)."""

    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    series: Mapping[str, list[tuple[int, float]]] = field(default_factory=dict)
    node_tags: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"metrics": {k: float(v) for k, v in self.metrics.items() if _finite(v)},
                "tags": {k: str(v) for k, v in self.tags.items()},
                "files": {k: list(v) for k, v in self.files.items()},
                "series": {k: [[int(step), float(v)] for step, v in points if _finite(v)]
                           for k, points in self.series.items()},
                "node_tags": {k: str(v) for k, v in self.node_tags.items()}}

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any]) -> RunRecord:
        """The record an executor's properties carry; an empty one when it has none."""
        record = properties.get(RECORD_KEY) or {}
        return cls(dict(record.get("metrics", {})), dict(record.get("tags", {})),
                   {k: tuple(v) for k, v in record.get("files", {}).items()},
                   {k: [(int(step), float(v)) for step, v in points] for k, points in record.get("series", {}).items()},
                   dict(record.get("node_tags", {})))


def history_series(history: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per-epoch rows ({"epoch": n, name: value, ...}) as series: every finite figure at its epoch."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in history:
        for name, value in row.items():
            if name != "epoch" and _finite(value):
                series.setdefault(name, []).append((int(row["epoch"]), float(value)))
    return series


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
