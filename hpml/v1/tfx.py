"""hpml's TFX API, version 1 (needs `tfx` installed): hpml's components in a `tfx.dsl.Pipeline`.

    from tfx import v1 as tfx
    from hpml.v1.tfx import Trainer, Transform

    transform = Transform(examples=example_gen.outputs["examples"], schema=schema_gen.outputs["schema"],
                          module="/opt/pipelines/churn/module.py")
    trainer = Trainer(examples=transform.outputs["transformed_examples"],
                      transform_graph=transform.outputs["transform_graph"],
                      input_pipeline=transform.outputs["input_pipeline"],
                      module="/opt/pipelines/churn/module.py", strategy="mirrored")

Each takes the inputs and parameters of the hpml component of the same name; the parameters are checked when the
component is made. Outputs use TFX's standard artifact types, and `InputPipeline` is hpml's own.
"""
from hpml.pipelines.tfx.components import (PROPERTIES_KEY, Evaluator, ExampleGen, Gate, InputPipeline, Pusher,
                                           SoftTargets, Trainer, Transform)

__all__ = ["Evaluator", "ExampleGen", "Gate", "InputPipeline", "PROPERTIES_KEY", "Pusher", "SoftTargets", "Trainer",
           "Transform"]
