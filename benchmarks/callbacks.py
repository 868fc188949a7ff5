"""What the Trainer's standard callbacks cost per training step, measured side by side in one run (median of N).

Variants, each a fresh model fitted on the same in-memory batches, interleaved repeat by repeat:
- no callbacks;
- `standard_callbacks` with tf_keras's own TensorBoard callback, as before the change that added ours;
- `standard_callbacks` as the Trainer uses them.

Two models: the penguin pipeline's (371 parameters, batch 32), where a step takes about a millisecond and
any per-step Python shows, and a wider MLP whose step is tens of times longer. Epoch 1 (tracing) is not timed.

    python benchmarks/callbacks.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["HPML_PROGRESS"] = "plain"  # no terminal progress bar: the same callbacks as in logs and CI

import numpy as np
import tensorflow as tf
import tf_keras

from benchmarks._common import machine, median, write_results
from hpml.components.trainer import callbacks as hpml_callbacks

EPOCHS = 4
MODELS = {  # name: (features, hidden widths, batch size, steps per epoch)
    "penguin (371 parameters, batch 32)": (4, (8, 8), 32, 200),
    "MLP 4x512 (batch 256)": (64, (512,) * 4, 256, 40),
}
VARIANTS = ("no callbacks", "tf_keras TensorBoard", "hpml callbacks")


class EpochTimer(tf_keras.callbacks.Callback):
    """Wall time of every epoch after the first, measured around the other callbacks' epoch hooks."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if epoch > 0:
            self.seconds.append(time.perf_counter() - self._start)


def _callbacks(variant: str, tmp: str, batch: int) -> list:
    if variant == "no callbacks":
        return []
    fn_args = types.SimpleNamespace(working_dir=os.path.join(tmp, "work"), model_run_dir=os.path.join(tmp, "run"))
    chosen = hpml_callbacks.standard_callbacks(fn_args, "one_device", batch, EPOCHS)
    if variant == "tf_keras TensorBoard":
        chosen = [tf_keras.callbacks.TensorBoard(fn_args.model_run_dir)
                  if isinstance(c, hpml_callbacks.TensorBoard) else c for c in chosen]
    return chosen


def _examples_per_sec(model_name: str, variant: str) -> float:
    features, widths, batch, steps = MODELS[model_name]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, features)).astype("float32")
    y = rng.integers(0, 3, size=batch * steps)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache().prefetch(4)
    model = tf_keras.Sequential([tf_keras.Input((features,))]
                                + [tf_keras.layers.Dense(w, activation="relu") for w in widths]
                                + [tf_keras.layers.Dense(3)])
    model.compile(tf_keras.optimizers.Adam(1e-3),
                  tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    timer = EpochTimer()
    with tempfile.TemporaryDirectory() as tmp:
        model.fit(data, epochs=EPOCHS, callbacks=_callbacks(variant, tmp, batch) + [timer], verbose=0)
    return batch * steps * len(timer.seconds) / sum(timer.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    samples = {(m, v): [] for m in MODELS for v in VARIANTS}
    for repeat in range(args.repeats):
        for model_name in MODELS:
            for variant in VARIANTS:
                samples[(model_name, variant)].append(_examples_per_sec(model_name, variant))
        print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)

    rows, results = [], {"machine": machine(), "repeats": args.repeats, "epochs_timed": EPOCHS - 1, "models": {}}
    for model_name, (_, _, batch, _) in MODELS.items():
        rates = {v: median(samples[(model_name, v)]) for v in VARIANTS}
        step_ms = {v: 1000 * batch / rates[v] for v in VARIANTS}
        results["models"][model_name] = {"examples_per_sec": rates, "step_ms": step_ms,
                                         "samples": {v: samples[(model_name, v)] for v in VARIANTS}}
        for v in VARIANTS:
            rows.append(f"| {model_name} | {v} | {rates[v]:.0f} | {step_ms[v]:.3f} | "
                        f"{step_ms[v] - step_ms['no callbacks']:+.3f} | "
                        f"{rates[v] / rates['no callbacks']:.2f}x |")
        ours, stock = rates["hpml callbacks"], rates["tf_keras TensorBoard"]
        rows.append(f"| {model_name} | **hpml / tf_keras TensorBoard** | | | | **{ours / stock:.2f}x** |")
    table = "\n".join([
        f"Callbacks' cost per step; {machine()['cpus']} CPU cores, {machine()['date']}; median of {args.repeats}; "
        f"epochs 2-{EPOCHS} timed with their epoch-end work.",
        "",
        "| model | callbacks | examples/s | ms per step | ms per step over none | examples/s vs none |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ])
    write_results("callbacks", results, table)


if __name__ == "__main__":
    main()
