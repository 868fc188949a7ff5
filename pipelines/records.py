"""Run records: every pipeline run is one MLflow run holding its parameters, per-epoch and
final metrics, component durations, artifact URIs and its Airflow dag_id/run_id tags.

The store is SQLite under HPML_HOME unless MLFLOW_TRACKING_URI says otherwise.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import socket
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping

from hpml.components import files
from hpml.components.errors import HpmlError
from hpml.components.results import CONSTANT_FEATURES_TAG, EMPTY_COLUMNS_TAG, RunRecord, history_series
from hpml.pipelines import locks
from hpml.pipelines.paths import hpml_home

# MLflow 3 sends usage events to mlflow-telemetry.io from every process that imports it. hpml's processes reach
# only the stores they are given, so its telemetry is off unless the user sets MLFLOW_DISABLE_TELEMETRY=false.
# It must be set before mlflow is imported, and this module is where hpml imports it.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

ARTIFACT_TAG = "artifact."
DURATION_METRIC = "duration_s."
SHORT_ID = 8  # how many characters of a run id `hpml runs` shows; any unique prefix of 4 or more resolves


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    home = hpml_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'mlflow.db'}"


_OPENED: set[str] = set()  # SQLite stores this process has opened, so their tables exist


def client():
    from mlflow.tracking import MlflowClient

    uri = tracking_uri()
    if uri in _OPENED or not uri.startswith("sqlite:"):
        return MlflowClient(uri)
    # Opening a new SQLite store creates its tables: two runs started at once must not both do it.
    with locks.held(hpml_home() / ".mlflow-store.lock"):
        mlflow_client = MlflowClient(uri)
    _OPENED.add(uri)
    return mlflow_client


def _experiment_id(mlflow_client, name: str) -> str:
    experiment = mlflow_client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    # A tracking server puts artifacts in its own store, where every machine reads them (a local path here would
    # leave them on whichever machine created the experiment). A store this process opens itself (a file,
    # SQLite or another database) keeps them under HPML_HOME, not in MLflow's default ./mlruns of the cwd.
    served = urllib.parse.urlparse(tracking_uri()).scheme in ("http", "https", "databricks")
    location = None if served else (hpml_home() / "mlartifacts" / name).as_uri()
    try:
        return mlflow_client.create_experiment(name, artifact_location=location)
    except Exception:  # noqa: BLE001 - a concurrent run created it first
        return mlflow_client.get_experiment_by_name(name).experiment_id


def start(pipeline_name: str, run_id: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
    """Create the MLflow run for one pipeline run and log its parameters; returns its id."""
    from mlflow.entities import Param, RunTag

    mlflow_client = client()
    run = mlflow_client.create_run(
        _experiment_id(mlflow_client, pipeline_name),
        run_name=run_id,
        tags={"hpml.pipeline": pipeline_name, "hpml.run_id": run_id, **tags},
    )
    mlflow_client.log_batch(
        run.info.run_id,
        params=[Param(k, str(v)) for k, v in sorted(params.items())],
        tags=[RunTag(k, str(v)) for k, v in tags.items()],
    )
    return run.info.run_id


# Files small enough to copy into the MLflow run beside the artifact URIs.
def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def log_node(mlflow_run_id: str, node_id: str, outputs: Mapping[str, str], properties: Mapping[str, Any],
             seconds: float, metric_prefix: str = "") -> None:
    """One component's outcome: its duration, output URIs and host, and the run record its executor made
    (`RunRecord`: metrics, per-epoch series, tags and small files).

    `metric_prefix` keeps apart the metrics of several nodes of one component (e.g. `Teacher_0.loss`).
    """
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    record = RunRecord.from_properties(properties)
    metrics = [Metric(f"{metric_prefix}{key}", value, now, 0) for key, value in record.metrics.items()]
    metrics += [Metric(f"{metric_prefix}{key}", value, now, step)
                for key, points in record.series.items() for step, value in points]
    metrics.append(Metric(f"{DURATION_METRIC}{node_id}", seconds, now, 0))
    tags = [RunTag(f"{ARTIFACT_TAG}{node_id}.{name}", uri) for name, uri in outputs.items()]
    tags.append(RunTag(f"{HOST_TAG}{node_id}", socket.getfqdn()))  # which machine ran it (an Airflow worker)
    tags += [RunTag(key, value) for key, value in record.tags.items()]
    tags += [RunTag(f"{metric_prefix}{key}", value) for key, value in record.node_tags.items()]
    mlflow_client = client()
    mlflow_client.log_batch(mlflow_run_id, metrics=metrics, tags=tags)
    for name, uri in outputs.items():
        for small in record.files.get(name, ()):
            path = os.path.join(uri, small)
            if files.isfile(path):
                _log_file(mlflow_client, mlflow_run_id, path, f"{node_id}/{name}")


def _log_file(mlflow_client, mlflow_run_id: str, path: str, artifact_path: str) -> None:
    """Log one file, local or on an object store (MLflow's client uploads local files only)."""
    if not files.is_url(path):
        mlflow_client.log_artifact(mlflow_run_id, path, artifact_path=artifact_path)
        return
    with tempfile.TemporaryDirectory(prefix="hpml-artifact-") as folder:
        local = os.path.join(folder, os.path.basename(path))
        with files.open_file(path, "rb") as source, open(local, "wb") as target:
            shutil.copyfileobj(source, target)
        mlflow_client.log_artifact(mlflow_run_id, local, artifact_path=artifact_path)


def _history_metrics(history: list[dict], now: int, prefix: str = "") -> list:
    """One metric per finite figure of each epoch's row, at the epoch as its step."""
    from mlflow.entities import Metric

    return [Metric(f"{prefix}{name}", value, now, step)
            for name, points in history_series(history).items() for step, value in points]


def mark_failed(mlflow_run_id: str, node_id: str, error: BaseException, metric_prefix: str = "") -> None:
    """Closes the record as FAILED with the error and its hint, and the per-epoch metrics of the epochs that
    finished before it (a Trainer puts them on the error as `partial_history`)."""
    mlflow_client = client()
    # The error first: a task being stopped may be killed seconds later (Airflow: SIGKILL 5 s after SIGTERM).
    mlflow_client.set_tag(mlflow_run_id, "hpml.failed_node", node_id)
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__  # KeyboardInterrupt()
    mlflow_client.set_tag(mlflow_run_id, "hpml.error", text[:5000])
    mlflow_client.set_tag(mlflow_run_id, f"{HOST_TAG}{node_id}", socket.getfqdn())
    hint = getattr(error, "hint", None)
    if hint:
        mlflow_client.set_tag(mlflow_run_id, "hpml.error_hint", str(hint)[:5000])
    history = getattr(error, "partial_history", None) or []
    if history:
        mlflow_client.log_batch(mlflow_run_id, metrics=_history_metrics(history, int(time.time() * 1000),
                                                                         metric_prefix))
    mlflow_client.set_terminated(mlflow_run_id, status="FAILED")


RETRIED_TAG = "hpml.retried."  # + node id: the error of the try before, once a later try of that node starts
_FAILURE_TAGS = ("hpml.failed_node", "hpml.error", "hpml.error_hint")


def reopen_for_retry(mlflow_run_id: str, node_id: str) -> str | None:
    """Where the record is FAILED in `node_id`, a new try of that node (an Airflow retry) has started: the record
    is running again, and the failed try's error moves to a `hpml.retried.<node>` tag. The error, or None."""
    mlflow_client = client()
    tags = mlflow_client.get_run(mlflow_run_id).data.tags
    if tags.get("hpml.failed_node") != node_id:
        return None
    error = tags.get("hpml.error", "")
    mlflow_client.set_tag(mlflow_run_id, f"{RETRIED_TAG}{node_id}", error)
    for key in _FAILURE_TAGS:
        if key in tags:
            mlflow_client.delete_tag(mlflow_run_id, key)
    mlflow_client.update_run(mlflow_run_id, status="RUNNING")
    return error


def finish(mlflow_run_id: str) -> None:
    client().set_terminated(mlflow_run_id, status="FINISHED")


@dataclass
class RunSummary:
    """What a finished run recorded, read back from the store."""

    mlflow_run_id: str
    run_name: str
    status: str
    params: dict[str, str]
    durations: dict[str, float]
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    eval_metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    start_time: int = 0
    examples: dict[str, int] = field(default_factory=dict)  # per split, as ExampleGen wrote them
    bad_rows: int = 0  # input rows skip_bad_rows dropped
    input_files: int = 0
    empty_columns: list[str] = field(default_factory=list)  # input columns with no value in any row
    constant_features: list[str] = field(default_factory=list)  # transformed, one value in every train example
    hosts: dict[str, str] = field(default_factory=dict)  # node -> the host that ran it


NODES_TAG = "hpml.nodes"  # the pipeline's node ids in run order, comma-separated
HOST_TAG = "hpml.host."  # + node id: the host name of the machine that ran the node


def load(mlflow_run_id: str) -> RunSummary:
    run = client().get_run(mlflow_run_id)
    metrics, tags = run.data.metrics, run.data.tags
    outputs: dict[str, dict[str, str]] = {}
    for key, uri in tags.items():
        if key.startswith(ARTIFACT_TAG):
            node, _, name = key[len(ARTIFACT_TAG):].partition(".")
            outputs.setdefault(node, {})[name] = uri
    return RunSummary(
        mlflow_run_id=mlflow_run_id,
        run_name=run.info.run_name,
        status=run.info.status,
        params=dict(run.data.params),
        durations=_in_run_order(tags.get(NODES_TAG, ""), {k[len(DURATION_METRIC):]: v for k, v in metrics.items()
                                                          if k.startswith(DURATION_METRIC)}),
        outputs=outputs,
        eval_metrics={k[len("eval_"):]: v for k, v in metrics.items() if k.startswith("eval_")},
        tags=dict(tags),
        start_time=run.info.start_time,
        examples=dict(sorted(((k[len("examples."):], int(v)) for k, v in metrics.items() if k.startswith("examples.")),
                             key=lambda kv: (kv[0] != "train", kv[0] != "eval", kv[0]))),
        bad_rows=int(metrics.get("bad_rows", 0)),
        input_files=int(metrics.get("input_files", 0)),
        empty_columns=tags[EMPTY_COLUMNS_TAG].split(", ") if tags.get(EMPTY_COLUMNS_TAG) else [],
        constant_features=tags[CONSTANT_FEATURES_TAG].split(", ") if tags.get(CONSTANT_FEATURES_TAG) else [],
        hosts={k[len(HOST_TAG):]: v for k, v in tags.items() if k.startswith(HOST_TAG)},
    )


def _in_run_order(nodes: str, durations: dict[str, float]) -> dict[str, float]:
    """Per-node durations in the order the pipeline runs its nodes (ExampleGen first; the run record's NODES_TAG),
    not the store's; nodes it does not name (a record written before that tag) come after, by name."""
    order = [node for node in nodes.split(",") if node]
    return dict(sorted(durations.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order),
                                                          kv[0])))


def find(tag: str, value: str, pipeline_name: str) -> str | None:
    """The newest run of `pipeline_name` whose tag `tag` is exactly `value`, or None."""
    mlflow_client = client()
    experiment = mlflow_client.get_experiment_by_name(pipeline_name)
    if experiment is None:
        return None
    runs = mlflow_client.search_runs([experiment.experiment_id], f"tags.`{tag}` LIKE {_like_pattern(value)}",
                                     max_results=100)
    return next((run.info.run_id for run in runs if run.data.tags.get(tag) == value), None)


def history(mlflow_run_id: str, metric: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client().get_metric_history(mlflow_run_id, metric))


def pipeline_names() -> list[str]:
    """The pipelines with runs in the store (one MLflow experiment each)."""
    return sorted(e.name for e in client().search_experiments() if e.name != "Default")


def recent(pipeline_name: str | None = None, limit: int = 20):
    mlflow_client = client()
    experiments = mlflow_client.search_experiments()
    ids = [e.experiment_id for e in experiments if pipeline_name in (None, e.name) and e.name != "Default"]
    if not ids:
        return []
    return mlflow_client.search_runs(ids, order_by=["attributes.start_time DESC"], max_results=limit)


def _like_pattern(text: str) -> str:
    """A LIKE literal matching `text`: MLflow's filter parser takes no escapes, so quotes and backslashes
    become the one-character wildcard, and callers keep only exact matches."""
    return "'" + re.sub(r"['\"\\]", "_", text) + "'"


def resolve(ref: str) -> str:
    """The MLflow run id that `ref` names: a run id, a unique prefix of one, or a run name (hpml or Airflow run id)."""
    mlflow_client = client()
    ids = [e.experiment_id for e in mlflow_client.search_experiments()]
    matches = []
    if ids and re.fullmatch(r"[0-9a-fA-F]{4,32}", ref):
        prefix = ref.lower()
        found = mlflow_client.search_runs(ids, f"attributes.run_id LIKE '{prefix}%'", max_results=6)
        matches = [m for m in found if m.info.run_id.startswith(prefix)]
    if ids and not matches:
        found = mlflow_client.search_runs(ids, f"attributes.run_name LIKE {_like_pattern(ref)}", max_results=100)
        matches = [m for m in found if m.info.run_name == ref]
    if len(matches) > 1:
        names = ", ".join(f"{m.info.run_id[:SHORT_ID]} ({m.info.run_name})" for m in matches[:5])
        raise HpmlError(f"{ref!r} names more than one run: {names}{', ...' if len(matches) > 5 else ''}",
                        hint="name one of them by its id, or give more characters of the id")
    if not matches:
        raise HpmlError(f"no run {ref!r} in the run records", hint="hpml runs lists recent runs")
    return matches[0].info.run_id
