"""Where hpml keeps its state, and which data paths parameters may name."""
from __future__ import annotations

import os
from pathlib import Path

from components.errors import SpecError

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def hpml_home() -> Path:
    """State root: artifacts, the MLflow store and reports. `HPML_HOME` overrides."""
    return Path(os.environ.get("HPML_HOME", PROJECT_ROOT / ".hpml")).resolve()


def artifact_root() -> Path:
    return Path(os.environ.get("HPML_ARTIFACT_ROOT", hpml_home() / "artifacts")).resolve()


def penguins_csv() -> str:
    import palmerpenguins

    return str(Path(palmerpenguins.__file__).parent / "data" / "penguins.csv")


def data_roots() -> list[Path]:
    """Directories data paths must lie under: `HPML_DATA_ROOTS` (os.pathsep-separated), plus
    the embedded data sets and the project's data/ folder."""
    roots = [Path(penguins_csv()).parent, PROJECT_ROOT / "data", hpml_home()]
    extra = os.environ.get("HPML_DATA_ROOTS", "")
    roots += [Path(p) for p in extra.split(os.pathsep) if p]
    return [r.resolve() for r in roots]


def confine(path: str, field: str) -> str:
    """The resolved path, or a SpecError if it escapes every configured data root."""
    resolved = Path(path).expanduser().resolve()
    for root in data_roots():
        if resolved == root or root in resolved.parents:
            return str(resolved)
    raise SpecError(
        f"parameter {field!r}: {path} is outside the allowed data roots",
        hint="add its directory to HPML_DATA_ROOTS (separated by ':')",
    )
