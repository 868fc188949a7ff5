"""Trainer's spec: transformed examples, TransformGraph and Schema in; Model and ModelRun out."""
from __future__ import annotations

from hpml.components import artifacts
from hpml.components.spec import ComponentSpec, Parameter, names, non_empty
from hpml.components.trainer.launchers.cluster_job import LAUNCHERS
from hpml.components.trainer.strategies import STRATEGIES


def _save_freq(value):
    if value == "epoch" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return None
    return "must be 'epoch' or a positive number of steps"


def _cluster_needs_a_remote_launcher(params):
    if params["cluster"] and params["launcher"] == "local":
        return ("parameter 'cluster' is set but launcher is 'local', which starts its workers on this machine and "
                "would ignore it; set launcher to 'kubernetes', 'vertex' or 'slurm', or leave cluster out")
    return None


TRAINER = ComponentSpec(
    name="Trainer",
    inputs={
        "examples": artifacts.EXAMPLES,
        "transform_graph": artifacts.TRANSFORM_GRAPH,
        "schema": artifacts.SCHEMA,
        "input_pipeline": artifacts.INPUT_PIPELINE,
        "base_model": artifacts.MODEL,
        "teachers": artifacts.MODEL,
    },
    optional_inputs=frozenset({"transform_graph", "schema", "input_pipeline", "base_model", "teachers"}),
    list_inputs=frozenset({"teachers"}),
    streamed_inputs=frozenset({"examples"}),  # on s3://, shards are fetched ahead of the reader
    outputs={"model": artifacts.MODEL, "model_run": artifacts.MODEL_RUN},
    parameters={
        "module": Parameter(str, check=non_empty, help="dotted module or .py file holding run_fn"),
        "run_fn": Parameter(str, "run_fn", check=non_empty),
        "train_splits": Parameter(list, ["train"], check=names("split")),
        "eval_splits": Parameter(list, ["eval"], check=names("split")),
        "train_steps": Parameter(int, 0, check=lambda n: None if n >= 0 else "must be >= 0",
                                 help="steps per epoch; 0 means one pass over the data"),
        "eval_steps": Parameter(int, 0, check=lambda n: None if n >= 0 else "must be >= 0"),
        "hyperparameters": Parameter(dict, {}),
        "custom_config": Parameter(dict, {}),
        "strategy": Parameter(str, "auto", choices=STRATEGIES),
        "launcher": Parameter(str, "local", choices=LAUNCHERS,
                              help="local processes on loopback, a Kubeflow TFJob, a Vertex AI CustomJob, or a "
                                   "Slurm job (one task per node)"),
        "cluster": Parameter(dict, {}, help="for kubernetes/vertex: image, namespace, gpus_per_worker, cpu, memory, "
                                            "kube_context, poll_seconds, timeout_seconds; vertex: project, "
                                            "location, staging_bucket, machine_type, accelerator_type; slurm: "
                                            "partition, python, port, gpus_per_worker, shared_filesystem, "
                                            "poll_seconds, timeout_seconds"),
        "num_workers": Parameter(int, 1, check=lambda n: None if n >= 1 else "must be >= 1"),
        "num_ps": Parameter(int, 0, check=lambda n: None if n >= 0 else "must be >= 0"),
        "max_restarts": Parameter(int, 2, check=lambda n: None if n >= 0 else "must be >= 0"),
        "backup_save_freq": Parameter((str, int), "epoch", check=_save_freq,
                                      help="BackupAndRestore save_freq: 'epoch' or every N steps"),
        "mode": Parameter(str, "train", choices=("train", "distill"),
                          help="distill: train the module's student against frozen teacher Models"),
        "temperature": Parameter((int, float), 4.0, check=lambda t: None if t > 0 else "must be > 0",
                                 help="distillation temperature T"),
        "alpha": Parameter((int, float), 0.5, check=lambda a: None if 0 <= a <= 1 else "must be in [0, 1]",
                           help="weight a of the soft-target term"),
        "soft_targets": Parameter(str, "auto", choices=("auto", "precomputed", "on_the_fly"),
                                  help="auto: the SoftTargets cache when the examples carry one, else the teachers"),
    },
    executor="hpml.components.trainer.executor:run",
    checks=(_cluster_needs_a_remote_launcher,),
)
