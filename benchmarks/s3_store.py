"""What an s3:// artifact root costs: `hpml run` of the pipeline `hpml init` writes for the scale benchmark's CSV
(ExampleGen, Transform and one Trainer epoch at batch_size 1024), with the artifact root on local disk and on an S3
server on loopback (moto's), side by side, in turn, each in a process of its own.

Beside them, the store's own limit on this machine: the seconds a plain copy of the run's artifact bytes takes down
and up, 8 files at a time through boto3 (what any client must move, without a pipeline around it).

    python benchmarks/s3_store.py [--rows 1000000] [--repeats 3] [--workdir DIR]

Writes benchmarks/results/s3_store.json and s3_store.md.
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
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)
from _common import machine, median, run_hpml, write_results  # noqa: E402

_CHILD = "--child"
ROOTS = ("local", "s3")


def _hpml_run(csv: str, pipeline_dir: str, home: str, root: str | None) -> dict:
    """`hpml run` in a process of its own (this child waits for it, so its peak RSS is the run's)."""
    import resource

    seconds = run_hpml(pipeline_dir, csv, home, **({"HPML_ARTIFACT_ROOT": root} if root else {}))
    os.environ.update(HPML_HOME=home)
    from hpml.pipelines import records

    run = records.recent("scale", 1)[0]
    summary = records.load(run.info.run_id)
    return {"seconds": seconds, "peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "eval_loss": run.data.metrics.get("eval_loss"), "run_dir": run.data.tags["hpml.run_dir"],
            **{f"{node}_s": value for node, value in summary.durations.items()}}


def _store_limit(run_dir: str, scratch: str) -> dict:
    """A plain download and upload of the run's artifacts (every object under its run folder), 8 files at a time
    (files.copy_tree, as hpml stages them)."""
    from hpml.components import files, s3_files

    listing = s3_files.list_etags(run_dir)
    total = sum(size for size, _ in listing.values())
    started = time.perf_counter()
    files.copy_tree(run_dir, scratch)
    down = time.perf_counter() - started
    started = time.perf_counter()
    files.copy_tree(scratch, run_dir + "-copy")
    up = time.perf_counter() - started
    return {"artifact_bytes": total, "download_s": down, "upload_s": up}


def _child(root_kind: str, csv: str, pipeline_dir: str, home: str, root: str) -> None:
    result = _hpml_run(csv, pipeline_dir, home, root if root_kind == "s3" else None)
    if root_kind == "s3":
        result.update(_store_limit(result["run_dir"], os.path.join(home, "limit")))
    print(json.dumps(result))


def _module(workdir: str, csv: str) -> str:
    if not os.path.exists(os.path.join(workdir, "scale", "pipeline.py")):
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "hpml"), "init", "scale", "--csv", csv,
                        "--label", "label"], cwd=workdir, check=True, capture_output=True)
    return os.path.join(workdir, "scale", "pipeline.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="where the CSV is generated (kept) and runs write")
    args = parser.parse_args()
    from scale_data import write_csv
    from tests.s3_store import S3Server

    workdir = args.workdir or tempfile.mkdtemp(prefix="hpml-s3-bench-")
    os.makedirs(workdir, exist_ok=True)
    csv = os.path.join(workdir, f"{args.rows}.csv")
    if not os.path.exists(csv):
        write_csv(csv, args.rows)
    pipeline = _module(workdir, csv)
    server = S3Server(bucket="hpml-bench").start()
    runs = []
    try:
        for repeat in range(args.repeats):
            one = {}
            for kind in ROOTS:  # in turn, so that drift on this noisy machine hits both alike
                home = tempfile.mkdtemp(dir=workdir, prefix=f"{kind}-")
                done = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), _CHILD, kind, csv, pipeline, home,
                     f"{server.root}/r{repeat}"], capture_output=True, text=True,
                    env={**os.environ, **server.env(), "TF_CPP_MIN_LOG_LEVEL": "2"})
                shutil.rmtree(home, ignore_errors=True)
                if done.returncode:
                    raise RuntimeError(done.stderr[-3000:])
                one[kind] = json.loads(done.stdout.strip().splitlines()[-1])
                print(kind, {k: v for k, v in one[kind].items() if k != "run_dir"}, flush=True)
            runs.append(one)
    finally:
        server.stop()
    keys = [k for k in runs[0]["local"] if k != "run_dir"]
    data = {"machine": machine(), "rows": args.rows, "csv_bytes": os.path.getsize(csv), "repeats": args.repeats,
            **{kind: {k: median([run[kind][k] for run in runs]) for k in keys} for kind in ROOTS}}
    data["s3"].update({k: median([run["s3"][k] for run in runs]) for k in ("artifact_bytes", "download_s",
                                                                          "upload_s")})
    write_results("s3_store", data, render(data))


def render(data: dict) -> str:
    local, s3 = data["local"], data["s3"]
    rows = [("end to end (wall)", "seconds"), ("ExampleGen", "ExampleGen_s"), ("Transform", "Transform_s"),
            ("Trainer", "Trainer_s"), ("peak RSS (MiB)", "peak_rss_mib")]
    lines = [f"# Artifact root on s3:// against local disk ({data['rows']:,} rows)", "",
             f"`hpml run` (ExampleGen, Transform, one Trainer epoch at batch_size 1024) on {data['machine']['cpus']} "
             f"cores, {data['machine']['date']}; medians of {data['repeats']} runs of each, in turn. The S3 server is "
             "moto's on loopback (in memory), so the ratio prices hpml's staging and the S3 protocol, not a "
             "network.", "",
             "| | local disk | s3:// | s3 / local |", "|---|---:|---:|---:|"]
    for name, key in rows:
        lines.append(f"| {name} | {local[key]:.1f} | {s3[key]:.1f} | {s3[key] / local[key]:.2f}x |")
    moved = s3["artifact_bytes"] / 2 ** 20
    lines += ["", f"The store's limit here: the run's artifacts ({moved:.0f} MiB) take {s3['download_s']:.1f} s to "
              f"download and {s3['upload_s']:.1f} s to upload, copied 8 files at a time with boto3 and nothing else.",
              "",
              f"Eval loss (median): local {local['eval_loss']:.6f}, s3:// {s3['eval_loss']:.6f}"
              + (" (the same model)." if local["eval_loss"] == s3["eval_loss"] else
                 " (the runs tuned their input pipeline or step differently: a measured choice, not the store)."), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == [_CHILD]:
        _child(*sys.argv[2:7])
    else:
        main()
