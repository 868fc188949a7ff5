"""Artifact types and layouts (byte-compatible with TFX).

An artifact is a directory URI, on a local disk or an object store (gs://, s3://), written whole by
`publishing.publish`; `require_published` refuses one on an object store whose writer did not finish.
An artifact of TFRecord shards also records each shard's size, so that a reader can tell a shard cut short after
publishing from a whole one.
"""
from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from hpml.components import files
from hpml.components.errors import InputDataError, SpecError

log = logging.getLogger(__name__)

SPLIT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
EXAMPLES_FILE_PREFIX = "data_tfrecord"
TRANSFORMED_EXAMPLES_FILE_PREFIX = "transformed_examples"
TFRECORD_GZ_SUFFIX = ".gz"
SCHEMA_FILE = "schema.pbtxt"
# At an artifact's root, beside its Split-* folders (which readers glob): {"shards": {"Split-x/name": bytes}}.
SHARD_SIZES_FILE = "shard_sizes.json"
# Beside it, from the component that wrote the examples: {split: examples}, so that a reader knows an epoch's
# length without a pass over the data.
SPLIT_EXAMPLES_FILE = "split_examples.json"
# At the root of an artifact on an object store, written last: {"files": {relative path: bytes}}.
PUBLISHED_FILE = "_hpml_published.json"
# At the root of an artifact on an object store while it is written: {"attempt": id, "host": name, "pid": n}, the
# attempt writing it now; removed just before the manifest is written.
WRITER_FILE = "_hpml_writer.json"
SERVING_MODEL_DIR = "Format-Serving"
# The serving SavedModel's second signature (no inputs): {"class_names": [num_classes] strings}, in column order.
CLASS_NAMES_SIGNATURE = "class_names"
# The serving SavedModel's signature from serialized labelled raw tf.Examples to transformed features (TFMA's
# `preprocessing_function_names`, as in TFX's own examples).
TRANSFORM_FEATURES_SIGNATURE = "transform_features"
# The serving SavedModel's signature from raw features, one 1-D tensor each, as a client without tf.Example sends
# them: a missing value is NaN (floats) or "" (strings).
RAW_FEATURES_SIGNATURE = "serving_raw"
# In a ModelRun: what a run_fn leaves for the run record and the report.
EVAL_METRICS_FILE = "eval_metrics.json"  # {metric: value} on the eval split, written by `write_eval_metrics`
CLASSIFICATION_FILE = "classification.json"  # per-class metrics and the confusion matrix of a classifier
GPIPE_RECORD_FILE = "gpipe.json"  # the GPipe schedule, stage costs and executed timeline of one traced step
METRICS_FILE = "metrics.jsonl"  # one JSON line per finished epoch: loss, metrics, val_*, seconds, examples/s
PLAN_FILE = "plan.json"  # the strategy plan and its reasons
TUNED_STEP_FILE = "tuned_step.json"  # the tuned training step: the choice, every measurement, the reasons
STALL_FILE = "input_stall.json"  # the share of a training step that waits on input
FIT_WINDOW_FILE = "fit_window.json"  # when fit began and ended, wall clock: {"started_at": s, "ended_at": s}
# In an InputPipeline: the tuned spec, and the per-stage breakdown (numbers and plot).
INPUT_PIPELINE_SPEC_FILE = "input_pipeline.json"
STAGES_FILE = "stages.json"
STAGES_PLOT_FILE = "stages.png"
# Beside the examples SoftTargets augments: the teachers' soft targets and how they were made.
SOFT_TARGETS_FILE = "soft_targets.json"
# In a ModelEvaluation: the models compared, as JSON and as a Markdown table.
EVALUATION_FILE = "results.json"
EVALUATION_TABLE_FILE = "results.md"
# In a ModelBlessing: TFX's empty marker file (one of the two), and the gate's verdict metric by metric.
BLESSED_FILE = "BLESSED"
NOT_BLESSED_FILE = "NOT_BLESSED"
GATE_FILE = "gate.json"
# In a PushedModel: where and as which version the model was published, or why it was not.
PUSH_FILE = "push.json"


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
MODEL_BLESSING = ArtifactType("ModelBlessing")
PUSHED_MODEL = ArtifactType("PushedModel")


def check_split_name(name: str) -> str:
    if not SPLIT_NAME_RE.match(name):
        raise SpecError(f"split name {name!r} is invalid", hint="split names must match ^[A-Za-z0-9][A-Za-z0-9_-]*$")
    return name


def shard_name(prefix: str, index: int, count: int, suffix: str = TFRECORD_GZ_SUFFIX) -> str:
    """The name of shard `index` of `count` (TFX's and Beam's `{prefix}-00001-of-00004.gz`)."""
    return f"{prefix}-{index:05d}-of-{count:05d}{suffix}"


_SHARD_NAME_RE = re.compile(r"^(?P<prefix>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})(?P<suffix>[^/]*)$")


def missing_from_shard_series(names: Iterable[str]) -> list[str]:
    """The shards that a series named as `shard_name` names them lacks, among `names` (relative paths): a series
    is each prefix, count and suffix of which one shard is there. A series with none left is not seen."""
    present: dict[tuple[str, int, str], set[int]] = {}
    for name in names:
        found = _SHARD_NAME_RE.match(name)
        if found:
            series = (found["prefix"], int(found["count"]), found["suffix"])
            present.setdefault(series, set()).add(int(found["index"]))
    return sorted(shard_name(prefix, index, count, suffix) for (prefix, count, suffix), indices in present.items()
                  for index in range(count) if index not in indices)


def split_dir(uri: str, split: str) -> str:
    return os.path.join(uri, f"Split-{check_split_name(split)}")


def examples_file_pattern(uri: str, split: str) -> str:
    return os.path.join(split_dir(uri, split), f"{EXAMPLES_FILE_PREFIX}-*{TFRECORD_GZ_SUFFIX}")


def transformed_examples_file_pattern(uri: str, split: str) -> str:
    return os.path.join(split_dir(uri, split), f"{TRANSFORMED_EXAMPLES_FILE_PREFIX}-*{TFRECORD_GZ_SUFFIX}")


def list_splits(uri: str) -> list[str]:
    """Split names present in an Examples-like artifact, sorted."""
    names = []
    for entry in files.listdir(uri):
        if entry.startswith("Split-") and files.isdir(os.path.join(uri, entry)):
            names.append(entry[len("Split-"):])
    return names


def schema_path(uri: str) -> str:
    return os.path.join(uri, SCHEMA_FILE)


def serving_model_path(uri: str) -> str:
    return os.path.join(uri, SERVING_MODEL_DIR)


def serving_staging_path(serving_model_dir: str) -> str:
    """Where `ServingExport` builds the serving model beside `serving_model_dir` while fit runs; what a run_fn that
    never published it leaves there, the Trainer removes."""
    return serving_model_dir.rstrip("/") + ".staging"


def require_files(pattern: str, what: str) -> list[str]:
    """The files of a split, once each is the size its writer recorded and none it recorded is missing."""
    found = files.glob(pattern)
    if not found:
        raise SpecError(f"{what}: no files match {pattern}", hint="is the upstream artifact complete?")
    recorded = recorded_shard_sizes(found)
    problems = shard_size_problems(found, recorded)
    problems.update(_missing_shards(found, pattern, {record for _, record in recorded.values()}))
    if problems:
        raise InputDataError(
            f"{what}: shard(s) not as their writer left them: "
            + "; ".join(f"{path}: {problem}" for path, problem in sorted(problems.items())),
            hint=f"the artifact changed after it was published (an interrupted copy?): re-run the component that "
                 f"wrote it; if you changed its shards on purpose, delete {SHARD_SIZES_FILE} at its root")
    return found


def _missing_shards(found: list[str], pattern: str, records: set[str]) -> dict[str, str]:
    """{shard: problem} for the shards that a size record lists under `pattern` but that are gone."""
    missing = {}
    for record in sorted(records):
        for relative in _read_shard_sizes(record):
            path = os.path.join(os.path.dirname(record), relative)
            if path not in found and fnmatch.fnmatch(path, pattern):
                missing[path] = f"missing; {record} lists it"
    return missing


def record_shard_sizes(artifact_dir: str) -> dict[str, int]:
    """Record the size of every file in the Split-* folders of an artifact being published.

    TF's and Beam's readers take a GZIP shard cut in its trailer, or any shard cut between two records, for
    a shorter whole one; against this record a stat tells them apart without reading the data.
    """
    sizes = {}
    for split in list_splits(artifact_dir):
        for relative, size in files.walk_files(split_dir(artifact_dir, split)):
            if "/" not in relative:
                sizes[f"Split-{split}/{relative}"] = size
    files.write_text(os.path.join(artifact_dir, SHARD_SIZES_FILE), json.dumps({"shards": sizes}, indent=1,
                                                                              sort_keys=True))
    return sizes


def record_split_examples(artifact_dir: str, counts: dict[str, int]) -> None:
    """Record how many examples each split of an artifact being published holds."""
    files.write_text(os.path.join(artifact_dir, SPLIT_EXAMPLES_FILE), json.dumps(dict(sorted(counts.items()))))


def recorded_examples(patterns: list[str]) -> int | None:
    """The examples that file patterns cover, as their artifacts' writer recorded them, where each pattern is the
    whole of one split (`Split-<name>/` and a wildcard name, as the Trainer's and TFX's file lists are); None
    where one is not, or its artifact holds no record (TFX's own ExampleGen writes none)."""
    total = 0
    for pattern in patterns:
        folder, name = os.path.split(pattern)
        root, split_folder = os.path.split(folder)
        if not split_folder.startswith("Split-") or "*" not in name or name.count("*") > 1:
            return None
        try:
            counts = json.loads(files.read_text(os.path.join(root, SPLIT_EXAMPLES_FILE)))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("ignoring the example count record of %s, which cannot be read: %s", root, err)
            return None
        count = counts.get(split_folder[len("Split-"):]) if isinstance(counts, dict) else None
        if not isinstance(count, int):
            return None
        total += count
    return total


def _read_shard_sizes(record: str) -> dict[str, int]:
    with files.open_file(record) as handle:
        sizes = json.load(handle)
    if not isinstance(sizes, dict) or not isinstance(sizes.get("shards"), dict):
        raise ValueError('not {"shards": {...}}')
    return sizes["shards"]


def recorded_shard_sizes(shards: list[str]) -> dict[str, tuple[int, str]]:
    """{shard: (its size as recorded, the record's path)} for the shards of an artifact with a size record.

    Shards elsewhere, or missing from their record, are left out: their reader must check them another way.
    """
    records: dict[str, dict[str, int] | None] = {}
    found = {}
    for path in shards:
        folder, name = os.path.split(path)
        root, split_folder = os.path.split(folder)
        if not split_folder.startswith("Split-"):
            continue
        record = os.path.join(root, SHARD_SIZES_FILE)
        if record not in records:
            records[record] = None
            if files.isfile(record):
                try:
                    records[record] = _read_shard_sizes(record)
                except ValueError as err:  # a damaged record vouches for nothing
                    log.warning("ignoring the shard size record %s, which cannot be read: %s", record, err)
        size = (records[record] or {}).get(f"{split_folder}/{name}")
        if isinstance(size, int):
            found[path] = (size, record)
    return found


def shard_size_problems(shards: list[str], recorded: dict[str, tuple[int, str]],
                        sizes: dict[str, int] | None = None) -> dict[str, str]:
    """{shard: problem} for the recorded shards whose size is not the recorded one; `sizes`, where the
    caller has them, saves a stat per shard."""
    problems = {}
    for path in shards:
        if path not in recorded:
            continue
        expected, record = recorded[path]
        actual = sizes[path] if sizes is not None else files.size(path)
        if actual != expected:
            problems[path] = f"{actual} bytes, but {record} records {expected} as written"
    return problems


def require_published(uri: str, what: str, manifest: bool = True) -> None:
    """A SpecError unless the artifact at `uri` was published whole (on an object store: its manifest is there,
    where `manifest`)."""
    if not files.isdir(uri):
        raise SpecError(f"{what} does not exist at {uri}", hint="did the upstream component finish?")
    if manifest and files.is_url(uri) and not files.exists(os.path.join(uri, PUBLISHED_FILE)):
        raise SpecError(f"{what} at {uri} has no {PUBLISHED_FILE}: its writer did not finish (it failed, was killed "
                        f"or is still running)", hint="re-run the component that writes it")
