"""Ingestion and preprocessing at the size of users' data: hpml's ExampleGen and Transform against TFX 1.16's
CsvExampleGen -> StatisticsGen -> SchemaGen -> Transform, on generated CSVs of 16 numeric columns, 4 text columns and
a binary label (`scale_data.py`), with the module `hpml init` writes for that CSV on both sides.

Variants, each run in a process of its own (peak RSS is that process's):
- `limit`: Arrow's CSV reader, hpml's encoder and the GZIP writer on one core, no checks and no Beam: what one core
  can do for ExampleGen's work;
- `examplegen`, `examplegen-2proc`: hpml's ExampleGen on Beam's in-process runner, and on two worker processes;
- `transform`: hpml's Transform on the in-process ExampleGen's output, with its phases (graph, Beam, tuning);
- `tfx`: TFX 1.16's chain in .venv-tfx (`make test-tfx` builds it), one process, component times from MLMD;
- `run`: `hpml run` of the pipeline `hpml init` wrote, end to end (ExampleGen, Transform, one epoch of the Trainer
  at batch_size 1024), with its wall time, each component's seconds and the peak RSS of its processes.

    python benchmarks/scale.py [--rows 100000 1000000 10000000] [--repeats 3] [--tfx-max-rows 1000000] [--add]
                               [--variants limit examplegen examplegen-2proc transform tfx run]

Sizes above 1M rows run once. Writes benchmarks/results/scale.json, scale.md and scale.png; `--add` keeps the sizes
already in scale.json and adds these, and `--rerender` writes scale.md and scale.png again from scale.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _common import (RESULTS, machine, median, peak_rss_mib, run_hpml, time_transform_phases,  # noqa: E402
                     write_results)

TFX_PYTHON = os.path.join(REPO, ".venv-tfx", "bin", "python")
_CHILD = "--child"
# `rerun`: a second `hpml run` in the same home, as a scheduled DAG's later runs are (the tuned step reused).
VARIANTS = ("limit", "examplegen", "examplegen-2proc", "transform", "tfx", "run", "rerun")
TWO_PROCESSES = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def _limit(csv: str, out: str) -> None:
    """Arrow's CSV reader, hpml's encoder and TF's GZIP writer one after the other on one core: the writer is called
    here, not through hpml's, which compresses on a thread of its own."""
    import pyarrow.csv as pcsv
    import tensorflow as tf

    from hpml.components import tfrecords
    from hpml.components.example_gen import example_encoder

    reader = pcsv.open_csv(csv, read_options=pcsv.ReadOptions(block_size=8 << 20))
    os.makedirs(out, exist_ok=True)
    options = tf.io.TFRecordOptions(compression_type="GZIP", compression_level=tfrecords.GZIP_LEVEL)
    with tf.io.TFRecordWriter(os.path.join(out, "data.gz"), options) as writer:
        for batch in reader:
            columns = {name: column.cast("binary") if str(column.type).startswith("string") else column
                       for name, column in zip(batch.schema.names, batch.columns)}
            for record in example_encoder.encode(columns, batch.num_rows).to_pylist():
                writer.write(record)


def _examplegen(csv: str, out: str, beam_args: list[str]) -> None:
    from hpml.components.example_gen import EXAMPLE_GEN

    EXAMPLE_GEN.run({}, {"examples": os.path.join(out, "examples"), "schema": os.path.join(out, "schema")},
                    {"input_path": csv, "required_columns": ["label"], "beam_pipeline_args": beam_args})


def _transform(examples_out: str, module: str, out: str) -> dict:
    """Transform on ExampleGen's output; seconds in building the graph, the Beam pipeline and tuning."""
    from hpml.v1 import TRANSFORM

    spent = time_transform_phases().spent
    started = time.perf_counter()
    TRANSFORM.run({name: os.path.join(examples_out, name) for name in ("examples", "schema")},
                  {name: os.path.join(out, name) for name in ("transform_graph", "transformed_examples",
                                                               "input_pipeline")},
                  {"module": module})
    total = time.perf_counter() - started
    return {"beam_s": spent["beam"], "tuning_s": spent["tuning"], "graph_s": total - spent["beam"] - spent["tuning"]}


def _child(kind: str, *args: str) -> None:
    import apache_beam  # noqa: F401 - imported before the clock starts, as TFX's component times exclude it
    import tensorflow  # noqa: F401
    import tensorflow_transform  # noqa: F401

    import hpml.v1  # noqa: F401

    started = time.perf_counter()
    extra = {}
    if kind in ("run", "rerun"):
        if kind == "rerun":
            csv, pipeline_dir, home = args
            run_hpml(pipeline_dir, csv, home)  # the first run, whose tuned step the measured one reuses
        print(json.dumps(_hpml_run(*args)))
        return
    if kind == "limit":
        _limit(*args)
    elif kind == "examplegen":
        _examplegen(*args, beam_args=["--direct_running_mode=in_memory"])
    elif kind == "examplegen-2proc":
        _examplegen(*args, beam_args=TWO_PROCESSES)
    else:
        extra = _transform(*args)
    print(json.dumps({"seconds": time.perf_counter() - started, "peak_rss_mib": peak_rss_mib(), **extra}))


def _hpml_run(csv: str, pipeline_dir: str, home: str) -> dict:
    """`hpml run` end to end in a process of its own; its wall time, components' seconds and peak RSS (of it and
    any Beam worker processes it waited for)."""
    import resource

    seconds = run_hpml(pipeline_dir, csv, home)
    os.environ.update(HPML_HOME=home)
    from hpml.pipelines import records

    from hpml.components.trainer.callbacks.epoch_metrics import read_metrics

    from hpml.components.trainer.record import TIME_METRIC
    from hpml.components.trainer.time_breakdown import PARTS

    run = records.recent("scale", 1)[0]
    summary = records.load(run.info.run_id)
    epochs = read_metrics(summary.outputs["Trainer"]["model_run"])  # each epoch's seconds, its validation's too
    spent = {f"trainer_{part}_s": run.data.metrics[TIME_METRIC.format(part)] for part in PARTS
             if TIME_METRIC.format(part) in run.data.metrics}  # where the Trainer's time went
    return {"seconds": seconds, "peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            **{f"{node}_s": value for node, value in summary.durations.items()},
            "epochs_s": sum(epoch["seconds"] for epoch in epochs), **spent}


def _cpu_seconds_of_children() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(command: list[str]) -> dict:
    """The child's JSON result, plus `cpu_s`: the CPU seconds it and its own children used, which other work on
    the machine inflates far less than wall time."""
    before = _cpu_seconds_of_children()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "cpu_s": _cpu_seconds_of_children() - before}


def _module(workdir: str, csv: str) -> str:
    """The module `hpml init` writes for the benchmark's CSV (the same columns at every size), written again on
    every run: a work folder kept from an older hpml would otherwise measure that version's template."""
    import shutil

    shutil.rmtree(os.path.join(workdir, "scale"), ignore_errors=True)
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "hpml"), "init", "scale", "--csv", csv, "--label",
                    "label"], cwd=workdir, check=True, capture_output=True)
    return os.path.join(workdir, "scale", "module.py")


def _one_repeat(csv: str, module: str, workdir: str, with_tfx: bool, variants=VARIANTS) -> dict:
    """Every variant once, in turn, so that drift on this noisy machine hits them alike."""
    me = [sys.executable, os.path.abspath(__file__), _CHILD]
    runs = {}
    folders = {kind: tempfile.mkdtemp(dir=workdir) for kind in VARIANTS}
    try:
        for kind in ("limit", "examplegen", "examplegen-2proc"):
            if kind in variants:
                runs[kind] = _run([*me, kind, csv, folders[kind]])
        if "transform" in variants:
            if "examplegen" not in runs:
                _run([*me, "examplegen", csv, folders["examplegen"]])
            runs["transform"] = _run([*me, "transform", folders["examplegen"], module, folders["transform"]])
        if "run" in variants:
            pipeline = os.path.join(os.path.dirname(module), "pipeline.py")
            runs["run"] = _run([*me, "run", csv, pipeline, folders["run"]])
        if "rerun" in variants:
            pipeline = os.path.join(os.path.dirname(module), "pipeline.py")
            runs["rerun"] = _run([*me, "rerun", csv, pipeline, folders["rerun"]])
        if with_tfx and "tfx" in variants:
            tfx = _run([TFX_PYTHON, "-W", "ignore", os.path.join(HERE, "tfx_scale.py"), csv, module, folders["tfx"]])
            tfx["components"]["ExampleGen"] = tfx["components"].pop("CsvExampleGen")
            runs["tfx"] = {"seconds": sum(tfx["components"].values()), "peak_rss_mib": tfx["peak_rss_mib"],
                           "process_s": tfx["total_s"], "cpu_s": tfx["cpu_s"],
                           **{f"{k}_s": v for k, v in tfx["components"].items()}}
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tfx-max-rows", type=int, default=1_000_000,
                        help="run TFX up to this size (its chain takes about an hour at 10M rows here)")
    parser.add_argument("--workdir", default=None, help="where the CSVs are generated (kept) and outputs written")
    parser.add_argument("--note", default="", help="a line on how this run was made, printed in the results")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--add", action="store_true",
                        help="add these sizes to the committed results (scale.json) instead of starting afresh")
    args = parser.parse_args()
    from scale_data import write_csv

    if "tfx" in args.variants and min(args.rows) <= args.tfx_max_rows and not os.path.exists(TFX_PYTHON):
        sys.exit("the tfx variant needs .venv-tfx for TFX 1.16: run `make test-tfx` once, or leave tfx out of "
                 "--variants")
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
    workdir = args.workdir or tempfile.mkdtemp(prefix="hpml-scale-")
    results = {"machine": machine(), "note": args.note, "sizes": {}}
    if args.add and (RESULTS / "scale.json").exists():
        results = json.loads((RESULTS / "scale.json").read_text())
        results["note"] = " ".join(filter(None, [results.get("note"), args.note]))
    module = None
    for rows in sorted(args.rows):
        csv = os.path.join(workdir, f"{rows}.csv")
        if not os.path.exists(csv):
            write_csv(csv, rows)
        module = module or _module(workdir, csv)
        repeats = args.repeats if rows <= 1_000_000 else 1
        runs = [_one_repeat(csv, module, workdir, rows <= args.tfx_max_rows, args.variants) for _ in range(repeats)]
        size = results["sizes"].get(str(rows), {}) if args.add else {}
        size.update({"csv_bytes": os.path.getsize(csv), "date": machine()["date"]})
        if set(args.variants) - {"run", "rerun"}:
            size["repeats"] = repeats
        for kind in VARIANTS:
            if kind in runs[0]:
                size[kind] = {key: median([run[kind][key] for run in runs]) for key in runs[0][kind]}
        results["sizes"][str(rows)] = size
        results["sizes"] = dict(sorted(results["sizes"].items(), key=lambda item: int(item[0])))
        write_results("scale", results, render(results))  # a long run keeps what it has measured so far
    plot(results, RESULTS / "scale.png")


def _default_examplegen(size: dict) -> str:
    """The ExampleGen variant that runs by default at this size: worker processes from 512 MB of CSV."""
    from hpml.components.beam_utils import LOCAL_PARALLEL_BYTES

    return "examplegen-2proc" if size["csv_bytes"] >= LOCAL_PARALLEL_BYTES and "examplegen-2proc" in size \
        else "examplegen"


def _chain(size: dict, kind: str) -> float | None:
    """Seconds of ingestion and preprocessing: hpml's ExampleGen + Transform, or TFX's four components."""
    if kind == "hpml":
        if _default_examplegen(size) not in size or "transform" not in size:
            return None
        return size[_default_examplegen(size)]["seconds"] + size["transform"]["seconds"]
    return size["tfx"]["seconds"] if "tfx" in size else None


def _targets(data: dict) -> list[str]:
    """The issue's targets against this run's numbers, each met or missed, and why where it is missed."""
    sizes = {int(rows): size for rows, size in data["sizes"].items()}
    lines = ["", "## Targets", ""]
    rates = {rows: rows / size[_default_examplegen(size)]["seconds"] for rows, size in sizes.items()
             if rows >= 1_000_000 and _default_examplegen(size) in size}
    lines += [] if not rates else ["- ExampleGen at least 100k rows/s, as it runs by default: " + "; ".join(
        f"{rows:,} rows {rate:,.0f} ({'met' if rate >= 100_000 else f'missed by {1 - rate / 100_000:.0%}'})"
        for rows, rate in rates.items()) + ". Below 512 MB of CSV (about 3M rows) it runs in one process, where "
        "starting the two workers costs more than it saves."]
    ratios = {rows: _chain(size, "tfx") / _chain(size, "hpml") for rows, size in sizes.items()
              if rows >= 1_000_000 and "tfx" in size and _chain(size, "hpml")}
    lines += [] if not ratios else ["- ExampleGen + Transform at least 3x faster than TFX's chain: " + "; ".join(
        f"{rows:,} rows {ratio:.1f}x ({'met' if ratio >= 3 else 'missed'})" for rows, ratio in ratios.items()) + "."]
    trainer = {f"{rows:,} rows{' (rerun)' if kind == 'rerun' else ''}": size[kind]["Trainer_s"] /
               size[kind]["epochs_s"] for rows, size in sizes.items() for kind in ("run", "rerun")
               if rows >= 1_000_000 and size.get(kind, {}).get("epochs_s")}
    lines += [] if not trainer else ["- The Trainer at most 1.5x its epochs (`hpml run`, 1 epoch): " + "; ".join(
        f"{where} {ratio:.2f}x ({'met' if ratio <= 1.5 else 'missed'})" for where, ratio in trainer.items()) +
        ". Where the rest goes is in the last column of the table below (the run record's `trainer_seconds.*`): "
        "building the data and the model, tuning the step on the first run (its trace is the one training "
        "reuses), timing the input stall, and after fit the per-class report and the export."]
    traced = {f"{rows:,} rows": run["Trainer_s"] / (run["epochs_s"] + run["trainer_step_trace_s"])
              for rows, run in ((rows, size.get("run", {})) for rows, size in sizes.items())
              if run.get("trainer_step_trace_s")}
    lines += [] if not traced else [
        "  The same with the step's trace (`step_trace`: a first run's tuning makes it and fit reuses it, where a "
        "later run's or plain `fit`'s first epoch pays it) counted with the epochs: "
        + "; ".join(f"{where} {ratio:.2f}x" for where, ratio in traced.items()) + "."]
    if 1_000_000 in sizes and 10_000_000 in sizes:
        small, large = sizes[1_000_000], sizes[10_000_000]
        growth = {kind: large[kind]["peak_rss_mib"] / small[kind]["peak_rss_mib"]
                  for kind in ("examplegen", "transform", "run") if kind in small and kind in large}
        lines.append("- Peak RSS from 1M to 10M rows at most 1.5x: " + "; ".join(
            f"{kind} {value:.2f}x ({'met' if value <= 1.5 else 'missed'})" for kind, value in growth.items()) +
            ". `run` includes the Trainer; trained for one epoch, as here, it reads its data once and caches nothing. "
            "With more epochs its tuned input pipeline caches the parsed examples (about 90 bytes a row) in memory "
            "while they fit half its tf.data RAM budget (half the available RAM), and on local disk beyond it, so its "
            "memory then grows with the data up to that bound.")
        if "run" in large:
            lines.append(f"- 10M rows end to end with `hpml run` (1 epoch): {large['run']['seconds']:.0f} s, "
                         f"{large['run']['peak_rss_mib']:.0f} MiB peak (met).")
    return lines


def render(data: dict) -> str:
    m = data["machine"]
    lines = ["# Ingestion and preprocessing at scale", "",
             f"Machine: {m['cpus']} cores, {m['platform']}, Python {m['python']}, {m['date']}. Medians of the "
             "repeats shown; each variant runs in a process of its own and its peak RSS is that process's. Times are "
             "the components' own (TFX's from MLMD), without starting the process and importing TensorFlow; CPU s is "
             "the CPU time of the variant's whole process tree, start-up, imports and Beam worker processes included, "
             "which other work on the machine inflates far less than wall time. "
             "Data: `benchmarks/scale_data.py` (16 numeric columns, 4 text columns, a binary label); both sides "
             "run the module `hpml init` wrote for it. [Plot](scale.png).",
             *(["", f"**{data['note']}**"] if data.get("note") else []), "",
             "## hpml ExampleGen + Transform against TFX 1.16's CsvExampleGen, StatisticsGen, SchemaGen and Transform",
             "",
             "| rows | CSV MB | repeats | hpml s (default ExampleGen + Transform) | hpml rows/s | TFX s | TFX / hpml "
             "| hpml peak RSS MiB (ExampleGen, Transform) | TFX peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for rows, size in data["sizes"].items():
        hpml, tfx = _chain(size, "hpml"), _chain(size, "tfx")
        if hpml is None:  # ExampleGen or Transform not run at this size
            continue
        lines.append(
            f"| {int(rows):,} | {size['csv_bytes'] / 1e6:.0f} | {size['repeats']} | {hpml:.1f} | "
            f"{int(rows) / hpml:,.0f} | {_cell(tfx, '.1f')} | {_ratio(tfx, hpml)} | "
            f"{size.get('examplegen', {}).get('peak_rss_mib', 0):.0f}, {size['transform']['peak_rss_mib']:.0f} | "
            f"{_cell(size.get('tfx', {}).get('peak_rss_mib'), '.0f')} |")
    lines += _targets(data)
    lines += ["", "## Per component", "",
              "| rows | variant | seconds | rows/s | CPU s | peak RSS MiB | detail |", "|---|---|---|---|---|---|---|"]
    for rows, size in data["sizes"].items():
        for kind in VARIANTS:
            if kind not in size:
                continue
            stats = size[kind]
            cpu = f"{stats['cpu_s']:.0f}" if "cpu_s" in stats else ""
            lines.append(f"| {int(rows):,} | {kind} | {stats['seconds']:.1f} | {int(rows) / stats['seconds']:,.0f} | "
                         f"{cpu} | {stats['peak_rss_mib']:.0f} | {_detail(kind, size)} |")
    sizes = list(data["sizes"].items())
    steps = []
    for (small_rows, small), (large_rows, large) in zip(sizes, sizes[1:]):
        growth = ", ".join(f"{kind} {large[kind]['peak_rss_mib'] / small[kind]['peak_rss_mib']:.2f}x"
                           for kind in ("examplegen", "transform", "run", "tfx") if kind in small and kind in large)
        steps.append(f"from {int(small_rows):,} to {int(large_rows):,} rows: {growth}")
    if steps:
        lines += ["", f"Peak RSS {'; '.join(steps)}. Where Beam ran worker processes (examplegen-2proc, and "
                      "Transform from 256 MB of examples, here at 10M rows), the RSS is the driver's; the workers' "
                      "is not counted."]
    return "\n".join(lines) + "\n"


def _cell(value, spec: str) -> str:
    return "not run" if value is None else format(value, spec)


def _ratio(a, b) -> str:
    return "not run" if a is None else f"{a / b:.2f}x"


def _detail(kind: str, size: dict) -> str:
    stats = size[kind]
    if kind in ("examplegen", "examplegen-2proc") and "limit" in size:
        return f"{stats['seconds'] / size['limit']['seconds']:.2f}x the one-core limit"
    if kind == "transform":
        return f"graph {stats['graph_s']:.1f} s, Beam {stats['beam_s']:.1f} s, tuning {stats['tuning_s']:.1f} s"
    if kind in ("run", "rerun"):
        epochs = f" (its epoch {stats['epochs_s']:.1f} s)" if "epochs_s" in stats else ""
        from hpml.components.trainer.time_breakdown import PARTS

        spent = [f"{part.replace('_', ' ')} {stats[f'trainer_{part}_s']:.1f} s" for part in PARTS
                 if f"trainer_{part}_s" in stats]
        which = "one run" if kind == "run" else \
            "the second run in one home (the tuned step reused; its CPU s counts both runs)"
        return f"`hpml run`, 1 epoch, {which}: " + ", ".join(
            f"{name} {stats[f'{name}_s']:.1f} s" for name in ("ExampleGen", "Transform", "Trainer")
            if f"{name}_s" in stats) + f"{epochs}; RSS of all its processes" + (
            f". The Trainer's time: {', '.join(spent)}" if spent else "")
    if kind == "tfx":
        return ", ".join(f"{name} {stats[f'{name}_s']:.1f} s" for name in
                         ("ExampleGen", "StatisticsGen", "SchemaGen", "Transform") if f"{name}_s" in stats)
    return ""


def plot(data: dict, path) -> None:
    """Log-log: seconds and peak RSS against rows, hpml's components and chain beside TFX's chain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [int(r) for r in data["sizes"]]
    sizes = list(data["sizes"].values())
    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = {"hpml ExampleGen": [s.get("examplegen", {}).get("seconds") for s in sizes],
              "hpml Transform": [s.get("transform", {}).get("seconds") for s in sizes],
              "hpml ExampleGen + Transform": [_chain(s, "hpml") for s in sizes],
              "TFX 1.16 chain": [_chain(s, "tfx") for s in sizes]}
    for label, values in series.items():
        points = [(r, v) for r, v in zip(rows, values) if v is not None]
        if points:
            time_axis.plot(*zip(*points), marker="o", label=label)
    memory = {"hpml ExampleGen": [s.get("examplegen", {}).get("peak_rss_mib") for s in sizes],
              "hpml Transform": [s.get("transform", {}).get("peak_rss_mib") for s in sizes],
              "TFX 1.16 chain": [s.get("tfx", {}).get("peak_rss_mib") for s in sizes]}
    for label, values in memory.items():
        points = [(r, v) for r, v in zip(rows, values) if v is not None]
        if points:
            memory_axis.plot(*zip(*points), marker="o", label=label)
    for axis, title, unit in ((time_axis, "Time", "seconds"), (memory_axis, "Peak RSS", "MiB")):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("rows")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def rerender() -> None:
    """scale.md and scale.png again from scale.json, as after a run (`--rerender`)."""
    data = json.loads((RESULTS / "scale.json").read_text())
    write_results("scale", data, render(data))
    plot(data, RESULTS / "scale.png")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == _CHILD:
        _child(*sys.argv[2:])
    elif sys.argv[1:] == ["--rerender"]:
        rerender()
    else:
        main()
