"""Where hpml keeps its state, and which data paths parameters may name."""
from __future__ import annotations

import hashlib
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


# A run id's folder name keeps these characters as they are (not as the first character, where '.' would make
# '.' and '..' name the pipeline's folder or its parent); every other character is written as '~XX', its UTF-8
# bytes in hex. '~' itself is escaped, so a name read left to right decodes to exactly one run id.
_KEPT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_MAX_NAME = 200  # below every file system's 255-byte name limit, with room for an object store's key prefix
# The file that names the run id a run folder belongs to, written when the run starts.
RUN_OWNER_FILE = "hpml_run_id.txt"


def run_folder_name(run_id: str) -> str:
    """The folder name of a run id, one-to-one: two different run ids never share a folder. An id whose escaped
    name would be too long is cut, and '~~' plus the SHA-256 of the whole id keeps it apart from every other."""
    if not run_id:
        return "~"
    name = "".join(char if char in _KEPT and (index or char != ".") else
                   "".join(f"~{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
                   for index, char in enumerate(run_id))
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()
    head = name[:_MAX_NAME - len(digest) - 2]
    cut = head.rfind("~", len(head) - 2)  # never leave half an escape before the digest
    return (head[:cut] if cut >= 0 else head) + "~~" + digest
