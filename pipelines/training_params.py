"""The parameters a training pipeline usually exposes, and their checks: a building block for pipeline authors.

    PIPELINE = Pipeline(name=..., nodes=..., params_schema=training_params_schema("data/my.csv"),
                        param_checks=TRAINING_CHECKS)

The checks only look at the fields a pipeline's schema has, so a pipeline may drop the ones it does not use.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any
from collections.abc import Mapping

from hpml.components.errors import SpecError
from hpml.components.example_gen.text_encoding import DEFAULT_ENCODING, check_encoding
from hpml.components.trainer.launchers.cluster_job import LAUNCHERS
from hpml.components.trainer.strategies import CLUSTER_STRATEGIES, STRATEGIES

REMAT_DEFAULT = "except_last"  # what gpipe does unless told; any other value without gpipe is refused


def step_hyperparameters(params: Mapping[str, Any]) -> dict:
    """The tuned step's pins as the Trainer's hyperparameters: None where the parameter asks for measuring."""
    spe, xla, precision = (params.get("steps_per_execution", 0), params.get("xla", "auto"),
                           params.get("precision", "auto"))
    return {"steps_per_execution": spe or None, "jit_compile": {"on": True, "off": False}.get(xla),
            "precision": None if precision == "auto" else precision}


# How long and how fast the model learns.
_LEARNING = {
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
}

# Where and how the Trainer's workers run.
_DISTRIBUTION = {
    "strategy": {
        "type": "string", "enum": list(STRATEGIES), "default": "auto",
        "title": "Distribution strategy",
        "description": "tf.distribute strategy, or gpipe; auto picks one from the devices and cluster.",
    },
    "launcher": {
        "type": "string", "enum": list(LAUNCHERS), "default": "local",
        "title": "Launcher",
        "description": "Where Trainer workers run: local processes on loopback; kubernetes (Kubeflow "
                       "TFJob) and vertex (Vertex AI CustomJob) need the deployment's HPML_CLUSTER_CONFIG "
                       "(image, namespace, ...); slurm submits to the deployment's Slurm cluster, one "
                       "task per node.",
    },
    "remat": {
        "type": "string", "enum": ["never", "except_last", "always"], "default": REMAT_DEFAULT,
        "title": "Rematerialisation (gpipe)",
        "description": "With strategy gpipe: recompute each stage's activations in the backward pass "
                       "for every micro-batch (always), all but the last (except_last), or none (never). Other "
                       "strategies refuse a value other than except_last.",
    },
    "num_workers": {
        "type": "integer", "minimum": 1, "maximum": 16, "default": 1,
        "title": "Workers",
        "description": "Trainer worker processes: on loopback (local launcher) or replicas of the "
                       "remote job. More than 1 needs strategy auto, multi_worker_mirrored or "
                       "parameter_server.",
    },
    "num_ps": {
        "type": "integer", "minimum": 0, "maximum": 8, "default": 0,
        "title": "Parameter servers",
        "description": "ParameterServerStrategy's ps tasks: processes on loopback (local launcher) or ps "
                       "replicas of the remote job. Strategy parameter_server needs 1 or more; with "
                       "strategy auto, 1 or more picks parameter_server.",
    },
}

# The training step: its micro-batches, its calls, compilation and precision; and the seed that makes it repeatable.
_STEP = {
    "gradient_accumulation_steps": {
        "type": "integer", "minimum": 1, "maximum": 64, "default": 1,
        "title": "Gradient accumulation steps",
        "description": "Split each batch into this many micro-batches and apply one summed update. At "
                       "most batch_size; strategy gpipe makes its own micro-batches, so leave it at 1 there.",
    },
    "steps_per_execution": {
        "type": "integer", "minimum": 0, "maximum": 1024, "default": 0,
        "title": "Steps per execution",
        "description": "Training steps per tf.function call; 0: measured for this model on this machine "
                       "(the tuned step), and kept for the next run of the same model, data and device.",
    },
    "xla": {
        "type": "string", "enum": ["auto", "on", "off"], "default": "auto",
        "title": "XLA", "description": "Compile the training step with XLA; auto: where measuring shows it "
                                       "is faster, within the tuned step's budget.",
    },
    "precision": {
        "type": "string", "enum": ["auto", "float32", "mixed_bfloat16", "mixed_float16"], "default": "auto",
        "title": "Precision",
        "description": "Keras mixed-precision policy; auto: measured where the device has a fast path "
                       "(bfloat16 on TPUs and CPUs with AVX512_BF16 or AMX, float16 on GPUs with tensor "
                       "cores), kept only within 2% of float32's loss.",
    },
    "seed": {
        "type": "integer", "minimum": 0, "maximum": 2 ** 31 - 1, "default": 42,
        "title": "Seed",
        "description": "Seeds weight initialisation and the shuffle order: the same seed, data "
                       "and parameters learn the same model, bit for bit.",
    },
}

# How ExampleGen reads the CSV.
_CSV = {
    "encoding": {
        "type": "string", "minLength": 1, "maxLength": 40, "default": DEFAULT_ENCODING,
        "title": "CSV encoding",
        "description": "Text encoding of the CSV files: utf-8 (with or without a byte-order mark), or "
                       "e.g. latin-1 or cp1252 for older spreadsheet exports.",
    },
    "skip_bad_rows": {
        "type": "boolean", "default": False,
        "title": "Skip bad rows", "description": "Skip and count malformed CSV rows instead of failing; "
                                                     "the task log names the first few, by line.",
    },
}


def training_params_schema(default_data_path: str) -> dict:
    """JSON schema (draft 7) of the parameters a training pipeline usually exposes: data, epochs, batch size,
    strategy, launcher and the rest. Extend or trim its "properties" for your pipeline."""
    data_path = {
        "type": "string", "format": "path", "minLength": 1, "default": default_data_path,
        "title": "Data path",
        "description": "CSV file (plain or GZIP), directory or glob to ingest, local, gs:// or s3://. A path "
                       "other than this default must lie under HPML_DATA_ROOTS.",
    }
    properties = {"data_path": data_path, **_LEARNING, **_DISTRIBUTION, **_STEP, **_CSV}
    return {"type": "object", "additionalProperties": False, "properties": copy.deepcopy(properties)}


def check_text_encoding(values: Mapping[str, Any]) -> None:
    """The CSV encoding is one Python knows."""
    problem = "encoding" in values and check_encoding(values["encoding"])
    if problem:
        raise SpecError(f"parameter 'encoding': {problem}",
                        hint="e.g. utf-8, latin-1 or cp1252")


def check_combinations(values: Mapping[str, Any]) -> None:
    """Values that are each valid but cannot work together, refused here rather than when the Trainer
    starts, after ExampleGen and Transform have run. Only the fields a pipeline has are checked."""
    strategy = values.get("strategy", "auto")
    workers, ps = values.get("num_workers", 1), values.get("num_ps", 0)
    launcher = values.get("launcher", "local")
    if strategy == "parameter_server" and not ps:
        raise SpecError("parameter 'num_ps': strategy parameter_server needs at least one parameter server",
                        hint="set num_ps to 1 or more, or choose another strategy")
    if ps and strategy not in ("auto", "parameter_server"):
        raise SpecError(f"parameter 'strategy': num_ps={ps} trains with ParameterServerStrategy, not {strategy}",
                        hint="set strategy to auto or parameter_server, or num_ps to 0")
    if (workers > 1 or launcher != "local") and strategy not in ("auto", *CLUSTER_STRATEGIES):
        job = f"num_workers={workers}" if workers > 1 else f"launcher {launcher}"
        raise SpecError(f"parameter 'strategy': {job} runs a cluster of worker processes, which needs "
                        f"multi_worker_mirrored or parameter_server, not {strategy}",
                        hint="set strategy to auto, multi_worker_mirrored or parameter_server")
    remat = values.get("remat", REMAT_DEFAULT)
    if remat != REMAT_DEFAULT and strategy != "gpipe":
        raise SpecError(f"parameter 'remat': {remat!r} applies to strategy gpipe's stages only; strategy "
                        f"{strategy} would train without it", hint="set strategy to gpipe, or leave remat at "
                                                                    f"{REMAT_DEFAULT!r}")
    steps, batch = values.get("gradient_accumulation_steps", 1), values.get("batch_size")
    if steps > 1 and strategy == "gpipe":
        raise SpecError("parameter 'gradient_accumulation_steps': strategy gpipe already splits each batch into "
                        "micro-batches and applies one summed update",
                        hint="leave gradient_accumulation_steps at 1 with strategy gpipe")
    if batch is not None and steps > batch:
        raise SpecError(f"parameter 'gradient_accumulation_steps': {steps} micro-batches of a batch of {batch} "
                        f"examples leave {steps - batch} of them empty",
                        hint="use at most batch_size micro-batches, or a larger batch_size")


def cluster_config(launcher: str) -> dict:
    """The deployment's remote-cluster settings (the Trainer's `cluster` parameter) from the JSON file
    HPML_CLUSTER_CONFIG names; a remote launcher without one is refused before any work."""
    from hpml.components.trainer.launchers.remote import RemoteCluster

    path = os.environ.get("HPML_CLUSTER_CONFIG")
    if not path and launcher == "slurm":  # Slurm's own settings (SLURM_CONF) name the cluster
        return {}
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




def remote_cluster(values: Mapping[str, Any]) -> dict | None:
    """With a remote launcher: the `cluster` settings from HPML_CLUSTER_CONFIG, checked before any work."""
    launcher = values.get("launcher", "local")
    return None if launcher == "local" else {"cluster": cluster_config(launcher)}


TRAINING_CHECKS = (check_text_encoding, check_combinations, remote_cluster)
