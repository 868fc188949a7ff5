"""Where hpml keeps its state, and which data paths parameters may name."""
from __future__ import annotations

import os
import re
from pathlib import Path

from hpml.components.errors import SpecError
from hpml.components.files import is_url


def hpml_home() -> Path:
    """State root: artifacts, the MLflow store, reports and the local Airflow. `HPML_HOME` overrides; the default
    is `$XDG_DATA_HOME/hpml` (`~/.local/share/hpml`), never inside the installed package."""
    if os.environ.get("HPML_HOME"):
        return Path(os.environ["HPML_HOME"]).expanduser().resolve()
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return (Path(data_home) / "hpml").resolve()


def artifact_root() -> str:
    """Where runs write their artifacts: `HPML_ARTIFACT_ROOT`, a local folder or a URL every worker reaches
    (gs://bucket/prefix); the default is `HPML_HOME/artifacts`."""
    root = os.environ.get("HPML_ARTIFACT_ROOT")
    if root and is_url(root):
        return root.rstrip("/")
    return str(Path(root or hpml_home() / "artifacts").expanduser().resolve())


def _extra_roots() -> list[str]:
    # Split on os.pathsep (':' on Linux) without cutting a URL's "gs://".
    extra = os.environ.get("HPML_DATA_ROOTS", "")
    return [p for p in re.split(os.pathsep + r"(?!//)", extra) if p]


def data_roots() -> list[Path]:
    """Directories data paths must lie under: `HPML_DATA_ROOTS` (os.pathsep-separated) and `HPML_HOME`."""
    return [root.resolve() for root in [hpml_home(), *(Path(p).expanduser() for p in _extra_roots()
                                                       if not is_url(p))]]


def url_data_roots() -> list[str]:
    """The object-store prefixes in `HPML_DATA_ROOTS` (gs://bucket/data), and the artifact root where it is one."""
    roots = [p.rstrip("/") for p in _extra_roots() if is_url(p)]
    return roots + ([artifact_root()] if is_url(artifact_root()) else [])


def confine(path: str, field: str) -> str:
    """The resolved path, or a SpecError if it escapes every configured data root."""
    if is_url(path):
        parts = path.split("/")
        if ".." not in parts and any(path == root or path.startswith(root + "/") for root in url_data_roots()):
            return path
        raise SpecError(f"parameter {field!r}: {path} is outside the allowed data roots",
                        hint=f"add its prefix (e.g. gs://bucket/data) to HPML_DATA_ROOTS (separated by "
                             f"'{os.pathsep}')")
    resolved = Path(path).expanduser().resolve()
    for root in data_roots():
        if resolved == root or root in resolved.parents:
            return str(resolved)
    raise SpecError(
        f"parameter {field!r}: {path} is outside the allowed data roots",
        hint=f"add its directory to HPML_DATA_ROOTS (separated by '{os.pathsep}')",
    )
