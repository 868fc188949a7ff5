"""The training step, tuned by hpml against Keras's defaults, Keras's own steps_per_execution="auto", and the best
point of an exhaustive grid over the same knobs, side by side in one run (medians of N).

Three models, each trained on 200k rows x 16 floats in memory, batch 256:
- penguin-size: the MLP `hpml init` writes (hidden 16-8), here on 16 float inputs, 2 classes;
- B3's consumer: the input-pipeline benchmark's MLP 16-256-256-2;
- wide: an MLP 16-1024-1024-2.

Variants, each a fresh model (same seed) timed over fit's epoch of a fixed number of steps after one untimed call,
interleaved
repeat by repeat: `keras default` (one step per call, no XLA, float32), `keras auto` (tf_keras's
steps_per_execution tuner), `hpml tuned` (tune_step, measured afresh each repeat; its measuring time is reported
beside it), and every grid point: steps_per_execution 1..64 x XLA off/on x float32/mixed_bfloat16 (where the CPU
has bfloat16 instructions).

The cost of measuring is also taken where it is judged: `hpml run penguin` with 10 epochs (the Trainer's duration
and its `step_tuning_seconds`, with an empty tuned-step cache).

    python benchmarks/trainer_step.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
import tf_keras

from benchmarks._common import machine, median, write_results
from hpml.components.trainer import step_tuning

ROWS, FEATURES, BATCH = 200_000, 16, 256
EPOCH = ROWS // BATCH
MODELS = {  # name: (hidden widths, steps timed): two epochs for the penguin-size model (the protocol; its
    # fastest points then run for about half a second, not a noise-sized 0.2 s), one for B3's, 64 steps for the wide
    "penguin-size MLP (16-8)": ((16, 8), 2 * EPOCH), "B3 consumer MLP (256-256)": ((256, 256), EPOCH),
    "wide MLP (1024-1024)": ((1024, 1024), 64)}
SPE = (1, 2, 4, 8, 16, 32, 64)


def _data():
    x = np.random.default_rng(0).normal(size=(ROWS, FEATURES)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int64")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).cache().repeat()


def _model(hidden, steps_per_execution=1, jit_compile=False, precision="float32"):
    tf_keras.utils.set_random_seed(7)
    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(precision)
    try:
        layers = [tf_keras.Input((FEATURES,))] + [tf_keras.layers.Dense(w, activation="relu") for w in hidden]
        model = tf_keras.Sequential(layers + [tf_keras.layers.Dense(2, activation="softmax", dtype="float32")])
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)
    model.compile(tf_keras.optimizers.Adam(0.001), "sparse_categorical_crossentropy", ["accuracy"],
                  steps_per_execution=steps_per_execution, jit_compile=jit_compile)
    return model


class _EpochClock(tf_keras.callbacks.Callback):
    """The seconds of fit's epoch, from its first step to its last: not fit's set-up, nor its teardown. Timed whole,
    fits of about a second came out in multiples of ~0.63 s on this project's machines, as if the teardown waited
    for a periodic wake-up (tf.data's autotuning thread is the likely one; not confirmed)."""

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds = time.perf_counter() - self.started


def _throughput(model, data, steps: int) -> float:
    """Examples/s of `fit`'s epoch of `steps` steps, after an untimed fit of one call (tracing, compiling)."""
    model.fit(data, epochs=1, steps_per_epoch=model._steps_per_execution.numpy().item(), verbose=0)
    clock = _EpochClock()
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock])
    return steps * BATCH / clock.seconds


def _policy() -> str:
    """The global policy the tuner set around its rebuild (the builder here sets one itself)."""
    return tf_keras.mixed_precision.global_policy().name


def _confirm(data, device, picks: dict, repeats: int) -> dict:
    """The grid's best point and hpml's tuned step, measured again side by side: the best of 28 noisy medians is
    biased upward (its noise was picked along with it), so the ratio is taken from fresh runs of both."""
    out = {name: {"grid best": [], "hpml tuned": []} for name in MODELS}
    for _ in range(repeats):
        for name, (hidden, steps) in MODELS.items():
            spe, jit, precision = picks[name]
            out[name]["grid best"].append(_throughput(_model(hidden, spe, jit, precision), data, steps))
            model, _ = step_tuning.tune_step(_model(hidden), data, batch_size=BATCH, total_steps=10 * ROWS // BATCH,
                                             rebuild=lambda hidden=hidden: _model(hidden, precision=_policy()),
                                             device=device)
            out[name]["hpml tuned"].append(_throughput(model, data, steps))
            tf_keras.backend.clear_session()
    return {name: {k: median(v) for k, v in runs.items()} for name, runs in out.items()}


def _grid(device) -> list[tuple[int, bool, str]]:
    precisions = ["float32"] + step_tuning.candidate_precisions(device)[0]
    return [(spe, jit, precision) for precision in precisions for jit in (False, True) for spe in SPE]


def _one_repeat(data, device) -> dict:
    runs = {}
    for name, (hidden, steps) in MODELS.items():
        row = {"keras default": _throughput(_model(hidden), data, steps),
               "keras auto": _throughput(_model(hidden, steps_per_execution="auto"), data, steps)}
        model = _model(hidden)
        model, tuning = step_tuning.tune_step(model, data, batch_size=BATCH, total_steps=10 * ROWS // BATCH,
                                              rebuild=lambda hidden=hidden: _model(hidden, precision=_policy()),
                                              device=device)
        row["hpml tuned"] = _throughput(model, data, steps)
        row["hpml tuning s"] = tuning.seconds
        row["hpml choice"] = tuning.choice.describe()
        row["hpml reasons"] = tuning.reasons
        for spe, jit, precision in _grid(device):
            row[f"grid {spe} {'xla' if jit else 'noxla'} {precision}"] = _throughput(
                _model(hidden, spe, jit, precision), data, steps)
        runs[name] = row
        tf_keras.backend.clear_session()
    return runs


def _penguin_tuning_cost(tmp: str) -> dict:
    """`hpml run penguin`, 10 epochs, with an empty tuned-step cache: the Trainer's seconds and the tuner's."""
    env = {**os.environ, "HPML_HOME": os.path.join(tmp, "home"), "XDG_CACHE_HOME": os.path.join(tmp, "cache")}
    hpml = os.path.join(os.path.dirname(sys.executable), "hpml")
    done = subprocess.run([hpml, "run", "penguin", "--param", "epochs=10"], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    code = ("from hpml.pipelines import records; s = records.load(records.recent('penguin', 1)[0].info.run_id); "
            "import json; m = records.client().get_run(s.mlflow_run_id).data.metrics; "
            "import os; t = json.load(open(os.path.join(s.outputs['Trainer']['model_run'], 'tuned_step.json'))); "
            "print(json.dumps({'trainer_s': s.durations['Trainer'], 'tuning_s': t['seconds'], "
            "'trace_s': t['trace_s']}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--note", default="", help="a line on how this run was made, printed in the results")
    args = parser.parse_args()
    device = step_tuning.this_device()
    data = _data()
    runs = [_one_repeat(data, device) for _ in range(args.repeats)]
    results = {"machine": machine(), "device": device.describe(), "repeats": args.repeats, "models": {},
               "note": args.note, "steps timed": {name: steps for name, (_, steps) in MODELS.items()}}
    for name in MODELS:
        keys = [k for k in runs[0][name] if k not in ("hpml choice", "hpml reasons")]
        stats = {k: median([run[name][k] for run in runs]) for k in keys}
        grid = {k: v for k, v in stats.items() if k.startswith("grid ")}
        best = max(grid, key=grid.get)
        results["models"][name] = {**stats, "grid best": best,
                                   "hpml choices": [run[name]["hpml choice"] for run in runs],
                                   "hpml reasons": runs[-1][name]["hpml reasons"]}
    picks = {}
    for name in MODELS:
        spe, jit, precision = results["models"][name]["grid best"].split()[1:]
        picks[name] = (int(spe), jit == "xla", precision)
    for name, confirmed in _confirm(data, device, picks, args.repeats).items():
        results["models"][name]["confirmed"] = confirmed
    with tempfile.TemporaryDirectory() as tmp:
        results["penguin"] = [_penguin_tuning_cost(tmp + str(i)) for i in range(min(args.repeats, 3))]
    write_results("trainer_step", results, render(results))


def _steps_timed(data: dict) -> str:
    steps = data.get("steps timed")
    return f" ({', '.join(f'{name}: {n}' for name, n in steps.items())} steps)" if steps else ""


def render(data: dict) -> str:
    m = data["machine"]
    lines = ["# The tuned training step", "",
             f"Machine: {m['cpus']} cores, {m['platform']}, Python {m['python']}, {m['date']}; device: "
             f"{data['device']}. Medians of {data['repeats']} repeats, every variant a fresh model trained on the same "
             f"200k x 16 in-memory rows (batch {BATCH}), timed over fit's epoch of the same steps (not fit's set-up "
             "and teardown) after one untimed call" + _steps_timed(data) + ".",
             *(["", f"**{data['note']}**"] if data.get("note") else []), "",
             "| model | Keras default ex/s | Keras auto | hpml tuned | grid best | tuned / grid best (confirmed) | "
             "tuned / default | hpml's choices | measuring s |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in data["models"].items():
        best = s[s["grid best"]]
        choices = sorted(set(s["hpml choices"]))
        confirmed = s["confirmed"]
        lines.append(f"| {name} | {s['keras default']:,.0f} | {s['keras auto']:,.0f} | {s['hpml tuned']:,.0f} | "
                     f"{best:,.0f} ({s['grid best'][5:]}) | {s['hpml tuned'] / best:.2f}x "
                     f"({confirmed['hpml tuned'] / confirmed['grid best']:.2f}x) | "
                     f"{s['hpml tuned'] / s['keras default']:.2f}x | {'; '.join(choices)} | "
                     f"{s['hpml tuning s']:.1f} |")
    lines += ["", "Confirmed: the grid's best point and the tuned step measured again, side by side, in "
                  f"{data['repeats']} fresh repeats (the best of 28 noisy medians carries its own noise)."]
    lines += ["", "Why the tuner chose what it chose (last repeat):", ""]
    for name, s in data["models"].items():
        lines.append(f"- {name}: " + "; ".join(f"{k}: {v}" for k, v in s["hpml reasons"].items()))
    penguin = data.get("penguin") or []
    if penguin:
        shares = [p["tuning_s"] / p["trainer_s"] for p in penguin]
        if all("trace_s" in p for p in penguin):
            extra = [(p["tuning_s"] - p["trace_s"]) / p["trainer_s"] for p in penguin]
            lines += ["", f"Measuring in `hpml run penguin` (10 epochs, empty cache), {len(penguin)} runs: "
                          + ", ".join(f"{p['tuning_s']:.2f} s ({p['trace_s']:.2f} s of it tracing the step, which "
                                      f"training reuses) of a {p['trainer_s']:.1f} s Trainer" for p in penguin)
                          + f"; median share {median(shares):.1%}, or {median(extra):.1%} without the trace that "
                            "training would have done anyway."]
        else:  # a run from before the record said how much of the measuring was the trace
            lines += ["", f"Measuring in `hpml run penguin` (10 epochs, empty cache), {len(penguin)} runs: "
                          + ", ".join(f"{p['tuning_s']:.2f} s of a {p['trainer_s']:.1f} s Trainer" for p in penguin)
                          + f"; median share {median(shares):.1%}."]
    lines += ["", "Grid: examples/s per point (steps_per_execution, XLA, precision).", ""]
    for name, s in data["models"].items():
        grid = {k[5:]: v for k, v in s.items() if k.startswith("grid ") and k != "grid best"}
        lines.append(f"- {name}: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(grid.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
