"""hpml's components as TFX components: hpml's specs and executors behind TFX's component contract.

Each TFX component wraps one hpml ComponentSpec. Its inputs and outputs are channels of TFX's standard artifact
types (Examples, Schema, TransformGraph, Model, ModelRun, ModelEvaluation, ModelBlessing, PushedModel) plus
`hpml.InputPipeline`; its parameters are checked by the hpml spec when the pipeline is defined, and travel to
the executor as JSON execution properties, so TFX records each one in MLMD. The executor is hpml's own, called
with the artifacts' URIs. Imported only where `tfx` is installed.
"""
from __future__ import annotations

import json
from typing import Any

from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.types import artifact_utils, component_spec, standard_artifacts

from hpml.components import artifacts
from hpml.components.errors import SpecError, known_names
from hpml.components.evaluator import EVALUATOR
from hpml.components.example_gen import EXAMPLE_GEN
from hpml.components.gate import GATE
from hpml.components.pusher import PUSHER
from hpml.components.soft_targets import SOFT_TARGETS
from hpml.components.spec import ComponentSpec
from hpml.components.trainer import TRAINER
from hpml.components.transform import TRANSFORM

# What the hpml executor returned (history, plan, decisions, ...), as JSON on the component's first output.
PROPERTIES_KEY = "hpml_properties"


class InputPipeline(types.Artifact):
    """hpml's tuned tf.data input pipeline for one data set: its spec and the measurements behind it."""

    TYPE_NAME = "hpml.InputPipeline"


ARTIFACT_TYPES: dict[str, type[types.Artifact]] = {
    artifacts.EXAMPLES.name: standard_artifacts.Examples,
    artifacts.SCHEMA.name: standard_artifacts.Schema,
    artifacts.TRANSFORM_GRAPH.name: standard_artifacts.TransformGraph,
    artifacts.MODEL.name: standard_artifacts.Model,
    artifacts.MODEL_RUN.name: standard_artifacts.ModelRun,
    artifacts.MODEL_EVALUATION.name: standard_artifacts.ModelEvaluation,
    artifacts.INPUT_PIPELINE.name: InputPipeline,
    artifacts.MODEL_BLESSING.name: standard_artifacts.ModelBlessing,
    artifacts.PUSHED_MODEL.name: standard_artifacts.PushedModel,
}

# TFX keeps inputs, outputs and parameters in one namespace: an output named like an input is renamed.
RENAMED_OUTPUTS = {(SOFT_TARGETS.name, "examples"): "soft_target_examples"}


def output_key(spec: ComponentSpec, name: str) -> str:
    """The TFX output key of an hpml output."""
    return RENAMED_OUTPUTS.get((spec.name, name), name)


class HpmlExecutor(base_executor.BaseExecutor):
    """Runs an hpml executor on the URIs of TFX's artifacts; subclasses name the hpml spec."""

    SPEC: ComponentSpec

    def Do(self, input_dict: dict[str, list[types.Artifact]], output_dict: dict[str, list[types.Artifact]],
           exec_properties: dict[str, Any]) -> None:
        spec = self.SPEC
        inputs: dict[str, Any] = {}
        for name, given in input_dict.items():
            if given and name in spec.list_inputs:
                inputs[name] = [a.uri for a in given]
            elif given:
                inputs[name] = artifact_utils.get_single_uri(given)
        produced = {name: artifact_utils.get_single_instance(output_dict[output_key(spec, name)])
                    for name in spec.outputs}
        params = {name: json.loads(value) for name, value in exec_properties.items()
                  if name in spec.parameters and value is not None}
        properties = spec.run(inputs, {name: a.uri for name, a in produced.items()}, params, manifests=False)
        for name, produced_artifact in produced.items():
            if spec.outputs[name] == artifacts.EXAMPLES:
                produced_artifact.split_names = artifact_utils.encode_split_names(
                    artifacts.list_splits(produced_artifact.uri))
        first = produced[next(iter(spec.outputs))]
        first.set_string_custom_property(PROPERTIES_KEY, json.dumps(properties, default=str, sort_keys=True))
        _set_tfx_properties(produced, spec, properties)


def _set_tfx_properties(produced: dict[str, types.Artifact], spec: ComponentSpec, properties: dict) -> None:
    """The custom properties TFX's own components read: `blessed` on a ModelBlessing (TFX's Pusher checks it);
    `pushed`, `pushed_destination` and `pushed_version` on a PushedModel."""
    for name, artifact in produced.items():
        if spec.outputs[name] == artifacts.MODEL_BLESSING:
            artifact.set_int_custom_property("blessed", int(properties["blessing"]["blessed"]))
        elif spec.outputs[name] == artifacts.PUSHED_MODEL:
            push = properties["push"]
            artifact.set_int_custom_property("pushed", int(push["pushed"]))
            if push["pushed"]:
                artifact.set_string_custom_property("pushed_destination", push["path"])
                artifact.set_string_custom_property("pushed_version", str(push["version"]))


def _tfx_component(spec: ComponentSpec, class_name: str, doc: str) -> type[base_component.BaseComponent]:
    """A TFX component class, with its ComponentSpec and executor classes, for one hpml spec."""
    parameters = {name: component_spec.ExecutionParameter(type=str, optional=True) for name in spec.parameters}
    inputs = {name: component_spec.ChannelParameter(type=ARTIFACT_TYPES[kind.name],
                                                    optional=name in spec.optional_inputs)
              for name, kind in spec.inputs.items()}
    outputs = {output_key(spec, name): component_spec.ChannelParameter(type=ARTIFACT_TYPES[kind.name])
               for name, kind in spec.outputs.items()}
    tfx_spec = type(f"{class_name}Spec", (types.ComponentSpec,),
                    {"PARAMETERS": parameters, "INPUTS": inputs, "OUTPUTS": outputs, "__module__": __name__})
    executor = type(f"{class_name}Executor", (HpmlExecutor,), {"SPEC": spec, "__module__": __name__})

    def __init__(self, **given: Any):
        unknown = sorted(set(given) - set(spec.inputs) - set(spec.parameters))
        if unknown:
            raise SpecError(f"{class_name}: unknown argument(s) {', '.join(unknown)}",
                            hint=known_names("inputs or parameters", unknown[0], {**spec.inputs, **spec.parameters}))
        params = {name: value for name, value in given.items() if name in spec.parameters}
        spec.resolve_params(params)  # a bad parameter fails where the pipeline is defined, not in a task
        channels = {name: value for name, value in given.items() if name in spec.inputs}
        missing = sorted(set(spec.inputs) - set(channels) - spec.optional_inputs)
        if missing:
            raise SpecError(f"{class_name}: missing input(s) {', '.join(missing)}")
        outs = {key: types.Channel(type=parameter.type) for key, parameter in outputs.items()}
        base_component.BaseComponent.__init__(
            self, spec=tfx_spec(**channels, **{k: json.dumps(v) for k, v in params.items()}, **outs))

    return type(class_name, (base_component.BaseComponent,), {
        "__doc__": doc, "__module__": __name__, "__init__": __init__,
        "SPEC_CLASS": tfx_spec, "EXECUTOR_SPEC": executor_spec.ExecutorClassSpec(executor)})


def _register(spec: ComponentSpec, doc: str) -> type[base_component.BaseComponent]:
    component = _tfx_component(spec, spec.name, doc)
    # Kubeflow and Vertex find the executor by its import path, so it must be a name of this module.
    executor = component.EXECUTOR_SPEC.executor_class
    globals()[executor.__name__] = executor
    globals()[component.SPEC_CLASS.__name__] = component.SPEC_CLASS
    return component


ExampleGen = _register(EXAMPLE_GEN, "hpml's ExampleGen: CSV or TFRecord files in; split Examples and a Schema out.")
Transform = _register(TRANSFORM, "hpml's Transform: tf.Transform over Examples, plus the InputPipeline tuned for them.")
Trainer = _register(TRAINER, "hpml's Trainer: run_fn under a planned strategy, GPipe, distillation or a launcher.")
SoftTargets = _register(SOFT_TARGETS, "hpml's SoftTargets: teacher predictions cached beside the examples.")
Evaluator = _register(EVALUATOR, "hpml's Evaluator: accuracy, latency and size of several Models on raw Examples.")
Gate = _register(GATE, "hpml's Gate: the Model against thresholds and the champion; a ModelBlessing as TFX's.")
Pusher = _register(PUSHER, "hpml's Pusher: a blessed Model as the next version of a TF Serving folder.")
