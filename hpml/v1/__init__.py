"""hpml's public API, version 1: everything a pipeline, a user module or a TFX pipeline imports from hpml.

    from hpml.v1 import EXAMPLE_GEN, TRANSFORM, TRAINER, Node, Pipeline, training_params_schema

Names load on first use: a pipeline definition (and so an Airflow DAG file, which Airflow parses every 30 s)
imports the contract and the component specs without TensorFlow, and a user module pulls in the training kit
(`build_dataset`, `make_strategy`, `PipelineModel`, `Distiller`, ...) only when it runs. The Airflow DAG builder
is in `hpml.v1.airflow`. Anything not listed here is internal and may change without notice.
"""
from __future__ import annotations

import importlib

# public name -> "module:attribute" it is defined in
_EXPORTS = {
    # the component contract
    "ComponentSpec": "hpml.components.spec:ComponentSpec",
    "Parameter": "hpml.components.spec:Parameter",
    "ArtifactType": "hpml.components.artifacts:ArtifactType",
    "HpmlError": "hpml.components.errors:HpmlError",
    "SpecError": "hpml.components.errors:SpecError",
    "InputDataError": "hpml.components.errors:InputDataError",
    # the components
    "EXAMPLE_GEN": "hpml.components.example_gen:EXAMPLE_GEN",
    "TRANSFORM": "hpml.components.transform:TRANSFORM",
    "TRAINER": "hpml.components.trainer:TRAINER",
    "SOFT_TARGETS": "hpml.components.soft_targets:SOFT_TARGETS",
    "EVALUATOR": "hpml.components.evaluator:EVALUATOR",
    "GATE": "hpml.components.gate:GATE",
    "PUSHER": "hpml.components.pusher:PUSHER",
    # the pipeline DSL, its parameters, and running it
    "Pipeline": "hpml.pipelines.dsl:Pipeline",
    "Node": "hpml.pipelines.dsl:Node",
    "training_params_schema": "hpml.pipelines.training_params:training_params_schema",
    "TRAINING_CHECKS": "hpml.pipelines.training_params:TRAINING_CHECKS",
    "step_hyperparameters": "hpml.pipelines.training_params:step_hyperparameters",
    "with_shipping_params": "hpml.pipelines.shipping:with_shipping_params",
    "shipping_nodes": "hpml.pipelines.shipping:shipping_nodes",
    "load_pipeline": "hpml.pipelines.discovery:load",
    "run_local": "hpml.pipelines.runner:run_local",
    "hpml_home": "hpml.pipelines.paths:hpml_home",
    # the training kit for run_fn authors
    "FnArgs": "hpml.components.trainer.fn_args:FnArgs",
    "build_dataset": "hpml.components.input_pipeline.dataset:build_dataset",
    "read_input_pipeline": "hpml.components.input_pipeline.spec:read_spec",
    "local_copies": "hpml.components.input_pipeline.read_ahead:local_copies",
    "make_strategy": "hpml.components.trainer.strategies:make_strategy",
    "is_chief": "hpml.components.trainer.strategies:is_chief",
    "standard_callbacks": "hpml.components.trainer.callbacks:standard_callbacks",
    "epoch_size": "hpml.components.trainer.callbacks:epoch_size",
    "resume_training_data": "hpml.components.trainer.resume:resume_training_data",
    "CoordinatorValidation": "hpml.components.trainer.callbacks:CoordinatorValidation",
    "record_input_stall": "hpml.components.trainer.input_stall:record_input_stall",
    "InputStallProbe": "hpml.components.trainer.callbacks.input_stall_probe:InputStallProbe",
    "tune_training_step": "hpml.components.trainer.step_tuning:tune_training_step",
    "export_serving_model": "hpml.components.trainer.export:export_serving_model",
    "ServingExport": "hpml.components.trainer.callbacks:ServingExport",
    "write_eval_metrics": "hpml.components.trainer.export:write_eval_metrics",
    "final_eval_metrics": "hpml.components.trainer.evaluation:final_eval_metrics",
    "write_classification_report": "hpml.components.trainer.classification:write_classification_report",
    "ValidationConfusion": "hpml.components.trainer.callbacks:ValidationConfusion",
    "FitWindow": "hpml.components.trainer.callbacks:FitWindow",
    "GradientAccumulationModel": "hpml.components.trainer.grad_accum:GradientAccumulationModel",
    "ModelMemory": "hpml.components.trainer.plan:ModelMemory",
    "PipelineModel": "hpml.components.trainer.gpipe.pipeline_model:PipelineModel",
    "record_pipeline_schedule": "hpml.components.trainer.gpipe.record:record_pipeline_schedule",
    "Distiller": "hpml.components.trainer.distill.distiller:Distiller",
    "distillation_loss": "hpml.components.trainer.distill.loss:distillation_loss",
    "distillation_config": "hpml.components.trainer.distill.mode:config_from",
    "distillation_schema": "hpml.components.trainer.distill.mode:schema_with_soft_targets",
    "build_distiller": "hpml.components.trainer.distill.mode:build_distiller",
    "student_for_serving": "hpml.components.trainer.distill.mode:student_for_serving",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'hpml.v1' has no attribute {name!r}")
    module, _, attribute = target.partition(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return __all__
