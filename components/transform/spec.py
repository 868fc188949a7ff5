"""Transform's spec: Examples and Schema in; TransformGraph, transformed examples, InputPipeline out."""
from __future__ import annotations

from hpml.components import artifacts
from hpml.components.spec import ComponentSpec, Parameter, names, non_empty

TRANSFORM = ComponentSpec(
    name="Transform",
    inputs={"examples": artifacts.EXAMPLES, "schema": artifacts.SCHEMA},
    outputs={
        "transform_graph": artifacts.TRANSFORM_GRAPH,
        "transformed_examples": artifacts.EXAMPLES,
        "input_pipeline": artifacts.INPUT_PIPELINE,
    },
    parameters={
        "module": Parameter(str, check=non_empty, help="dotted module or .py file holding the preprocessing_fn"),
        "preprocessing_fn": Parameter(str, "preprocessing_fn", check=non_empty),
        "analyze_splits": Parameter(list, ["train"], check=names("split", at_least_one=True),
                                    help="splits the full-pass analyzers see"),
        "required_features": Parameter(list, [], check=names("feature"),
                                       help="raw features that must be in the schema"),
        "batch_size": Parameter(int, 32, check=lambda n: None if n > 0 else "must be positive"),
        "beam_pipeline_args": Parameter(list, []),
        "tune_input_pipeline": Parameter(bool, True, help="profile the transformed data and tune tf.data for it"),
        "profile_sample_records": Parameter(int, 4096, check=lambda n: None if n > 0 else "must be positive",
                                            help="records read to profile the data"),
        "deterministic": Parameter(bool, True, help="the tuned pipeline keeps a reproducible order"),
        "ram_fraction": Parameter((float, int), 0.5, check=lambda f: None if 0 < f <= 0.9 else "must be in (0, 0.9]",
                                  help="share of available RAM the tuned pipeline may use"),
        "on_corrupt_shard": Parameter(str, "error", choices=("error", "skip"),
                                      help="fail on a corrupt shard, or skip and count it"),
    },
    executor="hpml.components.transform.executor:run",
)
