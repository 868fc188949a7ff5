"""The penguin pipeline end to end, three ways side by side in one run (median of N): TFX 1.16's LocalDagRunner,
hpml's local engine and hpml's Airflow engine.

Every variant runs the same user module (hpml's penguin module: the same preprocessing_fn and run_fn, 10 epochs,
batch 32, one device) on the same CSV, as its own process, the way a user starts it; the variants take turns, so
a slow spell of this shared machine falls on all of them. Each engine runs once first, unmeasured, so that one-off
set-up (Airflow's database, MLflow's store) is not counted. Per-component seconds come from each engine's own
record: MLMD for TFX, hpml's run record for hpml. TFX needs StatisticsGen and SchemaGen to give Transform a schema;
hpml's ExampleGen infers it.

    python benchmarks/end_to_end.py [--repeats 5]     # needs .venv-tfx (make test-tfx builds it)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks._common import machine, median, time_transform_phases, write_results  # noqa: E402
from hpml.components.trainer.step_tuning import TUNED_STEP_FILE, StepChoice  # noqa: E402

TFX_PYTHON = os.path.join(REPO, ".venv-tfx", "bin", "python")
HPML = os.path.join(os.path.dirname(sys.executable), "hpml")
COMPONENTS = ("ExampleGen", "StatisticsGen", "SchemaGen", "Transform", "Trainer")
VARIANTS = ("tfx", "hpml_local", "hpml_airflow")
LABELS = {"tfx": "TFX 1.16 LocalDagRunner", "hpml_local": "hpml local engine", "hpml_airflow": "hpml Airflow engine"}


def _tfx(csv: str, work: str) -> dict:
    folder = tempfile.mkdtemp(dir=work)
    done = subprocess.run([TFX_PYTHON, "-W", "ignore", os.path.join(REPO, "benchmarks", "tfx_penguin.py"), csv,
                           folder], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the TFX pipeline failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    components = result["components"]
    components["ExampleGen"] = components.pop("CsvExampleGen")
    return {"total_s": result["total_s"], "components": components}


def _hpml(engine: str, home: str) -> dict:
    env = dict(os.environ, HPML_HOME=home)  # XDG_CACHE_HOME (the tuned-step cache) is set by main, once for all
    started = time.perf_counter()
    done = subprocess.run([HPML, "run", "penguin", "--engine", engine, "--param", "strategy=one_device"],
                          capture_output=True, text=True, env=env, check=False)
    total = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"hpml run --engine {engine} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    os.environ["HPML_HOME"] = home
    from hpml.pipelines import records

    (run,) = records.recent("penguin", 1)
    summary = records.load(run.info.run_id)
    with open(os.path.join(summary.outputs["Trainer"]["model_run"], TUNED_STEP_FILE), encoding="utf-8") as handle:
        step = json.load(handle)
    return {"total_s": total, "components": dict(summary.durations),
            "tuned_step": {"choice": StepChoice(**step["choice"]).describe(), "seconds": step["seconds"],
                           "reused": step["reused"]}}


def _transform_phases(csv: str, work: str, repeats: int) -> dict:
    """Where hpml's Transform spends its time on 344 rows, median of `repeats` in this process: building the
    tf.Transform graph (tracing preprocessing_fn), running the Beam pipeline, and tuning the input pipeline (of
    which drawing the stage-breakdown plot)."""
    from hpml.v1 import EXAMPLE_GEN, TRANSFORM

    spent = time_transform_phases(plot=True).spent
    folder = tempfile.mkdtemp(dir=work)
    uri = {name: os.path.join(folder, name) for name in ("examples", "schema")}
    EXAMPLE_GEN.run({}, uri, {"input_path": csv})
    samples = []
    for repeat in range(repeats + 1):  # the first, which loads TF's and Beam's code paths, is not counted
        spent.clear()
        out = {name: os.path.join(folder, f"{name}-{repeat}") for name in
               ("transform_graph", "transformed_examples", "input_pipeline")}
        started = time.perf_counter()
        TRANSFORM.run(uri, out, {"module": "hpml.examples.penguin.module"})
        total = time.perf_counter() - started
        if repeat:
            samples.append({"total_s": total, "graph_s": total - spent["beam"] - spent["tuning"],
                            "beam_s": spent["beam"], "tuning_s": spent["tuning"], "plot_s": spent["plot"]})
    return {key: median([s[key] for s in samples]) for key in samples[0]}


def render(data: dict) -> str:
    """The results table (Markdown) of a run's data."""
    medians, outside, phases = data["medians"], data["outside_components_s"], data["hpml_transform_phases_s"]
    ratio = data["hpml_local_over_tfx_total"]
    component_s = {v: sum(medians[v]["components"].values()) for v in VARIANTS}
    rows = [f"| seconds (median of {data['repeats']}) | " + " | ".join(LABELS[v] for v in VARIANTS) + " |",
            "|---|" + "---|" * len(VARIANTS)]
    for component in COMPONENTS:
        cells = [f"{medians[v]['components'][component]:.1f}" if component in medians[v]["components"] else "—"
                 for v in VARIANTS]
        rows.append(f"| {component} | " + " | ".join(cells) + " |")
    rows.append("| outside the components: imports, engine, run record, report | "
                + " | ".join(f"{outside[v]:.1f}" for v in VARIANTS) + " |")
    rows.append("| **whole run, process start to exit** | "
                + " | ".join(f"**{medians[v]['total_s']:.1f}**" for v in VARIANTS) + " |")
    return "\n".join([
        "# The penguin pipeline end to end: TFX against hpml", "",
        f"{data['machine']['cpus']} CPUs, {data['machine']['platform']}, {data['machine']['date']}; written by "
        "`benchmarks/end_to_end.py`. Each variant is its own process running the same module (10 epochs, "
        "batch 32, one device); components are timed by each engine's own record.", "",
        *rows, "",
        f"- **hpml local / TFX, whole run: {ratio:.2f}x** (target: at most 1.0x).",
        f"- hpml Airflow engine / TFX, whole run: {data['hpml_airflow_over_tfx_total']:.2f}x. Its components take "
        f"{component_s['hpml_airflow']:.1f} s, the local engine's {component_s['hpml_local']:.1f} s; the "
        f"{outside['hpml_airflow'] - outside['hpml_local']:.1f} s more outside them are Airflow's: a DAG run in the "
        "metadata database, each task's start, state and XCom.", *_tuned_step_lines(data), "",
        "## hpml's Transform on 344 rows", "",
        f"Where its {phases['total_s']:.1f} s go: median of {data['repeats']} runs in one process, after a first "
        "that is not counted. Each engine run above is a fresh process, whose Transform also pays for loading "
        "TensorFlow's, tf.Transform's and Beam's code paths the first time: the difference from its Transform row.",
        "",
        "| phase | seconds |", "|---|---|",
        f"| building the tf.Transform graph (tracing preprocessing_fn, saving the transform SavedModel) "
        f"| {phases['graph_s']:.1f} |",
        f"| running the Beam pipeline (analyze, transform and write both splits) | {phases['beam_s']:.1f} |",
        f"| tuning the input pipeline, with its stage-breakdown plot | {phases['tuning_s']:.1f} |",
        f"| of which drawing the plot | {phases['plot_s']:.1f} |", ""])


def _tuned_step_lines(data: dict) -> list[str]:
    """What hpml's Trainer trained with: the step its first run measured, which the timed runs reused."""
    first = data.get("warm_up_tuned_step")
    if not first:  # results from before the benchmark recorded it
        return []
    timed = [s["tuned_step"] for v in VARIANTS if v != "tfx" for s in data["samples"][v]]
    choices = sorted({s["choice"] for s in timed} | {s["choice"] for s in first.values()})
    return [f"- hpml's Trainer trained with the tuned step {'; '.join(choices)}, chosen in the untimed warm-up "
            "runs, which start with an empty tuned-step cache ("
            + ", ".join(f"{LABELS[v]}: " + ("reused" if s["reused"] else f"measured in {s['seconds']:.1f} s")
                        for v, s in first.items())
            + f"); {sum(s['reused'] for s in timed)} of the {len(timed)} timed runs reused it from the cache, as a "
              "user's later runs do."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not os.path.exists(TFX_PYTHON):
        sys.exit("benchmarks/end_to_end.py needs the TFX 1.16 environment: run `make test-tfx` first")
    from hpml.examples.penguin.pipeline import penguins_csv

    csv = penguins_csv()
    work = tempfile.mkdtemp(prefix="hpml-e2e-")
    homes = {"hpml_local": os.path.join(work, "local"), "hpml_airflow": os.path.join(work, "airflow")}
    run = {"tfx": lambda: _tfx(csv, work), "hpml_local": lambda: _hpml("local", homes["hpml_local"]),
           "hpml_airflow": lambda: _hpml("airflow", homes["hpml_airflow"])}
    os.environ["XDG_CACHE_HOME"] = os.path.join(work, "cache")  # the first run measures the step, as a user's does
    warm_up = {}
    for variant in VARIANTS:
        print(f"warm-up: {LABELS[variant]}", flush=True)
        warm_up[variant] = run[variant]()
    samples: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    for repeat in range(args.repeats):
        for variant in VARIANTS:
            samples[variant].append(run[variant]())
            print(f"run {repeat + 1}/{args.repeats} {LABELS[variant]}: {samples[variant][-1]['total_s']:.1f} s",
                  flush=True)

    phases = _transform_phases(csv, work, args.repeats)
    medians = {variant: {"total_s": median([s["total_s"] for s in samples[variant]]),
                         "components": {c: median([s["components"][c] for s in samples[variant]
                                                   if c in s["components"]])
                                        for c in COMPONENTS if any(c in s["components"] for s in samples[variant])}}
               for variant in VARIANTS}
    ratio = medians["hpml_local"]["total_s"] / medians["tfx"]["total_s"]
    outside = {v: medians[v]["total_s"] - sum(medians[v]["components"].values()) for v in VARIANTS}
    data = {"machine": machine(), "repeats": args.repeats, "medians": medians, "samples": samples,
            "warm_up_tuned_step": {v: warm_up[v]["tuned_step"] for v in VARIANTS if v != "tfx"},
            "outside_components_s": outside, "hpml_transform_phases_s": phases,
            "hpml_local_over_tfx_total": ratio,
            "hpml_airflow_over_tfx_total": medians["hpml_airflow"]["total_s"] / medians["tfx"]["total_s"]}
    write_results("end_to_end", data, render(data))


if __name__ == "__main__":
    main()
