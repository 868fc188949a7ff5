"""Transform's spec: Examples and Schema in; TransformGraph, transformed examples, InputPipeline out."""
from __future__ import annotations

from components import artifacts
from components.spec import ComponentSpec, Parameter
from components.transform import executor

TRANSFORM = ComponentSpec(
    name="Transform",
    inputs={"examples": artifacts.EXAMPLES, "schema": artifacts.SCHEMA},
    outputs={
        "transform_graph": artifacts.TRANSFORM_GRAPH,
        "transformed_examples": artifacts.EXAMPLES,
        "input_pipeline": artifacts.INPUT_PIPELINE,
    },
    parameters={
        "module": Parameter(str, help="dotted module or .py file holding the preprocessing_fn"),
        "preprocessing_fn": Parameter(str, "preprocessing_fn"),
        "analyze_splits": Parameter(list, ["train"], help="splits the full-pass analyzers see"),
        "required_features": Parameter(list, [], help="raw features that must be in the schema"),
        "batch_size": Parameter(int, 32, check=lambda n: None if n > 0 else "must be positive"),
        "beam_pipeline_args": Parameter(list, []),
    },
    executor=executor.run,
)
