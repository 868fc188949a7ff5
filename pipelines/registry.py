"""Known pipelines by name, loaded lazily so the CLI starts fast."""
from __future__ import annotations

import importlib

from components.errors import SpecError, known_names
from pipelines.definition import Pipeline

PIPELINES = {"penguin": "pipelines.penguin", "distillation": "pipelines.distillation"}


def check(name: str) -> None:
    """Refuse a pipeline name that is not registered, without importing any pipeline."""
    if name not in PIPELINES:
        raise SpecError(f"unknown pipeline {name!r}", hint=known_names("pipelines", name, PIPELINES))


def get(name: str) -> Pipeline:
    check(name)
    return importlib.import_module(PIPELINES[name]).PIPELINE
