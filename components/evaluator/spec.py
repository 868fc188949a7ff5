"""Evaluator's spec: raw Examples and a list of Models in; a ModelEvaluation (table + JSON) out."""
from __future__ import annotations

from hpml.components import artifacts
from hpml.components.spec import ComponentSpec, Parameter, names


def _ensembles(value: dict) -> str | None:
    for name, members in value.items():
        if not isinstance(members, list) or len(members) < 2:
            return f"ensemble {name!r} needs a list of at least two model names"
    return None


EVALUATOR = ComponentSpec(
    name="Evaluator",
    inputs={"examples": artifacts.EXAMPLES, "models": artifacts.MODEL},
    list_inputs=frozenset({"models"}),
    outputs={"evaluation": artifacts.MODEL_EVALUATION},
    parameters={
        "label_key": Parameter(str, help="the raw label feature; compared with each model's `classes` output"),
        "model_names": Parameter(list, check=names("model name", at_least_one=True),
                                 help="one row name per model, in the order of the models input"),
        "split": Parameter(str, "eval"),
        "ensembles": Parameter(dict, {}, check=_ensembles,
                               help="row name -> model names whose probabilities are averaged"),
        "distillation": Parameter(dict, {}, help="{teacher, scratch, distilled}: row names for the gap-closed figure"),
        "latency_batch": Parameter(int, 256, check=lambda n: None if n > 0 else "must be positive"),
        "latency_repeats": Parameter(int, 7, check=lambda n: None if n >= 1 else "must be >= 1"),
    },
    executor="hpml.components.evaluator.executor:run",
)
