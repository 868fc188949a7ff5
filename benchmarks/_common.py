"""Helpers shared by the benchmark scripts: medians of repeated runs, result files, peak RSS, phase timing."""
from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def median(values):
    return statistics.median(values) if values else float("nan")


def machine() -> dict:
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


def peak_rss_mib() -> float:
    """This process's peak resident memory, from Linux's VmHWM where there is one.

    Not getrusage's ru_maxrss: Linux carries it across fork and exec, so a benchmark child
    would report at least its parent's resident size at the time it was started.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_hpml(pipeline_dir: str, csv: str, home: str, **env: str) -> float:
    """`hpml run` of a pipeline on the CSV (one epoch at batch_size 1024) with its state in `home`; its wall
    seconds. The cache (the tuned step, local copies of s3:// objects) starts empty in `home`."""
    import subprocess
    import sys

    env = {**os.environ, "HPML_HOME": home, "HPML_DATA_ROOTS": os.path.dirname(csv), "TF_CPP_MIN_LOG_LEVEL": "2",
           "XDG_CACHE_HOME": os.path.join(home, "cache"), **env}
    started = time.perf_counter()
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "hpml"), "run", pipeline_dir,
                           "--param", "epochs=1", "--param", "batch_size=1024", "--param", f"data_path={csv}"],
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"hpml run failed:\n{done.stderr[-3000:]}")
    return seconds


def write_results(name: str, data: dict, table: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, sort_keys=True))
    (RESULTS / f"{name}.md").write_text(table)
    print(table)


class PhaseTimer:
    """Seconds spent inside named functions, summed over their calls: `timer.wrap(name, function)` returns the
    function timed into `timer.spent[name]`."""

    def __init__(self):
        self.spent: dict[str, float] = {}

    def wrap(self, name: str, function):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - started
        return timed


def time_transform_phases(plot: bool = False) -> PhaseTimer:
    """From now on in this process, hpml's Transform times its Beam pipeline ("beam") and its input-pipeline tuning
    ("tuning"), and with `plot` the stage plot drawn while tuning ("plot"); the rest of a run builds the graph."""
    from hpml.components.input_pipeline import stages
    from hpml.components.transform import executor, tuning

    timer = PhaseTimer()
    executor.run_pipeline = timer.wrap("beam", executor.run_pipeline)
    executor.tuning.write_input_pipeline = timer.wrap("tuning", tuning.write_input_pipeline)
    if plot:
        stages.plot_stages = timer.wrap("plot", stages.plot_stages)
    return timer
