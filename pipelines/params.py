"""Pipeline parameters: one JSON schema per pipeline drives validation everywhere, the CLI,
the local runner and the Airflow trigger form alike."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jsonschema

from components.errors import SpecError
from components.trainer.strategies import STRATEGIES
from pipelines.paths import confine


def training_params_schema(default_data_path: str) -> dict:
    """JSON schema (draft 7) for the parameters every training pipeline takes."""
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "data_path": {
                "type": "string", "minLength": 1, "default": default_data_path,
                "title": "Data path",
                "description": "CSV file (plain or GZIP), directory or glob to ingest. Must lie under "
                               "HPML_DATA_ROOTS.",
            },
            "epochs": {
                "type": "integer", "minimum": 1, "maximum": 1000, "default": 10,
                "title": "Epochs", "description": "Full passes over the train split.",
            },
            "batch_size": {
                "type": "integer", "minimum": 1, "maximum": 65536, "default": 32,
                "title": "Batch size", "description": "Global batch size, summed over replicas.",
            },
            "learning_rate": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 10, "default": 0.01,
                "title": "Learning rate", "description": "Adam learning rate.",
            },
            "strategy": {
                "type": "string", "enum": list(STRATEGIES), "default": "auto",
                "title": "Distribution strategy",
                "description": "tf.distribute strategy, or gpipe; auto picks one from the devices and cluster.",
            },
            "launcher": {
                "type": "string", "enum": ["local", "kubernetes", "vertex"], "default": "local",
                "title": "Launcher",
                "description": "Where Trainer workers run: local processes on loopback; kubernetes (Kubeflow "
                               "TFJob) and vertex (Vertex AI CustomJob) need the deployment's HPML_CLUSTER_CONFIG "
                               "(image, namespace, ...).",
            },
            "remat": {
                "type": "string", "enum": ["never", "except_last", "always"], "default": "except_last",
                "title": "Rematerialisation (gpipe)",
                "description": "With strategy gpipe: recompute each stage's activations in the backward pass "
                               "for every micro-batch (always), all but the last (except_last), or none (never).",
            },
            "num_workers": {
                "type": "integer", "minimum": 1, "maximum": 16, "default": 1,
                "title": "Workers",
                "description": "Trainer worker processes: on loopback (local launcher) or replicas of the "
                               "remote job. More than 1 needs strategy auto or multi_worker_mirrored.",
            },
            "gradient_accumulation_steps": {
                "type": "integer", "minimum": 1, "maximum": 64, "default": 1,
                "title": "Gradient accumulation steps",
                "description": "Split each batch into this many micro-batches and apply one summed update.",
            },
            "seed": {
                "type": "integer", "minimum": 0, "maximum": 2 ** 31 - 1, "default": 42,
                "title": "Seed",
                "description": "Seeds weight initialisation and the shuffle order: the same seed, data "
                               "and parameters learn the same model, bit for bit.",
            },
            "skip_bad_rows": {
                "type": "boolean", "default": False,
                "title": "Skip bad rows", "description": "Skip and count malformed CSV rows instead of failing; "
                                                             "the task log names the first few, by line.",
            },
        },
    }


def defaults(schema: Mapping) -> dict[str, Any]:
    return {name: prop["default"] for name, prop in schema["properties"].items() if "default" in prop}


def validate(schema: Mapping, values: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults filled in, every value checked against the schema, data paths confined."""
    merged = {**defaults(schema), **dict(values)}
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(merged), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        field = ".".join(map(str, err.path)) or "(parameters)"
        raise SpecError(f"parameter {field!r}: {err.message}", hint=_hint(schema, err))
    if "data_path" in merged:
        merged["data_path"] = confine(merged["data_path"], "data_path")
    if merged.get("launcher", "local") != "local":
        merged["cluster"] = cluster_config(merged["launcher"])
    return merged


def cluster_config(launcher: str) -> dict:
    """The deployment's remote-cluster settings (the Trainer's `cluster` parameter) from the JSON file
    HPML_CLUSTER_CONFIG names; a remote launcher without one is refused before any work."""
    from components.trainer.launchers.remote import RemoteCluster

    path = os.environ.get("HPML_CLUSTER_CONFIG")
    if not path:
        raise SpecError(f"parameter 'launcher': {launcher!r} submits to a remote cluster, which needs a "
                        "container image of this project and cluster credentials that this deployment does not "
                        "configure", hint="set HPML_CLUSTER_CONFIG to a JSON file with image, namespace, ... "
                                          "(see infra/README.md), or use launcher local")
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, json.JSONDecodeError) as err:
        raise SpecError(f"HPML_CLUSTER_CONFIG {path}: {err}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"HPML_CLUSTER_CONFIG {path}: must hold a JSON object")
    RemoteCluster.from_params(launcher, raw)  # every field checked now, not when the Trainer starts
    return raw


def _hint(schema: Mapping, err) -> str | None:
    if err.validator == "additionalProperties":
        return f"known parameters: {', '.join(sorted(schema['properties']))}"
    field = err.path[0] if err.path else None
    prop = schema["properties"].get(field, {}) if field else {}
    return prop.get("description")


def parse_cli_value(schema: Mapping, name: str, text: str) -> Any:
    """A `name=value` from the command line, converted to the type the schema wants."""
    prop = schema["properties"].get(name)
    if prop is None:
        raise SpecError(f"unknown parameter {name!r}", hint=f"known parameters: {', '.join(sorted(schema['properties']))}")
    kind = prop.get("type")
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
        if kind == "boolean":
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
    except ValueError:
        raise SpecError(f"parameter {name!r}: {text!r} is not a valid {kind}") from None
    return text
