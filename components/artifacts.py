"""Artifact types and on-disk layouts (byte-compatible with TFX), plus atomic publishing.

An artifact is a directory URI. Executors write into a private temporary sibling and
`publish` renames it into place, so a failed or retried task never leaves a half-written
artifact and two runs never share a directory.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from typing import Iterator

from components.errors import SpecError

SPLIT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
EXAMPLES_FILE_PREFIX = "data_tfrecord"
TRANSFORMED_EXAMPLES_FILE_PREFIX = "transformed_examples"
TFRECORD_GZ_SUFFIX = ".gz"
SCHEMA_FILE = "schema.pbtxt"
SERVING_MODEL_DIR = "Format-Serving"
# The serving SavedModel's second signature (no inputs): {"class_names": [num_classes] strings}, in column order.
CLASS_NAMES_SIGNATURE = "class_names"
_TMP_MARKER = ".tmp-"


@dataclass(frozen=True)
class ArtifactType:
    """A named kind of artifact, mirroring TFX's standard artifact type names."""

    name: str


EXAMPLES = ArtifactType("Examples")
SCHEMA = ArtifactType("Schema")
TRANSFORM_GRAPH = ArtifactType("TransformGraph")
INPUT_PIPELINE = ArtifactType("InputPipeline")
MODEL = ArtifactType("Model")
MODEL_RUN = ArtifactType("ModelRun")
MODEL_EVALUATION = ArtifactType("ModelEvaluation")


def check_split_name(name: str) -> str:
    if not SPLIT_NAME_RE.match(name):
        raise SpecError(
            f"split name {name!r} is invalid",
            hint="split names must match ^[A-Za-z0-9][A-Za-z0-9_-]*$",
        )
    return name


def split_dir(uri: str, split: str) -> str:
    return os.path.join(uri, f"Split-{check_split_name(split)}")


def examples_file_pattern(uri: str, split: str) -> str:
    return os.path.join(split_dir(uri, split), f"{EXAMPLES_FILE_PREFIX}-*{TFRECORD_GZ_SUFFIX}")


def transformed_examples_file_pattern(uri: str, split: str) -> str:
    return os.path.join(
        split_dir(uri, split), f"{TRANSFORMED_EXAMPLES_FILE_PREFIX}-*{TFRECORD_GZ_SUFFIX}"
    )


def list_splits(uri: str) -> list[str]:
    """Split names present in an Examples-like artifact, sorted."""
    names = []
    for entry in sorted(os.listdir(uri)):
        if entry.startswith("Split-") and os.path.isdir(os.path.join(uri, entry)):
            names.append(entry[len("Split-"):])
    return names


def schema_path(uri: str) -> str:
    return os.path.join(uri, SCHEMA_FILE)


def serving_model_path(uri: str) -> str:
    return os.path.join(uri, SERVING_MODEL_DIR)


def require_files(pattern: str, what: str) -> list[str]:
    files = sorted(glob.glob(pattern))
    if not files:
        raise SpecError(f"{what}: no files match {pattern}", hint="is the upstream artifact complete?")
    return files


def _clear_stale_temporaries(uri: str) -> None:
    parent, base = os.path.split(os.path.abspath(uri))
    for stale in glob.glob(os.path.join(parent, glob.escape(base) + _TMP_MARKER + "*")):
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def publish(uri: str) -> Iterator[str]:
    """Yield a fresh temporary directory; on success rename it to `uri` atomically.

    Leftovers from an earlier failed attempt are removed first. If `uri` already
    exists (a retried task that had published), the new output replaces it whole.
    """
    uri = os.path.abspath(uri)
    os.makedirs(os.path.dirname(uri), exist_ok=True)
    _clear_stale_temporaries(uri)
    tmp = f"{uri}{_TMP_MARKER}{uuid.uuid4().hex[:12]}"
    os.makedirs(tmp)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.exists(uri):
        trash = f"{uri}{_TMP_MARKER}old-{uuid.uuid4().hex[:12]}"
        os.rename(uri, trash)
        os.rename(tmp, uri)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, uri)
