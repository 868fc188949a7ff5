"""Distributed Trainer benchmark, all ratios measured side by side in one run (median of N):

- examples/s with 2 local MultiWorkerMirrored workers over 1 worker (same global batch);
- BackupAndRestore overhead: examples/s with backups every `save_freq` steps over no backups;
- recovery after a SIGKILL: seconds from the failure until training moves again, and steps lost.

    python benchmarks/distributed.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks._common import machine, median, write_results
from hpml.components.trainer.progress_state import read_progress

RUN_FN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_run_fn.py")
SAVE_FREQ = 20


def _trainer(tmp, name, params, config):
    from hpml.components.trainer import executor

    outputs = {"model": os.path.join(tmp, name, "model"), "model_run": os.path.join(tmp, name, "run")}
    full = {"module": RUN_FN, "run_fn": "run_fn", "train_splits": [], "eval_splits": [], "train_steps": 0,
            "eval_steps": 0, "hyperparameters": {}, "custom_config": config, "strategy": "auto",
            "launcher": "local", "num_workers": 1, "num_ps": 0, "max_restarts": 2, "backup_save_freq": "epoch"}
    full.update(params)
    result = executor.run({"examples": tmp}, outputs, full)
    with open(os.path.join(outputs["model_run"], "bench.json")) as handle:
        return json.load(handle), result


def _kill_when_ready(work, killed):
    deadline = time.time() + 300
    while time.time() < deadline:
        progress = read_progress(os.path.join(work, "progress"))
        if progress and progress["step"] >= 2 * SAVE_FREQ + 5:
            pids = json.load(open(os.path.join(work, "pids.json")))
            os.kill(pids["worker-1"], signal.SIGKILL)
            killed.append(progress["step"])
            return
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import hpml.components.trainer.executor as executor

    executor._check_inputs = lambda examples, splits: []  # synthetic data: no example files to check
    rows = {"one_worker": [], "two_workers": [], "backup_off": [], "backup_on": [], "recovery_s": [],
            "steps_lost": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            cfg = {"epochs": 4}
            rows["one_worker"].append(_trainer(tmp, f"one{r}", {"strategy": "one_device"},
                                               dict(cfg, strategy="one_device"))[0]["examples_per_sec"])
            rows["two_workers"].append(_trainer(tmp, f"two{r}", {"num_workers": 2},
                                                dict(cfg, strategy="multi_worker_mirrored"))[0]["examples_per_sec"])
            rows["backup_off"].append(_trainer(tmp, f"off{r}", {"strategy": "one_device"},
                                               dict(cfg, strategy="one_device", backup="off"))[0]["examples_per_sec"])
            rows["backup_on"].append(_trainer(tmp, f"on{r}", {"strategy": "one_device", "backup_save_freq": SAVE_FREQ},
                                              dict(cfg, strategy="one_device", backup="on"))[0]["examples_per_sec"])
            killed: list = []
            name = f"kill{r}"
            threading.Thread(target=_kill_when_ready, args=(os.path.join(tmp, name, "model.work"), killed),
                             daemon=True).start()
            _, result = _trainer(tmp, name, {"num_workers": 2, "backup_save_freq": SAVE_FREQ},
                                 dict(cfg, epochs=6, strategy="multi_worker_mirrored", backup="on"))
            launch = result["launch"]
            rows["recovery_s"].append(launch["recovery_seconds"][0] if launch["recovery_seconds"] else float("nan"))
            rows["steps_lost"].append(launch["steps_lost"])
            print(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{k}={v[-1]:.1f}" for k, v in rows.items()),
                  flush=True)
    med = {k: median(v) for k, v in rows.items()}
    scaling = med["two_workers"] / med["one_worker"]
    overhead = med["backup_on"] / med["backup_off"]
    table = (
        f"| measure (median of {args.repeats}) | value |\n|---|---|\n"
        f"| examples/s, 1 worker (in-process) | {med['one_worker']:.0f} |\n"
        f"| examples/s, 2 MultiWorkerMirrored workers on loopback | {med['two_workers']:.0f} |\n"
        f"| **2 workers / 1 worker** | **{scaling:.2f}x** |\n"
        f"| examples/s with BackupAndRestore every {SAVE_FREQ} steps / without | **{overhead:.2f}x** |\n"
        f"| recovery after SIGKILL of a worker (failure to training moving again) | {med['recovery_s']:.1f} s |\n"
        f"| steps lost per kill (save_freq={SAVE_FREQ}) | {med['steps_lost']:.0f} |\n"
    )
    write_results("distributed", {"machine": machine(), "repeats": args.repeats, "raw": rows, "median": med,
                                  "scaling_2_over_1": scaling, "backup_overhead_ratio": overhead}, table)


if __name__ == "__main__":
    main()
