"""ExampleGen at the size of users' data: wall time, rows/s and peak RSS against rows, on generated CSVs of 16
numeric columns, 4 text columns and a binary label (`scale_data.py`), beside the machine's one-core limit for the
same work (Arrow's CSV reader and the native encoder, no Beam). Each run is a process of its own.

    python benchmarks/scale.py [--rows 100000 1000000 3000000] [--repeats 3] [--workdir DIR]

Writes benchmarks/results/scale.json and scale.md. Sizes above 1M rows run once.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import machine, median, peak_rss_mib, write_results  # noqa: E402

_CHILD = "--child"


def _child(kind: str, csv: str, out: str, extra: str) -> None:
    start = time.perf_counter()
    if kind == "limit":  # read, encode and GZIP-write on one core, no checks, no Beam
        import numpy as np
        import pyarrow.csv as pcsv

        from hpml.components.example_gen import example_encoder, shards

        reader = pcsv.open_csv(csv, read_options=pcsv.ReadOptions(block_size=8 << 20))
        with shards.ShardWriters(out, ["train"], 0, 1) as writers:
            for batch in reader:
                columns = {}
                for name in batch.schema.names:
                    column = batch.column(name)
                    columns[name] = column if not str(column.type).startswith("string") else column.cast("binary")
                writers.write(example_encoder.encode(columns, batch.num_rows), np.zeros(batch.num_rows, dtype=int))
    else:
        from hpml.components.example_gen import EXAMPLE_GEN

        params = {"input_path": csv}
        if kind == "hpml-2proc":
            params["beam_pipeline_args"] = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
        EXAMPLE_GEN.run({}, {"examples": os.path.join(out, "examples"), "schema": os.path.join(out, "schema")},
                        params)
    print(json.dumps({"seconds": time.perf_counter() - start, "peak_rss_mib": peak_rss_mib()}))


def _run(kind: str, csv: str, workdir: str) -> dict:
    out = tempfile.mkdtemp(dir=workdir)
    done = subprocess.run([sys.executable, __file__, _CHILD, kind, csv, out, ""], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    subprocess.run(["rm", "-rf", out], check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000, 3_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--note", default="", help="a line on how this run was made, printed in the results")
    args = parser.parse_args()
    from scale_data import write_csv

    workdir = args.workdir or tempfile.mkdtemp(prefix="hpml-scale-")
    results = {"machine": machine(), "sizes": {}, "note": args.note}
    for rows in args.rows:
        csv = os.path.join(workdir, f"{rows}.csv")
        if not os.path.exists(csv):
            write_csv(csv, rows)
        repeats = args.repeats if rows <= 1_000_000 else 1
        runs = {kind: [] for kind in ("limit", "hpml", "hpml-2proc")}
        for _ in range(repeats):  # interleaved, so that drift on this noisy machine hits every variant alike
            for kind in runs:
                runs[kind].append(_run(kind, csv, workdir))
        results["sizes"][rows] = {
            "csv_bytes": os.path.getsize(csv), "repeats": repeats,
            **{kind: {"seconds": median([r["seconds"] for r in rs]),
                      "peak_rss_mib": median([r["peak_rss_mib"] for r in rs]),
                      "rows_per_s": rows / median([r["seconds"] for r in rs])} for kind, rs in runs.items()}}
    write_results("scale", results, render(results))


def render(data: dict) -> str:
    lines = ["# ExampleGen at scale", "",
             f"Machine: {data['machine']['cpus']} cores, {data['machine']['platform']}, Python "
             f"{data['machine']['python']}, {data['machine']['date']}. Medians of the repeats shown; each run is a "
             "process of its own. `limit`: Arrow's CSV reader, the native encoder and the GZIP writer on one core, "
             "with no checks and no Beam. `hpml`: ExampleGen on Beam's in-process runner; `hpml-2proc`: on two "
             "worker processes. Seconds include starting the process and importing TensorFlow (about 5 s).",
             *(["", f"**{data['note']}**"] if data.get("note") else []), "",
             "| rows | CSV MB | repeats | variant | seconds | rows/s | peak RSS MiB | hpml / limit |",
             "|---|---|---|---|---|---|---|---|"]
    for rows, size in data["sizes"].items():
        for kind in ("limit", "hpml", "hpml-2proc"):
            stats = size[kind]
            ratio = stats["seconds"] / size["limit"]["seconds"]
            lines.append(f"| {int(rows):,} | {size['csv_bytes'] / 1e6:.0f} | {size['repeats']} | {kind} | "
                         f"{stats['seconds']:.1f} | {stats['rows_per_s']:,.0f} | {stats['peak_rss_mib']:.0f} | "
                         f"{ratio:.2f}x |")
    sizes = list(data["sizes"].values())
    if len(sizes) > 1:
        first, last = sizes[0], sizes[-1]
        lines += ["", f"Peak RSS from the smallest to the largest size: hpml "
                      f"{last['hpml']['peak_rss_mib'] / first['hpml']['peak_rss_mib']:.2f}x, hpml-2proc "
                      f"{last['hpml-2proc']['peak_rss_mib'] / first['hpml-2proc']['peak_rss_mib']:.2f}x "
                      "(the driver process; Beam's worker processes are not counted in the 2-process row)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == _CHILD:
        _child(*sys.argv[2:6])
    else:
        main()
