"""Run a pipeline definition: node by node, with run-scoped artifact directories and a run record.

The local runner (`hpml run`) and the Airflow adapter both call `start`, `execute_node`
and `finish`, so the two engines execute exactly the same definition.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, UTC
from typing import Any
from collections.abc import Mapping

from hpml.components import files
from hpml.components.errors import SpecError, interruption, taken_over
from hpml.components.trainer.launchers.stopping import Stopped
from hpml.pipelines import records, report
from hpml.pipelines.dsl import Pipeline
from hpml.pipelines.paths import RUN_OWNER_FILE, artifact_root, run_folder_name

log = logging.getLogger("hpml.runner")


@dataclass
class RunContext:
    """What every node of one run shares; travels between Airflow tasks as XCom."""

    pipeline: str
    run_id: str
    run_dir: str
    params: dict[str, Any]
    mlflow_run_id: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class NodeResult:
    node_id: str
    outputs: dict[str, str]
    properties: dict[str, Any]
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def run_dir_for(pipeline_name: str, run_id: str) -> str:
    """`<artifact root>/<pipeline>/<run folder>`: each run id has a folder of its own (`paths.run_folder_name`)."""
    return os.path.join(artifact_root(), pipeline_name, run_folder_name(run_id))


def claim_run_dir(run_dir: str, run_id: str) -> None:
    """Make `run_dir` this run id's, or refuse with a SpecError where another run id owns it (or a run of an
    earlier hpml left files in it): a run never writes into another run's folder. A retried run owns its own."""
    marker = os.path.join(run_dir, RUN_OWNER_FILE)
    if files.is_url(run_dir):
        if not files.exists(marker):
            if files.isdir(run_dir) and files.listdir(run_dir):
                _refuse_shared(run_dir, run_id, None)
            files.write_text(marker, run_id)
    else:
        os.makedirs(run_dir, exist_ok=True)
        try:
            with open(marker, "x", encoding="utf-8") as handle:
                handle.write(run_id)
        except FileExistsError:
            pass
        else:
            if set(os.listdir(run_dir)) != {RUN_OWNER_FILE}:  # files from before run folders were claimed
                os.remove(marker)
                _refuse_shared(run_dir, run_id, None)
    owner = files.read_text(marker)
    if owner != run_id:
        _refuse_shared(run_dir, run_id, owner)


def _refuse_shared(run_dir: str, run_id: str, owner: str | None) -> None:
    whose = f"run {owner!r}" if owner is not None else "a run of an earlier hpml"
    raise SpecError(f"run {run_id!r} cannot use the folder {run_dir}: it belongs to {whose}",
                    hint="trigger the run with another run id; hpml never writes into another run's folder")


def new_run_id() -> str:
    return f"local__{datetime.now(UTC):%Y%m%dT%H%M%S}_{uuid.uuid4().hex[:6]}"


def start(pipeline: Pipeline, values: Mapping[str, Any], run_id: str | None = None,
          tags: Mapping[str, str] | None = None) -> RunContext:
    """Validate parameters (before any work), pick the run directory and open the run record."""
    validated = pipeline.validate(values)
    run_id = new_run_id() if run_id is None else run_id
    run_dir = run_dir_for(pipeline.name, run_id)
    claim_run_dir(run_dir, run_id)
    mlflow_run_id = records.start(pipeline.name, run_id, validated, {
        "hpml.run_dir": run_dir, records.NODES_TAG: ",".join(node.id for node in pipeline.nodes), **(tags or {})})
    log.info("run %s of %s: artifacts under %s", run_id, pipeline.name, run_dir)
    log.debug("run record %s; run report (written when the run finishes): %s", mlflow_run_id,
              report.report_path(run_dir))
    return RunContext(pipeline.name, run_id, run_dir, validated, mlflow_run_id)


def output_uri(run_dir: str, node_id: str, output: str) -> str:
    """Where a run's node writes an output: `<run_dir>/<node>/<output>/`."""
    return os.path.join(run_dir, node_id, output)


def execute_node(pipeline: Pipeline, node_id: str, context: RunContext,
                 upstream: Mapping[str, Mapping[str, str]]) -> NodeResult:
    """Run one component into `<run_dir>/<node>/<output>/` and record the outcome."""
    node = pipeline.node(node_id)
    inputs = node.resolve_inputs(upstream)
    outputs = {name: output_uri(context.run_dir, node.id, name) for name in node.component.outputs}
    log.info("%s: starting", node.id)
    # Metrics of a node named after its component keep their plain names (penguin's "loss");
    # several nodes of one component (Teacher_0, Student_scratch) get their node id as a prefix.
    prefix = "" if node.id == node.component.name else f"{node.id}."
    earlier_error = records.reopen_for_retry(context.mlflow_run_id, node.id)
    if earlier_error is not None:
        log.warning("%s: retrying after: %s", node.id, earlier_error)
        write_report(context, f"{node.id} is being retried")  # the last one said FAILED
    started = time.perf_counter()
    try:
        with _active_run(context.mlflow_run_id):
            properties = node.component.run(inputs, outputs, node.params(context.params))
    except BaseException as err:
        if taken_over(err) is not None:
            # A later attempt of this task (its retry, while this one was cut off) owns the run record now: this
            # one's end is neither the node's failure nor the run's.
            log.warning("%s: this attempt ends: %s", node.id, taken_over(err))
            raise
        if not isinstance(err, KeyboardInterrupt) and interruption(err) is not None:
            # Ctrl-C, which a library's clean-up turned into an error of its own on the way out: recorded and
            # raised as the interruption it is (the CLI's two lines, exit status 130), not as a crash.
            interrupted = KeyboardInterrupt()
            interrupted.partial_history = getattr(err, "partial_history", None)  # type: ignore[attr-defined]
            records.mark_failed(context.mlflow_run_id, node.id, interrupted, prefix)
            raise interrupted from err
        records.mark_failed(context.mlflow_run_id, node.id, err, prefix)
        if isinstance(err, Exception) and not isinstance(err, Stopped):  # Airflow kills a stopped task in 5 s
            write_report(context, f"the run failed in {node.id}")
        raise
    seconds = time.perf_counter() - started
    records.log_node(context.mlflow_run_id, node.id, outputs, properties, seconds, prefix)
    for name, uri in outputs.items():
        log.debug("%s: %s -> %s", node.id, name, uri)
    log.info("%s: done in %.1fs", node.id, seconds)
    return NodeResult(node.id, outputs, properties, seconds)


@contextlib.contextmanager
def _active_run(mlflow_run_id: str | None):
    """MLFLOW_RUN_ID names the run record while a component runs: what it logs to MLflow (the Pusher's model)
    joins the pipeline run."""
    previous = os.environ.get("MLFLOW_RUN_ID")
    if mlflow_run_id:
        os.environ["MLFLOW_RUN_ID"] = mlflow_run_id
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_RUN_ID", None)
        else:
            os.environ["MLFLOW_RUN_ID"] = previous


def finish(context: RunContext) -> str | None:
    """Close the run record and write the run report; returns the report's path."""
    records.finish(context.mlflow_run_id)
    return write_report(context)


def write_report(context: RunContext, why: str = "") -> str | None:
    """Write the run report from the record, finished or failed; its path, or None where it could not be
    written (logged and tagged: a report must neither fail a finished run nor hide a failed one's error)."""
    try:
        path = report.build(context.mlflow_run_id)
        records.client().set_tag(context.mlflow_run_id, "hpml.report", path)
    except Exception as err:
        log.exception("the run report could not be written")
        with contextlib.suppress(Exception):
            records.client().set_tag(context.mlflow_run_id, "hpml.report_error",
                                     f"{type(err).__name__}: {err}"[:5000])
        return None
    # A finished run's summary prints the path; a failed or retried one's is worth saying now.
    log.log(logging.INFO if why else logging.DEBUG, "run report%s: %s", f" ({why})" if why else "", path)
    return path


def run_local(pipeline: Pipeline, values: Mapping[str, Any], run_id: str | None = None) -> RunContext:
    """Run every node in this process, in definition order."""
    context = start(pipeline, values, run_id)
    results: dict[str, dict[str, str]] = {}
    for node in pipeline.nodes:
        results[node.id] = execute_node(pipeline, node.id, context, results).outputs
    finish(context)
    return context
