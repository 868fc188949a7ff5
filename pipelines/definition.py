"""A pipeline: named nodes, each a component with wired inputs and parameters derived from the
pipeline's validated parameters. Runners (local, Airflow) execute the same definition."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Union

from components.spec import ComponentSpec
from components.errors import SpecError


Source = tuple[str, str]  # (upstream node id, upstream output name)


def sources(wired: Union[Source, list[Source]]) -> list[Source]:
    """The upstream outputs one input reads: a single source, or a list for a list input."""
    return list(wired) if isinstance(wired, list) else [wired]


@dataclass(frozen=True)
class Node:
    id: str
    component: ComponentSpec
    # input name -> (upstream node id, upstream output name), or a list of them for a list input
    inputs: Mapping[str, Union[Source, list[Source]]] = field(default_factory=dict)
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

    def __post_init__(self):
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

    def node(self, node_id: str) -> Node:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise SpecError(f"{self.name}: no node {node_id!r}")
