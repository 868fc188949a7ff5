"""Pusher's spec: a Model and its ModelBlessing in; the model published as the next version of a serving
destination when blessed, and a PushedModel saying where (or why not) out."""
from __future__ import annotations

import re

from hpml.components import artifacts
from hpml.components.pusher.serving_dir import check_writable
from hpml.components.spec import ComponentSpec, Parameter, non_empty


def _writable(destination: str) -> str | None:
    return non_empty(destination) or check_writable(destination)


def _model_name(name: str) -> str | None:
    if name and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,249}", name):
        return f"{name!r} is not a registered model name: use letters, digits, '_', '.' and '-'"
    return None


PUSHER = ComponentSpec(
    name="Pusher",
    inputs={"model": artifacts.MODEL, "model_blessing": artifacts.MODEL_BLESSING},
    outputs={"pushed_model": artifacts.PUSHED_MODEL},
    parameters={
        "destination": Parameter(str, check=_writable,
                                 help="the serving folder: each push adds <destination>/<version>/, as TF Serving "
                                      "reads it"),
        "registered_model": Parameter(str, "", check=_model_name,
                                      help="the MLflow registered model that gets each pushed version, with the alias "
                                           "'champion' on the one in service; empty: no registry"),
        "tracking_uri": Parameter(str, "", help="the MLflow tracking (and registry) URI; empty: MLflow's default"),
    },
    executor="hpml.components.pusher.executor:run",
)
