"""Trainer executor: plan the strategy, build FnArgs from artifact URIs, run the user's run_fn
in this process or through a launcher, and check the exported model."""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from typing import Any
from collections.abc import Mapping

from hpml.components import artifacts, files, publishing, staging
from hpml.components.errors import SpecError
from hpml.components.s3_files import is_s3
from hpml.components.trainer import backup_mirror, time_breakdown
from hpml.components.trainer.resume import BACKUP_DIR
from hpml.components.trainer import plan as plan_mod
from hpml.components.trainer.callbacks import close_terminal_progress, read_metrics
from hpml.components.trainer.distill import mode as distill_mode
from hpml.components.input_pipeline import read_ahead, read_spec
from hpml.components.input_pipeline.shards import explain_read_error
from hpml.components.trainer.input_stall import STALL_FILE
from hpml.components.trainer.fn_args import (FnArgs, for_epochs, input_pipeline_data_accessor, tfxio_data_accessor,
                                             training_epochs)
from hpml.components.trainer.launchers import remote, s3_job
from hpml.components.trainer.launchers.cluster_job import REMOTE_LAUNCHERS
from hpml.components.trainer.progress_state import progress_dir, without_unmeasured_recovery, working_dir_for
from hpml.components.trainer.step_tuning import TUNED_STEP_FILE
from hpml.components.trainer.strategies import CLUSTER_STRATEGIES
from hpml.components.user_module import load_function
from hpml.components.results import RECORD_KEY
from hpml.components.trainer.record import run_record

log = logging.getLogger("hpml.trainer")


def _model_memory(params) -> plan_mod.ModelMemory | None:
    """The user module's optional `estimate_model_memory(hyperparameters)`."""
    try:
        estimate = load_function(params["module"], "estimate_model_memory")
    except SpecError:
        return None
    return estimate(dict(params["hyperparameters"]))


def make_plan(params) -> plan_mod.Plan:
    requested = params["strategy"]
    if _remote(params):
        cluster = plan_mod.ClusterInfo(workers=params["num_workers"], ps=params["num_ps"])
        requested = remote.strategy_for(requested, params["num_ps"])
    elif params["num_workers"] > 1 or params["num_ps"] > 0:
        cluster = plan_mod.ClusterInfo(workers=params["num_workers"], ps=params["num_ps"])
    else:
        cluster = plan_mod.discover_cluster()
    plan = plan_mod.decide(plan_mod.discover_inventory(), cluster, _model_memory(params), requested)
    if _remote(params):
        plan.reasons.append(f"a {params['launcher']} job of {params['num_workers']} worker(s) and "
                            f"{params['num_ps']} parameter server(s)")
    log.info("strategy plan: %s", plan.explain())
    return plan


def _remote(params) -> bool:
    return params["launcher"] in REMOTE_LAUNCHERS


def _check_inputs(examples: str, splits: list[str]) -> list[str]:
    patterns = []
    for split in splits:
        pattern = artifacts.transformed_examples_file_pattern(examples, split)
        if not files.isdir(os.path.dirname(pattern)):
            raise SpecError(f"Trainer: {os.path.dirname(pattern)} does not exist",
                            hint=f"splits present: {', '.join(artifacts.list_splits(examples))}")
        artifacts.require_files(pattern, "Trainer examples")
        patterns.append(pattern)
    return patterns


def run(inputs: Mapping[str, Any], outputs: Mapping[str, str], params: Mapping[str, Any]) -> dict:
    load_function(params["module"], params["run_fn"])  # fail fast on a bad module
    train_files = _check_inputs(inputs["examples"], params["train_splits"])
    eval_files = _check_inputs(inputs["examples"], params["eval_splits"])
    distillation = distill_mode.plan(inputs["examples"], inputs.get("teachers"), params)
    cluster = _checked_cluster(params, staging.published_uri(outputs["model"]))
    plan = make_plan(params)
    distributed = params["num_workers"] > 1 or params["num_ps"] > 0
    if distributed and params["launcher"] == "local" and plan.strategy not in CLUSTER_STRATEGIES:
        raise SpecError(f"num_workers={params['num_workers']}, num_ps={params['num_ps']} needs strategy "
                        f"multi_worker_mirrored or parameter_server, not {plan.strategy}")

    skipped_shards: dict[str, str] = {}
    spec = read_spec(inputs["input_pipeline"]) if inputs.get("input_pipeline") else None
    input_cache = _input_cache(spec, params)
    if input_cache:
        log.info("input pipeline cache: %s", input_cache)
    epochs = params["hyperparameters"].get("epochs")
    data_accessor = (input_pipeline_data_accessor(spec, skipped_shards, epochs, training_epochs(
        epochs, params["train_steps"], plan.strategy)) if spec else tfxio_data_accessor())
    # Run-scoped, where the model is published: on s3:// the backups and live progress outlive this machine.
    working_dir = working_dir_for(staging.published_uri(outputs["model"]))
    files.makedirs(working_dir)
    with backup_mirror.claimed(working_dir):
        backup_mirror.restore(working_dir, BACKUP_DIR)
        with publishing.publish(outputs["model"]) as model_dir, publishing.publish(outputs["model_run"]) as run_dir:
            fn_args = FnArgs(
                working_dir=working_dir,
                train_files=train_files,
                eval_files=eval_files,
                train_steps=params["train_steps"] or None,
                eval_steps=params["eval_steps"] or None,
                schema_path=artifacts.schema_path(inputs["schema"]) if inputs.get("schema") else None,
                transform_graph_path=inputs.get("transform_graph"),
                data_accessor=data_accessor,
                serving_model_dir=artifacts.serving_model_path(model_dir),
                eval_model_dir=os.path.join(model_dir, "Format-TFMA"),
                model_run_dir=run_dir,
                base_model=inputs.get("base_model"),
                hyperparameters=dict(params["hyperparameters"]),
                custom_config=dict(params["custom_config"], strategy=plan.strategy, plan=plan.to_dict(),
                                   backup_save_freq=params["backup_save_freq"],
                                   input_pipeline_dir=inputs.get("input_pipeline"),
                                   **({distill_mode.CONFIG_KEY: distillation.to_dict()} if distillation else {})),
            )
            started_at = time.time()
            launch = _train(fn_args, params, plan, cluster, distributed, outputs["model"], spec)
            ended_at = time.time()
            files.write_text(os.path.join(run_dir, artifacts.PLAN_FILE), json.dumps(plan.to_dict(), indent=2))
            result = _read_results(run_dir, working_dir)
            if cluster is None:  # fit's window is on this machine's clock
                result["time_breakdown"] = time_breakdown.breakdown(
                    started_at, ended_at, _read_json(os.path.join(run_dir, artifacts.FIT_WINDOW_FILE)),
                    result["history"], result["tuned_step"], result["input_stall"])
        files.rmtree(working_dir)
        backup_mirror.remove(working_dir)
    result.update(plan=plan.to_dict(), launch=launch, skipped_shards=sorted(skipped_shards), input_cache=input_cache,
                  distillation=distillation.to_dict() if distillation else None)
    return {**result, RECORD_KEY: run_record(result).to_json()}


def _checked_cluster(params: Mapping[str, Any], model_uri: str) -> remote.RemoteCluster | None:
    """The remote cluster a remote launcher submits to, checked before any work: None for launcher local."""
    if not _remote(params):
        return None
    cluster = remote.RemoteCluster.from_params(params["launcher"], params["cluster"])
    remote.check_reachable(params["launcher"], cluster, working_dir_for(model_uri))
    return cluster


def _train(fn_args: FnArgs, params: Mapping[str, Any], plan, cluster, distributed: bool, model_uri: str,
           spec) -> dict | None:
    """Train: on the remote cluster, in local worker processes, or in this process. Returns the launch report of
    a job of workers (None in process); a run_fn that wrote no model is an error."""
    launch = None
    try:
        if cluster is not None:
            launch = _launch_remote(fn_args, params, plan, cluster, model_uri)
        elif distributed:
            launch = _launch_local(fn_args, params, plan)
        else:
            _run_in_process(load_function(params["module"], params["run_fn"]), fn_args,
                            spec.compression if spec else "GZIP")
    except BaseException as err:
        # The epochs that finished, for the run record: this model_run is never published.
        try:
            err.partial_history = read_metrics(fn_args.model_run_dir)  # type: ignore[attr-defined]
        except (OSError, ValueError) as unreadable:  # e.g. a line cut short by a killed worker
            log.warning("the finished epochs' metrics could not be read: %s", unreadable)
        raise
    files.rmtree(artifacts.serving_staging_path(fn_args.serving_model_dir))  # staged by a run_fn that never published
    if not files.isdir(fn_args.serving_model_dir):
        raise SpecError(
            f"run_fn finished but wrote no model to serving_model_dir ({fn_args.serving_model_dir})",
            hint="run_fn must save a SavedModel to fn_args.serving_model_dir",
        )
    return launch


def _read_results(run_dir: str, working_dir: str) -> dict:
    """What the workers left in model_run: per-epoch history, eval, the GPipe record, the input stall, the step."""
    input_stall = _read_json(os.path.join(run_dir, STALL_FILE))
    if input_stall is None:  # measured before an Airflow retry, whose model_run starts empty
        input_stall = _read_json(os.path.join(progress_dir(working_dir), STALL_FILE))
        if input_stall is not None:
            files.write_text(os.path.join(run_dir, STALL_FILE), json.dumps(input_stall, indent=2))
    return {"history": read_metrics(run_dir),
            "eval_metrics": _read_json(os.path.join(run_dir, artifacts.EVAL_METRICS_FILE)) or {},
            "gpipe": _read_json(os.path.join(run_dir, artifacts.GPIPE_RECORD_FILE)),
            "input_stall": input_stall,
            "tuned_step": _read_json(os.path.join(run_dir, TUNED_STEP_FILE))}


def _input_cache(spec, params) -> str | None:
    """The cache the training data went through, where it is not the one Transform tuned (see `for_epochs`)."""
    if spec is None:
        return None
    used = for_epochs(spec, params["hyperparameters"].get("epochs")).cache
    return None if used == spec.cache else f"{used} (one epoch reads the data once; tuned: {spec.cache})"


def _run_in_process(run_fn, fn_args: FnArgs, compression: str) -> None:
    """Call run_fn; a tf.data read failure comes back naming the corrupt shard, when one is."""
    import gc

    import tensorflow as tf

    # What the process holds already (in `hpml run`, Beam's and Transform's objects) is set aside from the garbage
    # collector while run_fn runs: tracing the training step allocates enough to start full collections, each of
    # which scanned all of it (the trace took 1.5 s instead of 0.8 s at 1M rows). Not collected first: that cost
    # 0.5 s, and refcounting still frees what is set aside. A process that set objects aside itself is left alone.
    freezing = gc.get_freeze_count() == 0
    if freezing:
        gc.freeze()
    try:
        run_fn(fn_args)
    except tf.errors.OpError as err:
        named = read_ahead.failure() or _corrupt_shards(fn_args, compression, err)
        if named is None:
            raise
        raise named from err
    finally:
        if freezing:
            gc.unfreeze()
        close_terminal_progress()  # before the error is printed
        read_ahead.release()


def _corrupt_shards(fn_args: FnArgs, compression: str, err) -> BaseException | None:
    """After a read failure, an error naming the corrupt shards, if any are (an s3:// shard by its URL, checked
    in the copy this process read)."""
    import tensorflow as tf

    if not isinstance(err, (tf.errors.DataLossError, tf.errors.InvalidArgumentError)):
        return None
    shards = sorted({path for pattern in [*fn_args.train_files, *fn_args.eval_files] for path in files.glob(pattern)})
    copies = {read_ahead.copy_of(path) or path: path for path in shards}
    return explain_read_error([path for path in copies if not is_s3(path)], compression, err, names=copies)


def _read_json(path: str):
    """A JSON file the run_fn may have written, or None."""
    if not files.exists(path):
        return None
    return json.loads(files.read_text(path))


def _write_job(fn_args: FnArgs, params, plan) -> str:
    """The job file every worker process reads: module, run_fn, strategy and the FnArgs fields."""
    fields = {k: v for k, v in asdict(fn_args).items() if k != "data_accessor"}
    job = {"module": params["module"], "run_fn": params["run_fn"], "strategy": plan.strategy, "fn_args": fields}
    job_path = os.path.join(fn_args.working_dir, "job.json")
    files.write_text(job_path, json.dumps(job))
    return job_path


def _launch_remote(fn_args: FnArgs, params, plan, cluster: remote.RemoteCluster, model_uri: str) -> dict:
    """Run the workers as a TFJob or a Vertex AI CustomJob; they read the job file from shared storage."""
    from hpml.components.trainer.launchers.cluster_job import ClusterJob

    # Over s3:// artifacts the workers download their inputs and upload the chief's outputs themselves.
    job_args = s3_job.job_fn_args(fn_args) if staging.active() else fn_args
    job = ClusterJob(name=remote.job_name(model_uri), image=cluster.image, job_uri=_write_job(job_args, params, plan),
                     strategy=plan.strategy, num_workers=params["num_workers"], num_ps=params["num_ps"],
                     gpus_per_worker=cluster.gpus_per_worker, cpu=cluster.cpu, memory=cluster.memory,
                     max_restarts=params["max_restarts"])
    report = remote.launch(params["launcher"], cluster, job, fn_args.working_dir, progress_dir(fn_args.working_dir),
                           params["max_restarts"])
    log.info("remote job finished: %s", report)
    if staging.active():
        s3_job.fetch_outputs(fn_args.working_dir, os.path.dirname(fn_args.serving_model_dir), fn_args.model_run_dir)
    return report


def _launch_local(fn_args: FnArgs, params, plan) -> dict:
    from hpml.components.trainer.launchers.local import LocalLauncher

    job_path = _write_job(fn_args, params, plan)
    launcher = LocalLauncher(params["num_workers"], params["num_ps"], params["max_restarts"])
    report = without_unmeasured_recovery(launcher.run(job_path, progress_dir(fn_args.working_dir)).to_dict())
    log.info("launch report: %s", report)
    return report
