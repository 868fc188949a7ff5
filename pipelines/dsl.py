"""The pipeline DSL: named nodes, each a component with wired inputs and parameters derived from the
pipeline's validated parameters. Runners (local, Airflow, TFX) execute the same definition.

A pipeline brings its own parameters (a JSON schema, which is also the Airflow trigger form) and its own
checks on them; `hpml.pipelines.training_params` has the schema and checks that training pipelines share.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Mapping

from hpml.components.spec import ComponentSpec
from hpml.components.errors import SpecError


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,249}$")
Source = tuple[str, str]  # (upstream node id, upstream output name)


def sources(wired: Source | list[Source]) -> list[Source]:
    """The upstream outputs one input reads: a single source, or a list for a list input."""
    return list(wired) if isinstance(wired, list) else [wired]


@dataclass(frozen=True)
class Node:
    id: str
    component: ComponentSpec
    # input name -> (upstream node id, upstream output name), or a list of them for a list input
    inputs: Mapping[str, Source | list[Source]] = field(default_factory=dict)
    # pipeline params -> component params
    params: Callable[[Mapping[str, Any]], Mapping[str, Any]] = lambda p: {}

    @property
    def upstream(self) -> list[str]:
        return sorted({src for wired in self.inputs.values() for src, _ in sources(wired)})

    def resolve_inputs(self, upstream: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
        """Input name -> URI (or list of URIs) from the upstream nodes' outputs."""
        return {name: [upstream[src][out] for src, out in wired] if isinstance(wired, list)
                else upstream[wired[0]][wired[1]] for name, wired in self.inputs.items()}


@dataclass(frozen=True)
class Pipeline:
    name: str
    nodes: tuple[Node, ...]
    params_schema: Mapping[str, Any]
    description: str = ""
    # Run after the schema on the validated values, in order: each may return updates or raise SpecError.
    param_checks: tuple[Callable[[Mapping[str, Any]], Any], ...] = ()

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise SpecError(f"pipeline name {self.name!r} is invalid",
                            hint="use letters, digits, '_' and '-', starting with a letter or digit (it is the "
                                 "Airflow DAG id and a folder name)")
        seen: set[str] = set()
        for node in self.nodes:
            for input_name, wired in node.inputs.items():
                if input_name not in node.component.inputs:
                    raise SpecError(f"{self.name}: {node.id} has no input {input_name!r}")
                if isinstance(wired, list) != (input_name in node.component.list_inputs):
                    raise SpecError(f"{self.name}: {node.id}.{input_name} must be wired to "
                                    + ("a list of outputs" if isinstance(wired, tuple) else "one output"))
                for src, output in sources(wired):
                    if src not in seen:
                        raise SpecError(
                            f"{self.name}: {node.id}.{input_name} reads {src}, which does not run before it")
                    if output not in self.node(src).component.outputs:
                        raise SpecError(f"{self.name}: {src} has no output {output!r}")
            if node.id in seen:
                raise SpecError(f"{self.name}: duplicate node id {node.id}")
            seen.add(node.id)

    def validate(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The run's parameters: defaults filled in, the schema and this pipeline's checks applied."""
        from hpml.pipelines.params import validate

        validated = validate(self.params_schema, values, self.param_checks)
        for node in self.nodes:  # a bad component parameter fails now, not after the nodes before it ran
            node.component.resolve_params(node.params(validated))
        return validated

    def node(self, node_id: str) -> Node:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise SpecError(f"{self.name}: no node {node_id!r}")
