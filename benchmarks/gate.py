"""The Gate at the size of users' data: hpml's Gate scoring the model of a 1-epoch `hpml run` of the scale
pipeline (`scale.py`'s CSV and module) on its raw eval split, against TFX 1.16's model evaluation (TFMA's
`run_model_analysis`, which TFX's Evaluator runs; `tfma_gate.py` in .venv-tfx) computing the same metrics on the same
split through the same serving signature, and against the floor: reading the split and parsing its labels alone.

Variants, each run in a process of its own, in turn, `--repeats` times (the median is reported); the seconds exclude
importing TensorFlow, TFMA and hpml:
- `floor`: the split read, decompressed, batched and its labels parsed (tf.data), no model;
- `gate`, `gate-champion`: hpml's Gate on the candidate alone, and with the same SavedModel as the champion (two
  models loaded and scored side by side, the work a real champion costs);
- `tfma`, `tfma-champion`: TFMA on the candidate alone, and with the same SavedModel as its baseline. Above 100k rows
  they run once: a 1M-row pass takes minutes, and their gap to the Gate is far beyond this machine's noise.

    python benchmarks/gate.py [--rows 100000 1000000] [--repeats 5] [--workdir DIR]

Writes benchmarks/results/gate.json and gate.md; `make test-tfx` builds .venv-tfx.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import machine, median, run_hpml, write_results  # noqa: E402
from scale import TFX_PYTHON, _module  # noqa: E402

_CHILD = "--child"
VARIANTS = ("floor", "gate", "gate-champion", "tfma", "tfma-champion")
TFMA_ONCE_ABOVE_ROWS = 100_000
LABEL = "label"


def _floor(pattern: str, schema: str) -> dict:
    """Read the split as the Gate does, with no model: what any scoring pass over it costs at least."""
    import tensorflow as tf

    from hpml.components.gate.scoring import _label_feature, labelled_batches

    started = time.perf_counter()
    batches = labelled_batches(tf.io.gfile.glob(pattern), LABEL, _label_feature(schema, LABEL), 1024)
    examples = sum(int(serialized.shape[0]) for serialized, _ in batches)
    return {"seconds": time.perf_counter() - started, "examples": examples}


def _gate(examples: str, schema: str, model: str, champion: str, out: str) -> dict:
    from hpml.components.gate import GATE

    started = time.perf_counter()
    inputs = {"examples": examples, "schema": schema, "model": model, **({"baseline_model": model} if champion
                                                                          else {})}
    blessing = GATE.run(inputs, {"blessing": out}, {"label_key": LABEL})["blessing"]
    return {"seconds": time.perf_counter() - started, "examples": blessing["examples"],
            **blessing["scores"]["candidate"]}


def _child(kind: str, *args: str) -> None:
    import tensorflow  # noqa: F401 - imported before the clock starts
    import tensorflow_transform  # noqa: F401

    import hpml.v1  # noqa: F401

    if kind == "outputs":  # the run's artifacts, from its run record
        os.environ["HPML_HOME"] = args[0]
        from hpml.pipelines import records

        print(json.dumps(records.load(records.recent("scale", 1)[0].info.run_id).outputs))
    elif kind == "floor":
        print(json.dumps(_floor(*args)))
    else:
        print(json.dumps(_gate(*args)))


def _run(command: list[str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _prepare(rows: int, workdir: str) -> dict:
    """The CSV, the pipeline `hpml init` writes for it, one `hpml run` of it; the run's artifacts."""
    from scale_data import write_csv

    csv = write_csv(os.path.join(workdir, f"{rows}.csv"), rows)
    _module(workdir, csv)
    home = os.path.join(workdir, f"home-{rows}")
    run_hpml(os.path.join(workdir, "scale"), csv, home)
    outputs = _run([sys.executable, os.path.abspath(__file__), _CHILD, "outputs", home])
    return {"examples": outputs["ExampleGen"]["examples"], "schema": outputs["ExampleGen"]["schema"],
            "model": outputs["Trainer"]["model"]}


def _measure(kind: str, run: dict, out: str) -> dict:
    from hpml.components import artifacts

    me = [sys.executable, os.path.abspath(__file__), _CHILD]
    pattern = artifacts.examples_file_pattern(run["examples"], "eval")
    if kind == "floor":
        return _run([*me, "floor", pattern, run["schema"]])
    if kind.startswith("gate"):
        return _run([*me, "gate", run["examples"], run["schema"], run["model"],
                     "champion" if kind.endswith("champion") else "", out])
    return _run([TFX_PYTHON, os.path.join(HERE, "tfma_gate.py"), artifacts.serving_model_path(run["model"]),
                 pattern, LABEL, out, "champion" if kind.endswith("champion") else ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if not os.path.exists(TFX_PYTHON):
        sys.exit(f"{TFX_PYTHON} is missing: `make test-tfx` builds it")
    workdir = args.workdir or tempfile.mkdtemp(prefix="hpml-gate-bench-")
    sizes = []
    for rows in args.rows:
        run = _prepare(rows, workdir)
        samples: dict[str, list[dict]] = {kind: [] for kind in VARIANTS}
        for repeat in range(args.repeats):
            for kind in VARIANTS:
                if kind.startswith("tfma") and rows > TFMA_ONCE_ABOVE_ROWS and repeat:
                    continue
                out = tempfile.mkdtemp(prefix=f"{kind}-", dir=workdir)
                samples[kind].append(_measure(kind, run, out))
                print(rows, kind, json.dumps(samples[kind][-1]), flush=True)
        sizes.append({"rows": rows, "eval_examples": samples["floor"][0]["examples"],
                      **{kind: {"median_s": median([s["seconds"] for s in found]), "runs": found}
                         for kind, found in samples.items()}})
    data = {"machine": machine(), "repeats": args.repeats, "sizes": sizes}
    write_results("gate", data, render(data))


def render(data: dict) -> str:
    lines = ["# The Gate against TFX's model evaluation (TFMA)", "",
             f"Machine: {data['machine']['cpus']} CPUs, {data['machine']['platform']}, {data['machine']['date']}. "
             f"Medians of {data['repeats']} runs, each in a process of its own (TFMA once above "
             f"{TFMA_ONCE_ABOVE_ROWS:,} rows). `python benchmarks/gate.py` writes this file.", "",
             "The model of a 1-epoch `hpml run` of the scale pipeline, scored on its raw eval split through its "
             "serving signature: accuracy and log loss. *floor*: the split read and its labels parsed, no model. "
             "*with champion*: a second model (the same SavedModel) scored side by side.", "",
             "| rows | eval examples | floor | Gate | TFMA | TFMA / Gate | Gate with champion | TFMA with champion "
             "| TFMA / Gate, with champion | Gate / floor | accuracy: Gate, TFMA |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for size in data["sizes"]:
        floor, gate, tfma = (size[kind]["median_s"] for kind in ("floor", "gate", "tfma"))
        gate2, tfma2 = size["gate-champion"]["median_s"], size["tfma-champion"]["median_s"]
        lines.append(f"| {size['rows']:,} | {size['eval_examples']:,} | {floor:.2f} s | {gate:.2f} s | {tfma:.1f} s "
                     f"| {tfma / gate:.0f}x | {gate2:.2f} s | {tfma2:.1f} s | {tfma2 / gate2:.0f}x "
                     f"| {gate / floor:.1f}x "
                     f"| {size['gate']['runs'][0]['accuracy']:.6f}, {size['tfma']['runs'][0]['accuracy']:.6f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == _CHILD:
        _child(*sys.argv[2:])
    else:
        main()
