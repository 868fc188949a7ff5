"""Where Transform's time goes at scale: its Beam pipeline built up one phase at a time, on the examples ExampleGen
writes for the scale benchmark's CSV (`scale_data.py`), with the module `hpml init` writes for it.

Inside one Beam pipeline the phases run fused and overlap, so they cannot be timed from inside. Each variant here
runs the component's pipeline up to a phase, in a process of its own, with the Beam runner Transform itself picks
for the data's size; the difference between consecutive variants is the cost of the phase added:
- `read`: every split read and decoded to Arrow record batches (`example_io.ReadExampleBatches`);
- `analyze`: + the analysis of the train split (`tft_beam.AnalyzeDataset`, its transform_fn written);
- `transform`: + every split transformed by that transform_fn (`tft_beam.TransformDataset`), which reads the
  train split a second time;
- `component`: the Transform component as users run it: + encoding and writing the transformed examples and the
  feature ranges (its Beam pipeline), then tuning the input pipeline, timed apart.
Every variant counts the records it saw, and the counts are checked against ExampleGen's.

    python benchmarks/transform_phases.py [--rows 1000000 10000000] [--repeats 3] [--workdir DIR]

Sizes above 1M rows run once. Writes benchmarks/results/transform_phases.json and transform_phases.md.
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
sys.path.insert(0, HERE)
from _common import machine, median, peak_rss_mib, write_results  # noqa: E402

PHASES = ("read", "analyze", "transform", "component")
_CHILD = "--child"


def _pipeline(examples: str, module: str, phase: str, out: str) -> dict:
    """The component's pipeline up to `phase`; its seconds and the records each split yielded."""
    import apache_beam as beam
    import tensorflow_transform.beam as tft_beam
    from tfx_bsl.public import tfxio

    from hpml.components import artifacts, beam_utils, files
    from hpml.components.transform import example_io
    from hpml.components.user_module import load_function
    from hpml.components.schema_file import read_schema

    schema = read_schema(artifacts.schema_path(os.path.join(examples, "schema")))
    examples = os.path.join(examples, "examples")
    splits = artifacts.list_splits(examples)
    shards = {split: sorted(files.glob(artifacts.examples_file_pattern(examples, split))) for split in splits}
    preprocessing_fn = load_function(module, "preprocessing_fn")
    beam_utils.ship_by_value(preprocessing_fn)
    adapter = tfxio.TFExampleRecord(file_pattern=shards[splits[0]], schema=schema).TensorAdapterConfig()
    started = time.perf_counter()
    pipeline = beam_utils.make_pipeline([], sum(files.size(p) for split in splits for p in shards[split]),
                                        parallel_from=beam_utils.TRANSFORM_PARALLEL_BYTES)
    counted = {}
    with tft_beam.Context(temp_dir=os.path.join(out, "tmp")):
        transform_fn = None
        if phase != "read":
            train = pipeline | "ReadForAnalysis" >> example_io.ReadExampleBatches(shards["train"], schema)
            transform_fn = (train, adapter) | "Analyze" >> tft_beam.AnalyzeDataset(preprocessing_fn)
            _ = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(os.path.join(out, "graph"))
        for split in splits if phase != "analyze" else ():
            batches = pipeline | f"Read[{split}]" >> example_io.ReadExampleBatches(shards[split], schema)
            if phase == "transform":
                transformed, _ = (((batches, adapter), transform_fn)
                                  | f"Transform[{split}]" >> tft_beam.TransformDataset(output_record_batches=True))
                batches = transformed | f"Batches[{split}]" >> beam.Map(lambda pair: pair[0])
            path = os.path.join(out, f"count-{split}.txt")
            counted[split] = path
            _ = (batches | f"Rows[{split}]" >> beam.Map(lambda batch: batch.num_rows)
                 | f"Sum[{split}]" >> beam.CombineGlobally(sum)
                 | f"Save[{split}]" >> beam.Map(lambda total, path=path: open(path, "w").write(str(total))))
        beam_utils.run_pipeline(pipeline)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "records": {split: int(open(path).read()) for split, path in counted.items()}}


def _component(examples: str, module: str, out: str) -> dict:
    """The Transform component, its Beam pipeline and its tuning timed apart (as scale.py's `transform`)."""
    import scale

    result = scale._transform(examples, module, out)
    return {"seconds": result["graph_s"] + result["beam_s"] + result["tuning_s"], **result}


def _child(phase: str, examples: str, module: str, out: str) -> None:
    import apache_beam  # noqa: F401 - imported before the clock starts
    import tensorflow  # noqa: F401
    import tensorflow_transform  # noqa: F401

    import hpml.v1  # noqa: F401

    result = _component(examples, module, out) if phase == "component" else _pipeline(examples, module, phase, out)
    print(json.dumps({**result, "peak_rss_mib": peak_rss_mib()}))


def _run(command: list[str]) -> dict:
    import scale

    return scale._run(command)


def _examples(workdir: str, rows: int) -> tuple[str, str, dict]:
    """ExampleGen's output for the scale CSV of `rows` rows (made once, kept in `workdir`), the module, and the
    records per split."""
    import scale
    from scale_data import write_csv

    import tensorflow as tf

    csv = os.path.join(workdir, f"{rows}.csv")
    if not os.path.exists(csv):
        write_csv(csv, rows)
    module = scale._module(workdir, csv)
    out = os.path.join(workdir, f"examples-{rows}")
    if not os.path.exists(os.path.join(out, "examples")):
        subprocess.run([sys.executable, os.path.join(HERE, "scale.py"), "--child", "examplegen", csv, out],
                       check=True, capture_output=True)
    counts = {}
    for split in ("train", "eval"):
        pattern = os.path.join(out, "examples", f"Split-{split}", "*.gz")
        dataset = tf.data.TFRecordDataset(tf.io.gfile.glob(pattern), compression_type="GZIP")
        counts[split] = int(dataset.reduce(0, lambda n, _: n + 1))
    return out, module, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="where the CSVs and examples are made (kept)")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="hpml-phases-")
    results = {"machine": machine(), "sizes": {}}
    me = [sys.executable, os.path.abspath(__file__), _CHILD]
    for rows in sorted(args.rows):
        examples, module, counts = _examples(workdir, rows)
        repeats = args.repeats if rows <= 1_000_000 else 1
        runs = []
        for _ in range(repeats):
            run = {}
            for phase in PHASES:  # interleaved, so that drift on this noisy machine hits every phase alike
                out = tempfile.mkdtemp(dir=workdir)
                try:
                    run[phase] = _run([*me, phase, examples, module, out])
                finally:
                    shutil.rmtree(out, ignore_errors=True)
                seen = run[phase].pop("records", None)
                expected = {"read": counts, "analyze": {}, "transform": counts}.get(phase)
                if expected is not None and seen != expected:
                    raise RuntimeError(f"{phase} at {rows} rows saw {seen} records, ExampleGen wrote {counts}")
            runs.append(run)
        results["sizes"][str(rows)] = {
            "repeats": repeats, "records": counts,
            **{phase: {key: median([run[phase][key] for run in runs]) for key in runs[0][phase]} for phase in PHASES}}
        write_results("transform_phases", results, render(results))


def render(data: dict) -> str:
    m = data["machine"]
    lines = ["# Transform's phases at scale", "",
             f"Machine: {m['cpus']} cores, {m['platform']}, Python {m['python']}, {m['date']}. "
             "Made by `benchmarks/transform_phases.py`: Transform's Beam pipeline built up one phase at a time, each "
             "variant in a process of its own on the Beam runner Transform picks for the size (one worker process "
             "per core from 256 MB of examples); a phase's cost is the difference from the variant before it. "
             "Medians of the repeats shown; CPU s includes start-up, imports and Beam's worker processes.", "",
             "| rows | repeats | phase | cumulative s | phase s | share | CPU s | peak RSS MiB (driver) |",
             "|---|---|---|---|---|---|---|---|"]
    for rows, size in data["sizes"].items():
        component = size["component"]
        steps = [("read and decode every split", size["read"]["seconds"]),
                 ("analysis of train", size["analyze"]["seconds"]),
                 ("transform of every split (train read again)", size["transform"]["seconds"]),
                 ("encode and write, feature ranges", component["graph_s"] + component["beam_s"]),
                 ("tune the input pipeline", component["seconds"])]
        keys = ["read", "analyze", "transform", "component", "component"]
        previous = 0.0
        for (label, cumulative), key, index in zip(steps, keys, range(len(steps))):
            phase_s = cumulative - previous
            if index == 1:  # analysis reads train only; its base is reading train, not every split
                phase_s = cumulative - size["read"]["seconds"] * _train_share(size)
            lines.append(f"| {int(rows):,} | {size['repeats']} | {label} | {cumulative:.1f} | {phase_s:.1f} | "
                         f"{phase_s / component['seconds']:.0%} | {size[key]['cpu_s']:.0f} | "
                         f"{size[key]['peak_rss_mib']:.0f} |")
            previous = cumulative
    lines += ["", "The analysis row's phase time is the analysis variant less reading the train split alone (the "
              "read variant's time in proportion to train's records); the rows after it are differences from the "
              "row before. The component's own time splits into its graph and Beam pipeline (the encode-and-write "
              "row is their sum) and its tuning."]
    return "\n".join(lines) + "\n"


def _train_share(size: dict) -> float:
    records = size["records"]
    return records["train"] / sum(records.values())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == _CHILD:
        _child(*sys.argv[2:])
    else:
        main()
