"""Trainer executor: build FnArgs from artifact URIs, call the user's run_fn, check the export."""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from components import artifacts
from components.errors import SpecError
from components.trainer.callbacks import read_metrics
from components.trainer.fn_args import FnArgs, tfxio_data_accessor
from components.user_module import load_function

log = logging.getLogger("hpml.trainer")

EVAL_METRICS_FILE = "eval_metrics.json"


def working_dir_for(model_uri: str) -> str:
    """A stable, run-scoped working dir: BackupAndRestore's backups survive task retries here."""
    return os.path.abspath(model_uri) + ".work"


def run(inputs: Mapping[str, str], outputs: Mapping[str, str], params: Mapping[str, Any]) -> dict:
    import json

    run_fn = load_function(params["module"], params["run_fn"])
    examples = inputs["examples"]
    train_files = [artifacts.transformed_examples_file_pattern(examples, s) for s in params["train_splits"]]
    eval_files = [artifacts.transformed_examples_file_pattern(examples, s) for s in params["eval_splits"]]
    for pattern in train_files + eval_files:
        if os.path.basename(os.path.dirname(pattern)) not in os.listdir(examples):
            raise SpecError(f"Trainer: {os.path.dirname(pattern)} does not exist",
                            hint=f"splits present: {', '.join(artifacts.list_splits(examples))}")
        artifacts.require_files(pattern, "Trainer examples")

    working_dir = working_dir_for(outputs["model"])
    os.makedirs(working_dir, exist_ok=True)
    with artifacts.publish(outputs["model"]) as model_dir, artifacts.publish(outputs["model_run"]) as run_dir:
        fn_args = FnArgs(
            working_dir=working_dir,
            train_files=train_files,
            eval_files=eval_files,
            train_steps=params["train_steps"] or None,
            eval_steps=params["eval_steps"] or None,
            schema_path=artifacts.schema_path(inputs["schema"]) if inputs.get("schema") else None,
            transform_graph_path=inputs.get("transform_graph"),
            data_accessor=tfxio_data_accessor(),
            serving_model_dir=artifacts.serving_model_path(model_dir),
            eval_model_dir=os.path.join(model_dir, "Format-TFMA"),
            model_run_dir=run_dir,
            base_model=inputs.get("base_model"),
            hyperparameters=dict(params["hyperparameters"]),
            custom_config=dict(params["custom_config"], input_pipeline_dir=inputs.get("input_pipeline")),
        )
        run_fn(fn_args)
        if not os.path.isdir(fn_args.serving_model_dir):
            raise SpecError(
                f"run_fn finished but wrote no model to serving_model_dir ({fn_args.serving_model_dir})",
                hint="run_fn must save a SavedModel to fn_args.serving_model_dir",
            )
        history = read_metrics(run_dir)
        eval_path = os.path.join(run_dir, EVAL_METRICS_FILE)
        eval_metrics = json.load(open(eval_path, encoding="utf-8")) if os.path.exists(eval_path) else {}
    import shutil

    shutil.rmtree(working_dir, ignore_errors=True)
    return {"history": history, "eval_metrics": eval_metrics}
