"""Shipping a model: the Gate and Pusher nodes that end a training pipeline, and the parameters they take from
the run (thresholds, margin, serving folder), which the Airflow form shows.

    PIPELINE = Pipeline(..., params_schema=with_shipping_params(training_params_schema(DATA)),
                        nodes=(..., *shipping_nodes("my_pipeline", LABEL)))

A regressor's pipeline passes `task="regression"` to both.
"""
from __future__ import annotations

import copy
import os
from typing import Any
from collections.abc import Mapping

from hpml.components.gate import GATE
from hpml.components.pusher import PUSHER
from hpml.pipelines.dsl import Node, Source
from hpml.pipelines import records
from hpml.components.files import is_url
from hpml.pipelines.paths import artifact_root, hpml_home

_SERVING_DIR = {
    "type": ["string", "null"], "maxLength": 4096, "default": None,
    "title": "Serving folder",
    "description": "Where blessed models are pushed, as TF Serving reads them (<folder>/<version>/); "
                   "empty: HPML_HOME/serving/<pipeline>.",
}
SHIPPING_PARAMS = {
    "gate_min_accuracy": {
        "type": "number", "minimum": 0, "maximum": 1, "default": 0.5,
        "title": "Gate: minimum accuracy",
        "description": "A model below this accuracy on the eval split is not blessed, so not pushed.",
    },
    "gate_margin": {
        "type": "number", "minimum": 0, "maximum": 1, "default": 0.01,
        "title": "Gate: margin behind the champion",
        "description": "How far below the champion's accuracy (the model in service) a new model may be and "
                       "still be pushed.",
    },
    "serving_dir": _SERVING_DIR,
}
# A regressor's gate works on R^2, which needs no knowledge of the label's scale: 0 is what predicting the mean
# scores, so the default threshold refuses a model no better than that.
REGRESSION_SHIPPING_PARAMS = {
    "gate_min_r2": {
        "type": "number", "minimum": -1000, "maximum": 1, "default": 0.0,
        "title": "Gate: minimum R\u00b2",
        "description": "A model whose R\u00b2 on the eval split is below this is not blessed, so not pushed "
                       "(0: no better than predicting the mean label).",
    },
    "gate_margin": {
        "type": "number", "minimum": 0, "maximum": 1, "default": 0.01,
        "title": "Gate: margin behind the champion",
        "description": "How far below the champion's R\u00b2 (the model in service) a new model may be and "
                       "still be pushed.",
    },
    "serving_dir": _SERVING_DIR,
}
TASKS = ("classification", "regression")


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")


def with_shipping_params(schema: Mapping[str, Any], task: str = "classification") -> dict:
    """`schema` (a training pipeline's parameters) with the gate's and the pusher's for a model of `task` added."""
    _check_task(task)
    added = SHIPPING_PARAMS if task == "classification" else REGRESSION_SHIPPING_PARAMS
    extended = copy.deepcopy(dict(schema))
    extended["properties"] = {**extended["properties"], **copy.deepcopy(added)}
    return extended


def serving_dir(pipeline_name: str, params: Mapping[str, Any]) -> str:
    """The run's serving folder: the one it names; else, where artifacts go to an object store (so every host
    reaches them), this pipeline's under `<artifact root>/_serving`; else this pipeline's under HPML_HOME."""
    if params.get("serving_dir"):
        return params["serving_dir"]
    root = artifact_root()
    if is_url(root):
        return f"{root.rstrip('/')}/_serving/{pipeline_name}"
    return os.path.join(hpml_home(), "serving", pipeline_name)


def shipping_nodes(pipeline_name: str, label_key: str, examples: Source = ("ExampleGen", "examples"),
                   schema: Source = ("ExampleGen", "schema"),
                   model: Source = ("Trainer", "model"), task: str = "classification") -> tuple[Node, Node]:
    """Gate (the Trainer's model against thresholds and the champion) and Pusher (publish it when blessed).
    A classifier is gated on accuracy (`gate_min_accuracy`), a regressor on R^2 (`gate_min_r2`); both within
    `gate_margin` of the champion. The run's parameters come from `with_shipping_params` for the same task."""
    _check_task(task)
    metric, minimum = ("accuracy", "gate_min_accuracy") if task == "classification" else ("r2", "gate_min_r2")
    gate = Node(
        "Gate", GATE,
        inputs={"examples": examples, "schema": schema, "model": model},
        params=lambda p: {
            "label_key": label_key,
            "thresholds": {metric: p[minimum]},
            "margins": {metric: p["gate_margin"]},
            "champion_from": serving_dir(pipeline_name, p),
        },
    )
    pusher = Node(
        "Pusher", PUSHER,
        inputs={"model": model, "model_blessing": ("Gate", "blessing")},
        params=lambda p: {"destination": serving_dir(pipeline_name, p), "registered_model": pipeline_name,
                          "tracking_uri": records.tracking_uri()},
    )
    return gate, pusher


def outcome(outputs: Mapping[str, Mapping[str, str]]) -> dict | None:
    """{"gate": the Gate's verdict, "push": what the Pusher did} from a run's outputs; None for a run without a
    gate (or one that stopped before it)."""
    import json

    from hpml.components import artifacts, files

    found = {}
    for key, output, name in (("gate", "blessing", artifacts.GATE_FILE),
                              ("push", "pushed_model", artifacts.PUSH_FILE)):
        uri = next((out[output] for out in outputs.values() if output in out), None)
        path = os.path.join(uri, name) if uri else None
        found[key] = json.loads(files.read_text(path)) if path and files.isfile(path) else None
    return found if found["gate"] else None


def describe(found: Mapping[str, Any]) -> str:
    """One line: blessed or not and why, and where the model went."""
    gate, push = found["gate"], found.get("push")
    failed = [check["reason"] for check in gate["checks"] if not check["passed"]]
    text = "blessed" if gate["blessed"] else "NOT blessed: " + "; ".join(failed)
    if push is None:
        return text + "; the Pusher did not run"
    if push["pushed"]:
        registered = (f" (MLflow model {push['registered_model']} version {push['registry_version']}, alias champion)"
                      if push.get("registry_version") else "")
        pushed = "already in service as version {} in" if push.get("already_pushed") else "pushed as version {} to"
        return f"{text}; {pushed.format(push['version'])} {push['destination']}{registered}"
    champion = push.get("champion")
    return text + "; not pushed" + (f", the champion stays version {champion}" if champion else "")
