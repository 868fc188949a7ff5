"""SoftTargets' spec: transformed examples, TransformGraph and teacher Models in; examples with soft targets out."""
from __future__ import annotations

from hpml.components import artifacts
from hpml.components.spec import ComponentSpec, Parameter

SOFT_TARGETS = ComponentSpec(
    name="SoftTargets",
    inputs={"examples": artifacts.EXAMPLES, "transform_graph": artifacts.TRANSFORM_GRAPH,
            "teachers": artifacts.MODEL},
    list_inputs=frozenset({"teachers"}),
    outputs={"examples": artifacts.EXAMPLES},
    parameters={
        "label_key": Parameter(str, help="the transformed label feature, which the teachers do not read"),
        "temperature": Parameter((int, float), 4.0, check=lambda t: None if t > 0 else "must be > 0",
                                 help="T the teachers' outputs are softened at; the student must train at the same T"),
        "batch_size": Parameter(int, 256, check=lambda n: None if n > 0 else "must be positive",
                                help="examples per teacher call"),
        "beam_pipeline_args": Parameter(list, []),
    },
    executor="hpml.components.soft_targets.executor:run",
)
