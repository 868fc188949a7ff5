"""The Airflow adapter: one DAG per pipeline definition, one task per component.

`start_run` validates the trigger form's parameters before any work and opens the run
record; each component task runs its node via the shared runner; artifact URIs travel
between tasks as XCom; `finish_run` closes the record. Tasks never touch Airflow's DB.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timedelta, UTC
from typing import Any

from airflow.sdk import DAG, Asset, Param, task
from airflow.sdk.exceptions import AirflowFailException

from hpml.components.errors import HpmlError, SpecError
from hpml.components.native_logs import VERBOSE_ENV, quiet_libraries, start_tensorflow
from hpml.components.trainer.launchers.stopping import Stopped
from hpml.pipelines import runner
from hpml.pipelines.dsl import Pipeline


def airflow_params(schema: Mapping[str, Any]) -> dict[str, Param]:
    """Airflow Params from the pipeline's JSON schema: the UI builds its trigger form from these."""
    out = {}
    for name, prop in schema["properties"].items():
        extra = {k: v for k, v in prop.items() if k != "default"}
        out[name] = Param(prop.get("default"), **extra)
    return out


def model_asset(pipeline: Pipeline) -> Asset:
    return Asset(name=f"{pipeline.name}.model", uri=f"hpml://{pipeline.name}/Trainer/model")


def _doc(pipeline: Pipeline) -> str:
    rows = "\n".join(
        f"| `{name}` | {prop.get('title', name)} | {prop.get('description', '')} | `{prop.get('default')}` |"
        for name, prop in pipeline.params_schema["properties"].items()
    )
    steps = " → ".join(node.id for node in pipeline.nodes)
    return (
        f"# {pipeline.name}\n\n{pipeline.description}\n\n**Steps:** {steps}\n\n"
        "Artifacts go to `<HPML_ARTIFACT_ROOT>/<pipeline>/<run_id>/<Component>/<output>/`; "
        "the run is recorded in MLflow (`hpml runs`).\n\n"
        f"| Parameter | Title | Meaning | Default |\n|---|---|---|---|\n{rows}\n"
    )


def _schedule(default: str | None) -> str | None:
    """HPML_SCHEDULE overrides every DAG's schedule (`none`: manual runs only), e.g. for UI tests."""
    value = os.environ.get("HPML_SCHEDULE")
    if value is None:
        return default
    return None if value.lower() in ("", "none") else value


def _task_retries() -> dict:
    """HPML_TASK_RETRIES (a whole number) gives every component task that many retries, HPML_TASK_RETRY_DELAY_S
    seconds apart (default 60). Unset, Airflow's own setting applies; `dag.test`, which `hpml run --engine
    airflow` uses, gives every task Airflow's class default of none whatever `default_task_retries` says."""
    retries, delay = os.environ.get("HPML_TASK_RETRIES"), os.environ.get("HPML_TASK_RETRY_DELAY_S", "60")
    if retries is None:
        return {}
    if not retries.strip().isdigit():
        raise SpecError(f"HPML_TASK_RETRIES must be a whole number of at least 0, not {retries!r}")
    try:
        seconds = float(delay)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise SpecError(f"HPML_TASK_RETRY_DELAY_S must be a number of seconds of at least 0, not {delay!r}")
    return {"retries": int(retries), "retry_delay": timedelta(seconds=seconds)}


def build_dag(pipeline: Pipeline, schedule: str | None = "@daily") -> DAG:
    asset = model_asset(pipeline)
    retries = _task_retries()
    with DAG(
        dag_id=pipeline.name,
        schedule=_schedule(schedule),
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        params=airflow_params(pipeline.params_schema),
        doc_md=_doc(pipeline),
        tags=["hpml"],
        max_active_runs=4,
    ) as dag:

        @task(task_id="start_run")
        def start_run(params=None, dag_run=None):
            return _start_run(pipeline, dict(params), dag_run)

        started = start_run()
        results: dict[str, Any] = {}  # node id -> its task's XComArg
        for node in pipeline.nodes:
            produces_model = "model" in node.component.outputs

            @task(task_id=node.id, outlets=[asset] if produces_model else [], **retries)
            def run_node(context: dict, upstream: dict, node_id: str = node.id, outlet_events=None):
                return _run_node(pipeline, node_id, context, upstream, outlet_events, asset)

            # TaskFlow: a task is called with XComArgs where its function takes their values
            results[node.id] = run_node(started, {src: results[src] for src in node.upstream})  # type: ignore[arg-type]

        @task(task_id="finish_run")
        def finish_run(context: dict, _outputs: list):
            runner.finish(runner.RunContext(**context))
            return context["mlflow_run_id"]

        finish_run(started, list(results.values()))  # type: ignore[arg-type]
    return dag


def _start_run(pipeline: Pipeline, params: dict, dag_run) -> dict:
    """The start_run task: refuse a run id Airflow cannot pass results under, then open the run record."""
    if dag_run.run_id.strip(".") == "":
        # Airflow's execution API puts the run id in its URL paths, where '.' is a path segment that
        # HTTP clients drop: this task could not hand its result on, and the run would never end.
        raise AirflowFailException(
            f"run id {dag_run.run_id!r} cannot be used: Airflow cannot pass results between the tasks of a "
            "run with this id. Trigger the run again with another run id (or none, for Airflow's own)")
    context = runner.start(pipeline, params, run_id=dag_run.run_id,
                           tags={"airflow.dag_id": dag_run.dag_id, "airflow.run_id": dag_run.run_id})
    return context.to_dict()


def _run_node(pipeline: Pipeline, node_id: str, context: dict, upstream: dict, outlet_events, asset) -> dict:
    """A component's task: run the node, and tell Airflow's asset of a new model."""
    # TensorFlow's native start-up lines (an error-level "failed call to cuInit" on every CPU machine) and the
    # libraries' info lines would bury hpml's own in the task's log, as `hpml run` keeps them out of the terminal
    # (HPML_VERBOSE=1 keeps them).
    verbose = os.environ.get(VERBOSE_ENV) == "1"
    if not verbose:
        quiet_libraries()
    start_tensorflow(verbose=verbose)
    try:
        result = runner.execute_node(pipeline, node_id, runner.RunContext(**context), upstream)
    except Stopped:  # SIGTERM: Airflow decides, as for any task it stops (a worker shutting down)
        raise
    except (HpmlError, KeyboardInterrupt) as err:
        # Bad input or parameters fail every try the same way, and a retry would undo a Ctrl-C: no retries for
        # these. Other errors (a lost worker, a full disk) keep the task's retries.
        raise AirflowFailException(f"{node_id}: {type(err).__name__}: {err}") from err
    if outlet_events is not None and "model" in result.outputs:
        outlet_events[asset].extra = {"uri": result.outputs["model"], "run_id": context["run_id"]}
    return result.outputs
