"""Pipeline parameters: one JSON schema per pipeline drives validation everywhere (the CLI, the local runner
and the Airflow trigger form alike), plus the checks the pipeline lists.

Validation here is generic. A string parameter whose schema says `"format": "path"` names data, and must lie
under a data root (`HPML_DATA_ROOTS`, `HPML_HOME`) or be the schema's own default. Anything else a pipeline
needs checked is a `ParamCheck` of its own; `hpml.pipelines.training_params` has the ones training pipelines share.
"""
from __future__ import annotations

import math
from typing import Any
from collections.abc import Callable, Mapping

import jsonschema

from hpml.components.errors import SpecError, known_names
from hpml.pipelines.paths import confine

# A check on validated values: returns updates to them (a resolved path, say) or None; raises SpecError.
ParamCheck = Callable[[Mapping[str, Any]], "Mapping[str, Any] | None"]
PATH_FORMAT = "path"


def defaults(schema: Mapping) -> dict[str, Any]:
    return {name: prop["default"] for name, prop in schema["properties"].items() if "default" in prop}


def path_fields(schema: Mapping) -> list[str]:
    """The parameters that name data paths (`"format": "path"`)."""
    return [name for name, prop in schema["properties"].items() if prop.get("format") == PATH_FORMAT]


def validate(schema: Mapping, values: Mapping[str, Any], checks: tuple[ParamCheck, ...] = ()) -> dict[str, Any]:
    """Defaults filled in, every value checked against the schema, data paths confined, then `checks` in order."""
    unknown = sorted(set(values) - set(schema["properties"]))
    if unknown:  # before the schema, whose own message ("Additional properties are not allowed") names no field
        raise SpecError(f"unknown parameter {unknown[0]!r}", hint=known_names("parameters", unknown[0],
                                                                               schema["properties"]))
    merged = {**defaults(schema), **dict(values)}
    for name, value in merged.items():  # NaN compares false with both bounds: the schema would let it by
        if name in schema["properties"] and isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"parameter {name!r}: {value} is not a finite number", hint=_hint(schema, None, name))
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(merged), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        field = ".".join(map(str, err.path)) or "(parameters)"
        raise SpecError(f"parameter {field!r}: {err.message}", hint=_hint(schema, err))
    for name in path_fields(schema):
        default = schema["properties"][name].get("default")
        if merged.get(name) is not None and merged[name] != default:
            merged[name] = confine(merged[name], name)
    for check in checks:
        merged.update(check(merged) or {})
    return merged


def _hint(schema: Mapping, err, field: str | None = None) -> str | None:
    if err is not None:
        field = err.path[0] if err.path else None
    prop = schema["properties"].get(field, {}) if field else {}
    return prop.get("description")


def parse_cli_value(schema: Mapping, name: str, text: str) -> Any:
    """A `name=value` from the command line, converted to the type the schema wants."""
    prop = schema["properties"].get(name)
    if prop is None:
        raise SpecError(f"unknown parameter {name!r}", hint=known_names("parameters", name, schema["properties"]))
    kind = prop.get("type")
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
        if kind == "boolean":
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
    except ValueError:
        raise SpecError(f"parameter {name!r}: {text!r} is not a valid {kind}") from None
    return text
