"""Where hpml keeps its state, and which data paths parameters may name."""
from __future__ import annotations

import importlib.util
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
    """The palmerpenguins package's CSV, found without importing the package (it imports pandas)."""
    package = importlib.util.find_spec("palmerpenguins")
    if package is None or package.origin is None:
        raise SpecError("the palmerpenguins package is not installed", hint="run `make env`")
    return str(Path(package.origin).parent / "data" / "penguins.csv")


def digits_csv() -> str:
    """Where scikit-learn's 8x8 digits live as a headed CSV (pixel_0..pixel_63, digit): HPML_HOME/data.

    Only a path: DAG files are parsed often, so nothing is written here. `ensure_digits_csv`
    writes the file when a run first reads it.
    """
    return str(hpml_home() / "data" / "digits.csv")


def ensure_digits_csv(path: str) -> str:
    """`path`, with the digits CSV written there first if `path` is `digits_csv()` and missing.

    The data ship inside scikit-learn (nothing is downloaded); the file is written atomically,
    so concurrent or retried runs never see half of it. Any other path is returned untouched.
    """
    target = Path(digits_csv())
    if Path(path).resolve() != target.resolve() or target.is_file():
        return path
    import numpy as np
    from sklearn.datasets import load_digits

    target.parent.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    rows = np.column_stack([digits.data.astype(np.int64), digits.target.astype(np.int64)])
    header = ",".join([f"pixel_{i}" for i in range(digits.data.shape[1])] + ["digit"])
    tmp = target.with_suffix(f".tmp-{os.getpid()}")
    np.savetxt(tmp, rows, fmt="%d", delimiter=",", header=header, comments="")
    os.replace(tmp, target)
    return path


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
