"""Gate's spec: raw eval Examples, their Schema and the candidate Model in (the champion from the serving
destination, or a baseline Model); a ModelBlessing in TFX's layout out."""
from __future__ import annotations

from hpml.components import artifacts
from hpml.components.gate.scoring import HIGHER_IS_BETTER
from hpml.components.spec import ComponentSpec, Parameter, non_empty


def metric_bounds(what: str):
    """A check for {metric: number}: each metric one the gate computes, each number finite and fitting."""

    def check(values: dict) -> str | None:
        for metric, value in values.items():
            if metric not in HIGHER_IS_BETTER:
                return (f"names metric {metric!r}, which the gate does not compute; it computes "
                        f"{', '.join(sorted(HIGHER_IS_BETTER))}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                return f"{what} for {metric!r} must be a number, got {value!r}"
            if metric == "accuracy" and value > 1 or metric == "r2" and what == "threshold" and value > 1:
                return f"{what} for {metric!r} must be at most 1, got {value!r}"
            if value < 0 and not (metric == "r2" and what == "threshold"):  # R^2 below 0 is worse than the mean
                return f"{what} for {metric!r} must not be negative, got {value!r}"
        return None

    return check


GATE = ComponentSpec(
    name="Gate",
    inputs={"examples": artifacts.EXAMPLES, "schema": artifacts.SCHEMA, "model": artifacts.MODEL,
            "baseline_model": artifacts.MODEL},
    optional_inputs=frozenset({"baseline_model"}),
    outputs={"blessing": artifacts.MODEL_BLESSING},
    parameters={
        "label_key": Parameter(str, check=non_empty, help="the raw label feature, compared with each model's classes"),
        "split": Parameter(str, "eval", check=non_empty),
        "thresholds": Parameter(dict, {"accuracy": 0.5}, check=metric_bounds("threshold"),
                                help="{metric: bound}: accuracy or r2 at least, loss or mae at most"),
        "margins": Parameter(dict, {"accuracy": 0.01}, check=metric_bounds("margin"),
                             help="{metric: how far the candidate may fall behind the champion}"),
        "champion_from": Parameter(str, "", help="a serving destination whose served version is the champion "
                                                 "(ignored when a baseline_model is wired)"),
        "batch_size": Parameter(int, 1024, check=lambda n: None if n > 0 else "must be positive"),
    },
    executor="hpml.components.gate.executor:run",
)
