"""GPipe benchmark: schedule timeline (Gantt PNG), bubble, throughput and memory per remat mode.

    python benchmarks/gpipe.py [--repeats 5] [--stages K]

K defaults to the number of GPUs when there are at least 2, else 2 logical CPU devices, so the
same script runs unchanged on a GPU machine. On a CPU-only machine the stages share the cores:
wall-clock overlap between stages is limited by the cores, and memory is the process's peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks._common import RESULTS, machine, median, peak_rss_mib, write_results

WIDTH, DEPTH, BATCH = 512, 8, 1024
MEMORY_BATCH = 65536  # activations (128 MiB per layer) dominate the TF runtime's own peak


def _setup_devices(k: int):
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) < 2:
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * k)
    return "GPU" if len(gpus) >= 2 else "CPU (logical devices)"


def _model(k, m, remat="except_last", swap=False, pipelined=True, schedule_name="gpipe"):
    import tf_keras

    from hpml.components.trainer.gpipe.pipeline_model import PipelineModel

    import tensorflow as tf

    layers = [tf_keras.layers.Dense(WIDTH, activation="relu") for _ in range(DEPTH)] + [tf_keras.layers.Dense(10)]
    params = [WIDTH * WIDTH + WIDTH] * DEPTH + [WIDTH * 10 + 10]
    if pipelined:
        model = PipelineModel(layers, num_stages=k, num_micro_batches=m, balance="params", layer_costs=params,
                              remat=remat, swap=swap, schedule_name=schedule_name)
    else:
        model = tf_keras.Sequential(layers)
    model(tf.zeros([1, WIDTH]))  # builds each stage's variables on its device
    model.compile(tf_keras.optimizers.SGD(0.01), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _throughput(model, steps=6, batch=BATCH) -> float:
    import numpy as np
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(0).normal(size=(batch, WIDTH)).astype("float32"))
    y = tf.constant(np.random.default_rng(1).integers(0, 10, size=(batch,)))
    model.train_on_batch(x, y)  # trace
    start = time.perf_counter()
    for _ in range(steps):
        model.train_on_batch(x, y)
    return steps * batch / (time.perf_counter() - start)


def _executed_bubbles(k: int, repeats: int) -> tuple[dict[int, float], bool]:
    """Trace real steps for M = 1, 2, 4, 8 (and 1F1B at M = 8); Gantt PNGs of the executed steps."""
    import numpy as np
    import tensorflow as tf

    from hpml.components.trainer.gpipe import trace
    from hpml.components.trainer.gpipe.plot import plot_executed

    x = tf.constant(np.random.default_rng(0).normal(size=(BATCH, WIDTH)).astype("float32"))
    y = tf.constant(np.random.default_rng(1).integers(0, 10, size=(BATCH,)))
    bubbles, in_order = {}, True
    for m in (1, 2, 4, 8):
        model = _model(k, m)
        values = []
        for _ in range(repeats):
            events = trace.trace_train_step(model, x, y)
            in_order &= trace.executed_order(events, k) == model.order
            values.append(trace.measured_bubble(events, k))
        bubbles[m] = median(values)
        if m == 4:
            plot_executed(events, k, str(RESULTS / "gpipe_executed_M4.png"), f"executed GPipe step K={k} M=4")
    model = _model(k, 8, schedule_name="1f1b")
    events = trace.trace_train_step(model, x, y)
    in_order &= trace.executed_order(events, k) == model.order
    plot_executed(events, k, str(RESULTS / "gpipe_1f1b_executed_M8.png"), f"executed 1F1B step K={k} M=8")
    return bubbles, bool(in_order)


def _memory_child(args) -> None:
    """Runs in a subprocess: peak memory of training steps for one remat/swap mode
    (the GPU allocator's peak when there are GPUs, else the process's peak RSS)."""
    import tensorflow as tf

    kind = _setup_devices(args.stages)
    model = _model(args.stages, 4, remat=args.remat, swap=args.swap == "on")
    _throughput(model, steps=2, batch=MEMORY_BATCH)
    if kind == "GPU":
        peak = max(tf.config.experimental.get_memory_info(d.name.replace("/physical_device:", ""))["peak"]
                   for d in tf.config.list_physical_devices("GPU")[: args.stages]) / 2**20
    else:
        peak = peak_rss_mib()
    print(json.dumps({"peak_rss_mib": peak}))


def _gantt(order, costs, path, title):
    from hpml.components.trainer.gpipe.plot import plot_gantt

    return plot_gantt(order, costs, str(path), title)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stages", type=int, default=0)
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--remat", default="never", help=argparse.SUPPRESS)
    parser.add_argument("--swap", default="off", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        return _memory_child(args)
    import tensorflow as tf

    k = args.stages or max(len(tf.config.list_physical_devices("GPU")), 2)
    args.stages = k
    device_kind = _setup_devices(k)
    from hpml.components.trainer.gpipe import profile, schedule

    # Throughput: GPipe (M = 2, 4, 8) vs naive model parallelism (M = 1) vs one device.
    configs = {"single device": None, **{f"K={k}, M={m}": m for m in (1, 2, 4, 8)}}
    rates = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, m in configs.items():
            model = _model(k, m or 1, pipelined=m is not None)
            rates[name].append(_throughput(model))
    med = {name: median(v) for name, v in rates.items()}

    # Timeline and bubble from measured per-stage micro-step costs.
    model = _model(k, 4)
    sample = tf.random.normal([BATCH // 4, WIDTH])
    costs_ms = [1000 * c for c in profile.stage_costs(profile.layer_costs(model.pipeline_layers, sample), model.stages)]
    RESULTS.mkdir(exist_ok=True)
    bubbles = {}
    for m in (1, 2, 4, 8):
        bubbles[m] = _gantt(schedule.gpipe(k, m), costs_ms, RESULTS / f"gpipe_gantt_M{m}.png", f"GPipe K={k} M={m}") \
            if m in (4,) else schedule.simulate(schedule.gpipe(k, m), forward_cost=costs_ms).bubble
    _gantt(schedule.one_f_one_b(k, 8), costs_ms, RESULTS / "gpipe_1f1b_gantt_M8.png", f"1F1B K={k} M=8")

    # Timeline and bubble of one executed step, from the TF profiler's trace (median of the repeats).
    executed, in_order = _executed_bubbles(k, args.repeats)

    # Memory: peak RSS of one process per remat mode and swap.
    memory = {}
    for remat in ("never", "except_last", "always"):
        for swap in ("off", "on"):
            out = subprocess.run([sys.executable, __file__, "--memory-child", "--stages", str(k), "--remat", remat,
                                  "--swap", swap], capture_output=True, text=True, check=True)
            memory[f"{remat}/swap {swap}"] = json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mib"]

    single = med["single device"]
    lines = [f"Devices: {k} stages on {device_kind}; model {DEPTH}x Dense({WIDTH}), batch {BATCH}; "
             f"median of {args.repeats}.", "",
             "| configuration | examples/s | vs single device | vs naive (M=1) | bubble (measured costs) "
             "| bubble (executed step) | (K-1)/(M+K-1) |",
             "|---|---|---|---|---|---|---|",
             f"| single device | {single:.0f} | 1.00x | | | | |"]
    for m in (1, 2, 4, 8):
        name = f"K={k}, M={m}"
        lines.append(f"| {name} | {med[name]:.0f} | {med[name] / single:.2f}x | {med[name] / med[f'K={k}, M=1']:.2f}x "
                     f"| {bubbles[m]:.3f} | {executed[m]:.3f} | {(k - 1) / (m + k - 1):.3f} |")
    memory_kind = "peak GPU memory" if device_kind == "GPU" else "peak RSS"
    lines += ["", f"| remat / swap (K={k}, M=4, batch {MEMORY_BATCH}) | {memory_kind} (MiB) |", "|---|---|"]
    lines += [f"| {name} | {mib:.0f} |" for name, mib in memory.items()]
    lines += ["", f"Per-stage forward cost per micro-batch (ms): {', '.join(f'{c:.2f}' for c in costs_ms)}",
              "Bubble (measured costs): the schedule simulated with each stage's profiled micro-step cost. Bubble "
              "(executed step): 1 - busy / (K x span) of one real step traced with the TF profiler, where busy is "
              "the time a stage had any op running (median over the repeats); every traced step ran each stage's "
              f"micro-steps in schedule order: {in_order}.",
              "Gantt charts: simulated `benchmarks/results/gpipe_gantt_M4.png`, `gpipe_1f1b_gantt_M8.png`; "
              "executed `gpipe_executed_M4.png`, `gpipe_1f1b_executed_M8.png`."]
    write_results("gpipe", {"machine": machine(), "device_kind": device_kind, "stages": k, "raw_rates": rates,
                            "median_rates": med, "bubbles": bubbles, "stage_costs_ms": costs_ms,
                            "executed_bubbles": executed, "executed_in_schedule_order": in_order,
                            "peak_rss_mib": memory}, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
