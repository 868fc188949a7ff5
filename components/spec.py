"""The component contract: a typed spec (inputs, outputs, parameters) plus an executor.

Executors are plain functions `executor(inputs, outputs, params) -> properties` of artifact
URIs (a list of URIs for a list input) and validated parameters. They import nothing from Airflow, so the local
runner, the Airflow adapter or a user's own TFX pipeline can all drive them.

A spec names its executor as "module:function" and imports it only when the component runs: a
pipeline definition, and so an Airflow DAG file that the dag-processor re-parses every 30 s,
then loads without TensorFlow or Beam.
"""
from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Mapping

from hpml.components import artifacts, publishing, staging
from hpml.components.artifacts import ArtifactType
from hpml.components.errors import SpecError, known_names

_REQUIRED = object()

Executor = Callable[[Mapping[str, str], Mapping[str, str], Mapping[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True)
class Parameter:
    """One execution parameter: its type, default, allowed choices and an optional check."""

    type: type | tuple[type, ...]
    default: Any = _REQUIRED
    choices: tuple = ()
    check: Callable[[Any], str | None] | None = None
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def non_empty(value: str) -> str | None:
    """A check for a string parameter that names something: a module, a function, a path."""
    return None if value.strip() else "must not be empty"


def names(what: str, at_least_one: bool = False) -> Callable[[list], str | None]:
    """A check for a list parameter of names (splits, columns): non-empty strings, each named once."""

    def check(values: list) -> str | None:
        if at_least_one and not values:
            return f"needs at least one {what}"
        for value in values:
            if not isinstance(value, str) or not value.strip():
                return f"each {what} must be a non-empty string, got {value!r}"
        repeated = sorted({value for value in values if values.count(value) > 1})
        return f"names {what} {', '.join(map(repr, repeated))} more than once" if repeated else None

    return check


@dataclass(frozen=True)
class ComponentSpec:
    """What a component consumes, produces and is configured with."""

    name: str
    inputs: Mapping[str, ArtifactType]
    outputs: Mapping[str, ArtifactType]
    parameters: Mapping[str, Parameter]
    executor: Executor | str  # the function, or "module:function" naming it (imported at run time)
    optional_inputs: frozenset[str] = field(default_factory=frozenset)
    # Inputs that take a list of artifacts (e.g. several teacher Models) instead of one.
    list_inputs: frozenset[str] = field(default_factory=frozenset)
    # Inputs the executor reads from an object store itself, not through a whole local copy (see `staging`).
    streamed_inputs: frozenset[str] = field(default_factory=frozenset)
    # Checks across parameters, run on the resolved values: each returns a problem or None.
    checks: tuple[Callable[[Mapping[str, Any]], str | None], ...] = ()

    def resolve_params(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Fill defaults and check every parameter; unknown names are refused."""
        unknown = sorted(set(given) - set(self.parameters))
        if unknown:
            raise SpecError(
                f"{self.name}: unknown parameter(s) {', '.join(unknown)}",
                hint=known_names("parameters", unknown[0], self.parameters),
            )
        resolved: dict[str, Any] = {}
        for name, param in self.parameters.items():
            if name in given:
                value = given[name]
            elif param.required:
                raise SpecError(f"{self.name}: parameter {name!r} is required", hint=param.help or None)
            else:
                value = param.default
            types = param.type if isinstance(param.type, tuple) else (param.type,)
            # Python's bool is an int: num_workers=True would quietly mean 1.
            if value is not None and (not isinstance(value, types) or isinstance(value, bool) and bool not in types):
                expected = " or ".join(t.__name__ for t in types)
                raise SpecError(
                    f"{self.name}: parameter {name!r} must be {expected}, got {type(value).__name__} {value!r}"
                )
            if isinstance(value, float) and not math.isfinite(value):  # NaN would pass any range check
                raise SpecError(f"{self.name}: parameter {name!r} must be a finite number, got {value!r}")
            if param.choices and value not in param.choices:
                raise SpecError(
                    f"{self.name}: parameter {name!r} is {value!r}; choose one of {', '.join(map(str, param.choices))}"
                )
            if param.check is not None and value is not None:
                problem = param.check(value)
                if problem:
                    raise SpecError(f"{self.name}: parameter {name!r}: {problem}")
            resolved[name] = value
        for check in self.checks:
            problem = check(resolved)
            if problem:
                raise SpecError(f"{self.name}: {problem}")
        return resolved

    def run(
        self, inputs: Mapping[str, str], outputs: Mapping[str, str], params: Mapping[str, Any],
        manifests: bool = True,
    ) -> dict[str, Any]:
        """Validate the wiring and parameters, then call the executor.

        `manifests=False` accepts inputs on an object store without hpml's publication manifest: under TFX, whose
        metadata store says which artifacts were published, they may come from TFX's own components."""
        missing = sorted(set(self.inputs) - set(inputs) - self.optional_inputs)
        if missing:
            raise SpecError(f"{self.name}: missing input artifact(s) {', '.join(missing)}")
        for name, uri in inputs.items():
            if name not in self.inputs:
                raise SpecError(f"{self.name}: unexpected input {name!r}")
            if name in self.list_inputs:
                if not isinstance(uri, (list, tuple)):
                    raise SpecError(f"{self.name}: input {name!r} takes a list of {self.inputs[name].name} URIs")
                uris = list(uri)
            elif isinstance(uri, (list, tuple)):
                raise SpecError(f"{self.name}: input {name!r} takes one {self.inputs[name].name} URI, not a list")
            else:
                uris = [uri]
            for one in uris:
                if one is not None:
                    artifacts.require_published(one, f"{self.name}: input {name!r} ({self.inputs[name].name})",
                                                manifest=manifests)
        if set(outputs) != set(self.outputs):
            raise SpecError(
                f"{self.name}: outputs must be exactly {sorted(self.outputs)}, got {sorted(outputs)}"
            )
        resolved = self.resolve_params(params)
        # From here on, an attempt that began later (this task's retry) takes precedence over this one's outputs;
        # s3:// goes through local folders.
        with publishing.attempt(outputs.values(), time.time()) as started_at, \
                staging.staged(inputs, outputs, self.streamed_inputs, started_at) as (local_inputs, local_outputs):
            return dict(self.load_executor()(local_inputs, local_outputs, resolved) or {})

    def load_executor(self) -> Executor:
        """The executor function, importing its module if the spec names it as "module:function"."""
        if callable(self.executor):
            return self.executor
        module, _, function = self.executor.partition(":")
        try:
            return getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError) as error:
            raise SpecError(f"{self.name}: cannot load executor {self.executor!r}: {error}") from error
