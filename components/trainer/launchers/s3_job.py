"""A remote job (Kubernetes, Vertex AI, Slurm) over s3:// artifacts: its workers run on other machines, where this
machine's local copies of the artifacts are not.

The job file names each input by its s3:// URI; each worker downloads what it reads into its own machine's cache
(`localized`). The chief writes the model and model_run to local folders of its own, and uploads them when
run_fn returns to `remote-outputs/` in the working dir on the store; once the job has succeeded, the Trainer copies
them into its outputs (`fetch_outputs`), which are published as every s3:// artifact is.
"""
from __future__ import annotations

import dataclasses
import os
import shutil

from hpml.components import artifacts, files, staging
from hpml.components.s3_files import is_s3
from hpml.components.trainer.distill.mode import CONFIG_KEY as DISTILL_KEY

OUTPUTS = "remote-outputs"
_INPUT_FIELDS = ("schema_path", "transform_graph_path", "base_model")
_OUTPUT_FIELDS = ("serving_model_dir", "eval_model_dir", "model_run_dir")


def _outputs(working_dir: str) -> tuple[str, str]:
    """(model, model_run) as the chief uploads them."""
    return f"{working_dir}/{OUTPUTS}/model", f"{working_dir}/{OUTPUTS}/model_run"


def job_fn_args(fn_args):
    """FnArgs for workers on other machines: inputs by their s3:// URIs, outputs in the working dir on the store."""
    model, run = _outputs(fn_args.working_dir)
    config = dict(fn_args.custom_config)
    if config.get("input_pipeline_dir"):
        config["input_pipeline_dir"] = staging.source_uri(config["input_pipeline_dir"])
    if config.get(DISTILL_KEY):
        config[DISTILL_KEY] = dict(config[DISTILL_KEY],
                                   teachers=[staging.source_uri(t) for t in config[DISTILL_KEY]["teachers"]])
    inputs = {name: staging.source_uri(getattr(fn_args, name)) if getattr(fn_args, name) else None
              for name in _INPUT_FIELDS}
    return dataclasses.replace(fn_args, **inputs, custom_config=config,
                               serving_model_dir=artifacts.serving_model_path(model),
                               eval_model_dir=os.path.join(model, "Format-TFMA"), model_run_dir=run)


def fetch_outputs(working_dir: str, model_dir: str, run_dir: str) -> None:
    """Copy what the chief uploaded into the Trainer's own (staged) outputs."""
    model, run = _outputs(working_dir)
    for uploaded, local in ((model, model_dir), (run, run_dir)):
        if files.isdir(uploaded):
            files.copy_tree(uploaded, local)


def localized(fields: dict, scratch: str) -> tuple[dict, dict[str, str]]:
    """A worker's FnArgs fields with a local copy of each s3:// input and a folder in `scratch` for each s3://
    output; and {local folder: s3:// URI} to upload once run_fn returns."""
    fields = dict(fields)
    for name in _INPUT_FIELDS:
        if fields.get(name) and is_s3(fields[name]):
            fields[name] = files.tf_readable(fields[name])
    config = fields["custom_config"] = dict(fields.get("custom_config") or {})
    if config.get("input_pipeline_dir") and is_s3(config["input_pipeline_dir"]):
        config["input_pipeline_dir"] = files.tf_readable(config["input_pipeline_dir"])
    if config.get(DISTILL_KEY):
        config[DISTILL_KEY] = dict(config[DISTILL_KEY], teachers=[
            files.tf_readable(t) if is_s3(t) else t for t in config[DISTILL_KEY]["teachers"]])
    uploads = {}
    for name in _OUTPUT_FIELDS:
        if is_s3(fields[name]):
            local = os.path.join(scratch, name)
            files.rmtree(local)
            uploads[local], fields[name] = fields[name], local
    return fields, uploads


def upload(uploads: dict[str, str]) -> None:
    """The chief's outputs, each replacing what an earlier attempt uploaded; the local folders are then removed."""
    for local, url in uploads.items():
        files.rmtree(url)
        if os.path.isdir(local):
            files.copy_tree(local, url)
            shutil.rmtree(local, ignore_errors=True)
