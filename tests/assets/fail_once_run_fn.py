"""The penguin run_fn, except that its first try fails as a lost worker would (a RuntimeError, which is worth a
retry): for the Airflow retry test. The marker lives in the run-scoped working dir, which survives the retry."""
import os

from hpml.examples.penguin import module as penguin_module


def run_fn(fn_args):
    marker = os.path.join(fn_args.working_dir, "failed-once")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("worker lost (simulated)")
    penguin_module.run_fn(fn_args)
