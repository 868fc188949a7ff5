"""A pipeline: named nodes, each a component with wired inputs and parameters derived from the
pipeline's validated parameters. Runners (local, Airflow) execute the same definition."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from components.spec import ComponentSpec
from components.errors import SpecError


@dataclass(frozen=True)
class Node:
    id: str
    component: ComponentSpec
    # input name -> (upstream node id, upstream output name)
    inputs: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # pipeline params -> component params
    params: Callable[[Mapping[str, Any]], Mapping[str, Any]] = lambda p: {}

    @property
    def upstream(self) -> list[str]:
        return sorted({src for src, _ in self.inputs.values()})


@dataclass(frozen=True)
class Pipeline:
    name: str
    nodes: tuple[Node, ...]
    params_schema: Mapping[str, Any]
    description: str = ""

    def __post_init__(self):
        seen: set[str] = set()
        for node in self.nodes:
            for input_name, (src, output) in node.inputs.items():
                if src not in seen:
                    raise SpecError(f"{self.name}: {node.id}.{input_name} reads {src}, which does not run before it")
                upstream = self.node(src).component
                if output not in upstream.outputs:
                    raise SpecError(f"{self.name}: {src} has no output {output!r}")
                if input_name not in node.component.inputs:
                    raise SpecError(f"{self.name}: {node.id} has no input {input_name!r}")
            if node.id in seen:
                raise SpecError(f"{self.name}: duplicate node id {node.id}")
            seen.add(node.id)

    def node(self, node_id: str) -> Node:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise SpecError(f"{self.name}: no node {node_id!r}")
