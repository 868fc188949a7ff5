"""Find a pipeline definition by reference, without the framework knowing any pipeline.

A reference is one of:
- a name registered in the `hpml.pipelines` entry-point group (installed packages, the bundled examples);
- `package.module:ATTRIBUTE`, an importable module and the Pipeline in it;
- `path/to/pipeline.py` or `path/to/pipeline.py:ATTRIBUTE`, a file loaded by path;
- a project folder that `hpml init` wrote (`NAME/pipeline.py`): by its name, in the current directory or in one of
  the folders `HPML_PIPELINES_PATH` lists; or by its path (`path/to/NAME`, optionally `:ATTRIBUTE`).

ATTRIBUTE defaults to `PIPELINE`. Only the definition is imported: it loads without TensorFlow.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
from pathlib import Path

from hpml.components.errors import SpecError, known_names
from hpml.components.user_module import load_file
from hpml.pipelines.dsl import Pipeline

ENTRY_POINT_GROUP = "hpml.pipelines"
PIPELINE_FILE = "pipeline.py"  # what `hpml init` writes in a project folder, beside module.py
DEFAULT_ATTRIBUTE = "PIPELINE"


def registered() -> dict[str, importlib.metadata.EntryPoint]:
    """The pipelines installed packages register, by name."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def project_folders() -> list[Path]:
    """Where project folders are looked for: the current directory, then HPML_PIPELINES_PATH (os.pathsep)."""
    extra = os.environ.get("HPML_PIPELINES_PATH", "")
    return [Path.cwd(), *(Path(p).expanduser() for p in extra.split(os.pathsep) if p)]


def project_pipeline_file(name: str) -> Path | None:
    """`NAME/pipeline.py` in the first folder of `project_folders()` that has it."""
    if not name or os.sep in name or name in (".", ".."):
        return None
    for folder in project_folders():
        candidate = folder / name / PIPELINE_FILE
        if candidate.is_file():
            return candidate.resolve()
    return None


def _folder_pipeline_file(path: str) -> Path | None:
    """`path/pipeline.py` where `path` is a folder given by its path (`hpml init --dir` wrote it elsewhere)."""
    candidate = Path(path).expanduser() / PIPELINE_FILE
    return candidate.resolve() if os.sep in path and candidate.is_file() else None


def load(reference: str) -> Pipeline:
    """The Pipeline that `reference` names; a SpecError listing what is known when nothing matches."""
    return resolve(reference)[0]


def resolve(reference: str) -> tuple[Pipeline, str]:
    """The Pipeline that `reference` names, and a reference to it that works from any directory (an entry-point
    name, `module:ATTRIBUTE`, or an absolute `file.py:ATTRIBUTE`): what a DAG file written for it names."""
    entry_points = registered()
    if reference in entry_points:
        return _checked(entry_points[reference].load(), f"entry point {reference!r}"), reference
    path_part, _, attribute = reference.partition(":")
    attribute = attribute or DEFAULT_ATTRIBUTE
    if path_part.endswith(".py"):
        return _from_file(Path(path_part).expanduser().resolve(), attribute)
    project_file = project_pipeline_file(reference) or _folder_pipeline_file(path_part)
    if project_file is not None:
        return _from_file(project_file, attribute)
    if ":" in reference:
        try:
            module = importlib.import_module(path_part)
        except ModuleNotFoundError as err:
            raise SpecError(f"pipeline {reference!r}: cannot import {path_part!r} ({err})") from None
        return _checked(getattr(module, attribute, None), reference), f"{path_part}:{attribute}"
    raise SpecError(f"unknown pipeline {reference!r}", hint=_unknown_hint(reference, entry_points))


def _unknown_hint(reference: str, entry_points) -> str:
    known = known_names("pipelines", reference, entry_points)
    return (f"{known}; or name a project folder (hpml init {reference} --csv FILE --label COLUMN writes one), "
            "a module:ATTRIBUTE or a pipeline.py file")


def _from_file(path: Path, attribute: str) -> tuple[Pipeline, str]:
    module = load_file(str(path), what="pipeline")
    return _checked(getattr(module, attribute, None), f"{path}:{attribute}"), f"{path}:{attribute}"


def _checked(found, where: str) -> Pipeline:
    if not isinstance(found, Pipeline):
        raise SpecError(f"{where} is not an hpml Pipeline (found {type(found).__name__})",
                        hint="a pipeline module defines PIPELINE = hpml.v1.Pipeline(...)")
    return found


def check(reference: str) -> None:
    """Refuse a reference that names no pipeline (loading only its definition)."""
    load(reference)
