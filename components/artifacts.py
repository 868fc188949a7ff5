"""Artifact types and layouts (byte-compatible with TFX), plus atomic publishing.

An artifact is a directory URI, on a local disk or an object store (gs://). `publish` makes a failed or retried
task leave nothing half-written that a reader would take for whole:
- on a local disk the executor writes into a private temporary sibling, renamed into place at the end;
- an object store has no rename, so the executor writes in place and a manifest of every file and its size is
  written last; readers (`require_published`) refuse an artifact without one. Each attempt first signs the
  folder as its writer: an attempt that another one has taken over since (its host cut off, its task retried
  elsewhere) neither publishes nor removes what the newer attempt wrote. An attempt's temporary files go to a
  `scratch_space` beside the artifact, not into it.
An artifact of TFRecord shards also records each shard's size, so that a reader can tell a shard cut short after
publishing from a whole one.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from collections.abc import Callable, Iterator

from hpml.components import files
from hpml.components.errors import InputDataError, SpecError, TakenOver

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
MODEL_BLESSING = ArtifactType("ModelBlessing")
PUSHED_MODEL = ArtifactType("PushedModel")


def check_split_name(name: str) -> str:
    if not SPLIT_NAME_RE.match(name):
        raise SpecError(f"split name {name!r} is invalid", hint="split names must match ^[A-Za-z0-9][A-Za-z0-9_-]*$")
    return name


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


def _clear_stale_temporaries(uri: str) -> None:
    parent, base = os.path.split(os.path.abspath(uri))
    for stale in glob.glob(os.path.join(parent, glob.escape(base) + _TMP_MARKER + "*")):
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def publish(uri: str, started_at: float | None = None) -> Iterator[str]:
    """Yield the directory to write the artifact into; on success publish it whole.

    On a local disk that is a fresh temporary sibling, renamed to `uri` at the end; leftovers of an earlier failed
    attempt are removed first, and an earlier published output is replaced whole. On an object store it is `uri`
    itself, emptied first (an earlier attempt's files must not mix with this one's), with the manifest written last.
    `started_at`: when this attempt began (a writer that publishes once its work is done, as staged s3:// outputs,
    began before it publishes); on an object store it fails, leaving the artifact alone, where an attempt that began
    later (its retry, while this one was cut off) published or writes it.
    """
    if files.is_url(uri):
        if started_at is not None:
            _refuse_if_superseded(uri, started_at)
        started_at = time.time() if started_at is None else started_at
        files.rmtree(uri)
        files.makedirs(uri)
        attempt = uuid.uuid4().hex
        files.write_text(os.path.join(uri, WRITER_FILE), json.dumps(
            {"attempt": attempt, "host": socket.gethostname(), "pid": os.getpid(), "started_at": started_at}))
        try:
            yield uri
        except BaseException:
            with contextlib.suppress(Exception):
                if _writer(uri) == attempt:
                    files.rmtree(uri)
            raise
        _check_writer(uri, attempt)
        files.remove(os.path.join(uri, WRITER_FILE))  # the published artifact is the files the manifest lists
        manifest = {"files": dict(files.walk_files(uri)), "started_at": started_at}
        files.write_text(os.path.join(uri, PUBLISHED_FILE), json.dumps(manifest, indent=1, sort_keys=True))
        return
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


@contextlib.contextmanager
def scratch_space(uri: str, started_at: float | None = None) -> Iterator[str]:
    """Yield a folder beside the artifact at `uri`, on the same storage (so that workers on other hosts reach it),
    for one attempt's temporary files; removed when the attempt ends. Kept out of the artifact itself so that a
    cut-off attempt that writes on for a while cannot leave its temporaries inside what a newer attempt published.
    `started_at`: when this attempt began (default: now), written into the folder's name. Scratch folders of
    attempts that began earlier are removed first (an attempt still writing into one then fails); where one that
    began later is there, this attempt was taken over while it was cut off, and ends (`TakenOver`)."""
    started_at = time.time() if started_at is None else started_at
    parent, base = os.path.split(uri.rstrip("/"))
    prefix = f"{base}{_TMP_MARKER}scratch-"
    with contextlib.suppress(FileNotFoundError):
        for name in files.listdir(parent):
            if not name.startswith(prefix):
                continue
            if _scratch_started_at(name[len(prefix):]) > started_at:
                raise TakenOver(f"{uri}: an attempt of this task that began after this one is working on it "
                                f"({name}); this attempt leaves it to that one", hint=_TAKEN_OVER)
            _remove_scratch(f"{parent}/{name}" if files.is_url(parent) else os.path.join(parent, name))
    own = f"{prefix}{int(started_at * 1000):012x}-{uuid.uuid4().hex[:8]}"
    scratch = f"{parent}/{own}" if files.is_url(parent) else os.path.join(parent, own)
    files.makedirs(scratch)
    try:
        yield scratch
    finally:
        _remove_scratch(scratch)


def names_scratch(text: str) -> bool:
    """Whether `text` (an error's message) names a path in an attempt's scratch folder."""
    return f"{_TMP_MARKER}scratch-" in text


def _scratch_started_at(suffix: str) -> float:
    """When the attempt that named its scratch folder `<prefix><suffix>` began; 0 for a name without the time."""
    stamp, _, _ = suffix.partition("-")
    try:
        return int(stamp, 16) / 1000 if _ else 0.0
    except ValueError:
        return 0.0


def _remove_scratch(path: str, attempts: int = 5) -> None:
    """Remove a scratch folder; a late writer (a Beam worker finishing a bundle) can leave files behind the first
    removal, so try again before giving up loudly."""
    for _ in range(attempts):
        files.rmtree(path)
        if next(files.walk_files(path), None) is None:  # a listing: TF's gs:// client caches `exists` for 5 s
            return
        time.sleep(0.2)
    raise OSError(f"could not remove the scratch folder {path}")


def writer_fence(uri: str) -> Callable[[], None]:
    """A check to call before each write into the artifact being published at `uri`: it raises once another attempt
    has taken the artifact over, or published it. On a local disk each attempt writes into a folder of its own, so
    the check passes. Picklable, for Beam workers."""
    if not files.is_url(uri):
        return unfenced
    return functools.partial(_check_writer, uri, _writer(uri))


def unfenced() -> None:
    """The check for a writer that owns its folder alone."""
    return None


_TAKEN_OVER = "an attempt whose host was cut off, or whose task was retried elsewhere, ends here"


def _check_writer(uri: str, attempt: str | None) -> None:
    if _writer(uri) != attempt:
        raise TakenOver(f"{uri} was taken over by another attempt of this task while this one wrote it; this "
                        "attempt leaves it to that one", hint=_TAKEN_OVER)


def _refuse_if_superseded(uri: str, started_at: float) -> None:
    """`TakenOver` if an attempt that began after `started_at` published, or is writing, the artifact at `uri`."""
    for name, doing in ((PUBLISHED_FILE, "published"), (WRITER_FILE, "is writing")):
        later = False
        with contextlib.suppress(OSError, ValueError, AttributeError):
            later = json.loads(files.read_text(os.path.join(uri, name))).get("started_at", 0) > started_at
        if later:
            raise TakenOver(f"{uri}: an attempt of this task that began after this one {doing} it; this attempt "
                            "leaves it to that one", hint=_TAKEN_OVER)


def _writer(uri: str) -> str | None:
    """The attempt that signed the artifact at `uri` as its writer, or None."""
    try:
        return json.loads(files.read_text(os.path.join(uri, WRITER_FILE))).get("attempt")
    except (OSError, ValueError):
        return None


def require_published(uri: str, what: str, manifest: bool = True) -> None:
    """A SpecError unless the artifact at `uri` was published whole (on an object store: its manifest is there,
    where `manifest`)."""
    if not files.isdir(uri):
        raise SpecError(f"{what} does not exist at {uri}", hint="did the upstream component finish?")
    if manifest and files.is_url(uri) and not files.exists(os.path.join(uri, PUBLISHED_FILE)):
        raise SpecError(f"{what} at {uri} has no {PUBLISHED_FILE}: its writer did not finish (it failed, was killed "
                        f"or is still running)", hint="re-run the component that writes it")
