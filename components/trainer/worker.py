"""Entry point of one Trainer process in a cluster: `python -m hpml.components.trainer.worker JOB.json`.

Parameter servers (and workers under ParameterServerStrategy) serve until stopped; the
chief/coordinator and MultiWorkerMirrored workers call the user's run_fn. Non-chief workers
save into their own scratch dirs, as MultiWorkerMirrored requires every worker to save.
"""
from __future__ import annotations

import json
import os
import sys


def _serve(config: dict) -> None:
    import tensorflow as tf

    task = config["task"]
    server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name=task["type"],
                                  task_index=task["index"], protocol="grpc", start=True)
    server.join()


def main(job_path: str) -> int:
    import logging

    from hpml.components.trainer.launchers.stopping import die_with_launcher

    die_with_launcher()  # first: TensorFlow's import alone takes seconds

    logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
    from hpml.components.native_logs import VERBOSE_ENV, start_tensorflow

    start_tensorflow(verbose=os.environ.get(VERBOSE_ENV) == "1")  # without its native start-up lines
    from hpml.components import files

    job = json.loads(files.read_text(job_path))  # on Vertex AI or a shared artifact root: gs://
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    if task.get("type") == "ps" or (task.get("type") == "worker" and job["strategy"] == "parameter_server"):
        _serve(config)
        return 0

    from hpml.components.input_pipeline import read_ahead
    from hpml.components.trainer.backup_mirror import claimed, local_working_dir, restore
    from hpml.components.trainer.fn_args import FnArgs, make_data_accessor
    from hpml.components.trainer.launchers import s3_job
    from hpml.components.trainer.resume import BACKUP_DIR
    from hpml.components.trainer.strategies import is_chief, make_strategy

    make_strategy(job["strategy"])  # before any other TF op: collective ops are configured at startup
    from hpml.components.user_module import load_function

    fields = dict(job["fn_args"])
    if not is_chief():
        scratch = os.path.join(local_working_dir(fields["working_dir"]), f"{task['type']}-{task['index']}")
        fields["serving_model_dir"] = os.path.join(scratch, "serving")
        fields["model_run_dir"] = os.path.join(scratch, "model_run")
        fields["eval_model_dir"] = os.path.join(scratch, "eval")
        files.makedirs(fields["model_run_dir"])
        # working_dir stays shared: every worker's BackupAndRestore must see the chief's backup.
    # A remote job over s3:// artifacts: inputs copied to this machine, the chief's outputs uploaded after run_fn.
    fields, uploads = s3_job.localized(fields, os.path.join(local_working_dir(fields["working_dir"]), "outputs"))
    accessor = make_data_accessor(fields["custom_config"].get("input_pipeline_dir"), strategy=job["strategy"],
                                  epochs=fields["hyperparameters"].get("epochs"), train_steps=fields["train_steps"])
    fn_args = FnArgs(**fields, data_accessor=accessor)
    with claimed(fields["working_dir"]):
        restore(fields["working_dir"], BACKUP_DIR)  # over s3://, a job submitted again resumes from the store's backup
        try:
            load_function(job["module"], job["run_fn"])(fn_args)
        except Exception as err:  # a shard's download failed: tf.data passes it on as a bare op error
            failed = read_ahead.failure()
            if failed is None or failed is err:
                raise
            raise failed from err
    s3_job.upload(uploads)
    return 0


if __name__ == "__main__":
    from hpml.components.errors import USER_ERROR_EXIT, InputDataError, SpecError, TrainingDiverged

    try:
        sys.exit(main(sys.argv[1]))
    except (InputDataError, SpecError, TrainingDiverged) as err:
        # Bad data or parameters, and a divergence, fail every attempt alike: a distinct status keeps the
        # launcher from restarting the cluster for them. The traceback ends in the usual exception line, then
        # the hint.
        import traceback

        traceback.print_exc()
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
