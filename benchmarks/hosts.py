"""One host against the test cluster: what it costs hpml's components to run with their pieces on different hosts.

Three variants of the same pipeline (ExampleGen, Transform, the Trainer with MultiWorkerMirrored on two workers),
each driven from the control host of the test cluster (tests/cluster.py), taking turns repeat by repeat:

- `one_host`: everything on the control host: artifacts on its disk, Beam in the driver's process, the two TF
  workers as local processes;
- `store`: the same, but every artifact and the input go through the object store on the storage host;
- `cluster`: the store, and the work on the worker hosts: ExampleGen on worker1's Beam SDK worker pool, Transform
  on worker2's, the Trainer as a Slurm job with a task on each worker host.

`store - one_host` is the cost of keeping artifacts on another host; `cluster - store` the cost of running the work
there. The limit row is the store's own speed: the input read from it, end to end, on the control host. All hosts
share this machine's cores, so no speed-up is possible here: what the numbers show is the overhead.

    sudo .venv/bin/python benchmarks/hosts.py [--repeats 5] [--rows 1000000]   # root: hosts are namespaces
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks._common import machine, median, write_results  # noqa: E402

COMPONENTS = ("ExampleGen", "Transform", "Trainer")
VARIANTS = ("one_host", "store", "cluster")
LABELS = {"one_host": "one host", "store": "one host, artifacts on the store host",
          "cluster": "test cluster (store, Beam pools, Slurm)"}
WORK = os.path.join(REPO, "test-artifacts", "bench-hosts")  # seen by every host, as an installed module would be

DRIVER = """
import json, sys, time
from hpml.components.example_gen import EXAMPLE_GEN
from hpml.components.transform import TRANSFORM
from hpml.components.trainer import TRAINER
job = json.loads(sys.argv[1])
root, seconds = job["root"], {}
gen = {"examples": f"{root}/examples", "schema": f"{root}/schema"}
transform = {key: f"{root}/{key}" for key in ("transform_graph", "transformed_examples", "input_pipeline")}
model = {"model": f"{root}/model", "model_run": f"{root}/model_run"}
steps = [
    ("ExampleGen", EXAMPLE_GEN, {}, gen, {**job["example_gen"], "beam_pipeline_args": job["example_gen_args"]}),
    ("Transform", TRANSFORM, gen, transform, {"module": job["module"], "beam_pipeline_args": job["transform_args"]}),
    ("Trainer", TRAINER, {"examples": transform["transformed_examples"], "schema": gen["schema"],
                          "transform_graph": transform["transform_graph"],
                          "input_pipeline": transform["input_pipeline"]}, model, job["trainer"]),
]
for name, component, inputs, outputs, params in steps:
    began = time.perf_counter()
    component.run(inputs, outputs, params)
    seconds[name] = time.perf_counter() - began
print("RESULT " + json.dumps(seconds))
"""

READ = """
import sys, time
import tensorflow as tf
began, size = time.perf_counter(), 0
with tf.io.gfile.GFile(sys.argv[1], "rb") as source:
    while chunk := source.read(8 << 20):
        size += len(chunk)
print(f"RESULT {time.perf_counter() - began} {size}")
"""


class Bench:
    """The test cluster with the store, Beam's pools and Slurm, and the data each dataset needs on it."""

    def __init__(self, rows: int):
        from tests.cluster import Cluster
        from tests.cluster_services import ClusterStore, SlurmCluster, beam_job_service, beam_worker_pool

        self.cluster = Cluster().up()
        try:
            self.store = ClusterStore(self.cluster).start()
            self.control = self.cluster["control"]
            for worker in ("worker1", "worker2"):
                beam_worker_pool(self.cluster[worker], self.store.env(self.cluster[worker]))
            beam_job_service(self.control, self.store.env(self.control))
            self.slurm = SlurmCluster(self.cluster).start()
            self.datasets = self._datasets(rows)
        except BaseException:
            self.cluster.down()
            raise

    def _datasets(self, rows: int) -> dict:
        from benchmarks.scale_data import write_csv
        from hpml.examples.penguin.pipeline import penguins_csv
        from tests.helpers import store_env

        shutil.rmtree(WORK, ignore_errors=True)
        os.makedirs(WORK)
        scale_csv = write_csv(os.path.join(WORK, "scale.csv"), rows)
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "hpml"), "init", "scale", "--csv", scale_csv,
                        "--label", "label"], cwd=WORK, check=True, capture_output=True)
        datasets = {
            "penguin": {"csv": penguins_csv(), "rows": 344, "module": "hpml.examples.penguin.module",
                        "example_gen": {}, "hyperparameters": {"epochs": 10, "batch_size": 32}},
            f"{rows:,} rows": {"csv": scale_csv, "rows": rows, "module": os.path.join(WORK, "scale", "module.py"),
                               "example_gen": {"required_columns": ["label"]},
                               "hyperparameters": {"epochs": 1, "batch_size": 1024}},
        }
        with store_env(self.store.env(None)):
            import tensorflow as tf

            for data in datasets.values():
                local = self.control.dir / "tmp" / "data" / os.path.basename(data["csv"])
                local.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(data["csv"], local)
                data["paths"] = {"local": f"/tmp/data/{local.name}",
                                 "store": f"{self.store.root}/data/{local.name}"}
                tf.io.gfile.copy(data["csv"], data["paths"]["store"], overwrite=True)
                data["bytes"] = os.path.getsize(data["csv"])
        return datasets

    def env(self) -> dict:
        return {**self.store.env(self.control), **self.slurm.env(self.control)}

    def run(self, dataset: dict, variant: str, repeat: int) -> dict:
        from tests.cluster_services import portable_args

        on_store = variant != "one_host"
        root = f"{self.store.root}/runs/{variant}-{repeat}" if on_store else f"/tmp/runs/{variant}-{repeat}"
        trainer = {"module": dataset["module"], "strategy": "multi_worker_mirrored", "num_workers": 2,
                   "hyperparameters": dataset["hyperparameters"], "launcher": "local"}
        if variant == "cluster":
            trainer.update(launcher="slurm", cluster={"poll_seconds": 1, "timeout_seconds": 1800})
        job = {"root": root, "module": dataset["module"], "trainer": trainer,
               "example_gen": {**dataset["example_gen"],
                               "input_path": dataset["paths"]["store" if on_store else "local"]},
               "example_gen_args": portable_args(self.cluster["worker1"]) if variant == "cluster" else [],
               "transform_args": portable_args(self.cluster["worker2"]) if variant == "cluster" else []}
        began = time.perf_counter()
        done = self.control.run([sys.executable, "-c", DRIVER, json.dumps(job)], env=self.env(), timeout=3600,
                                check=False)
        total = time.perf_counter() - began
        if done.returncode:
            raise RuntimeError(f"{variant} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        seconds = json.loads(line[len("RESULT "):])
        self._remove(root)
        # Starting the process, imports and TensorFlow's start-up: what the components' own times leave out.
        return {"total_s": total, "start_s": total - sum(seconds.values()), **seconds}

    def limit(self, dataset: dict) -> float:
        """Seconds to read the input from the store on the control host, TensorFlow's client and all."""
        done = self.control.run([sys.executable, "-c", READ, dataset["paths"]["store"]], env=self.env())
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        seconds, size = line.split()[1:]
        assert int(size) == dataset["bytes"], (size, dataset["bytes"])
        return float(seconds)

    def _remove(self, root: str) -> None:
        if root.startswith("gs://"):
            from tests.helpers import store_env

            with store_env(self.store.env(None)):
                import tensorflow as tf

                tf.io.gfile.rmtree(root)
        else:
            shutil.rmtree(self.control.path(root), ignore_errors=True)

    def down(self) -> None:
        self.cluster.down()
        shutil.rmtree(WORK, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--render", action="store_true", help="rewrite hosts.md from hosts.json, running nothing")
    args = parser.parse_args()
    if args.render:
        from benchmarks._common import RESULTS

        results = json.loads((RESULTS / "hosts.json").read_text())
        write_results("hosts", results, render(results))
        return

    bench = Bench(args.rows)
    results = {"machine": machine(), "repeats": args.repeats, "variants": args.variants, "datasets": {}}
    try:
        for name, dataset in bench.datasets.items():
            runs = {variant: [] for variant in args.variants}
            limits = []
            for repeat in range(args.repeats):
                for variant in args.variants:  # turns, so that a slow spell of the machine falls on every variant
                    runs[variant].append(bench.run(dataset, variant, repeat))
                    print(f"{name} {variant} {repeat + 1}/{args.repeats}: "
                          + ", ".join(f"{k} {v:.1f} s" for k, v in runs[variant][-1].items()), flush=True)
                limits.append(bench.limit(dataset))
            results["datasets"][name] = {
                "rows": dataset["rows"], "bytes": dataset["bytes"], "runs": runs, "limit_read_s": limits,
                "median": {variant: {key: median([run[key] for run in values]) for key in values[0]}
                           for variant, values in runs.items()}}
    finally:
        bench.down()
    write_results("hosts", results, render(results))


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def render(results: dict) -> str:
    lines = ["# One host against the test cluster", "",
             f"Machine: {results['machine']['cpus']} cores, {results['machine']['platform']}, Python "
             f"{results['machine']['python']}, {results['machine']['date']}. Medians of {results['repeats']} repeats; "
             "the variants take turns within each repeat. Made by `benchmarks/hosts.py`.", "",
             "Every variant runs ExampleGen, Transform and the Trainer (MultiWorkerMirrored, two workers) from one "
             "driver process on the control host. `one host`: artifacts on its disk, Beam in the driver, the TF "
             "workers as local processes. `store`: the same with every artifact and the input on the object store "
             "of the storage host (the gcp-storage-emulator behind a TLS front, a Python server holding objects in "
             "memory: a production store is faster). `cluster`: the store, and ExampleGen's work on worker1's Beam "
             "SDK worker pool, Transform's on worker2's, the Trainer as a Slurm job with one task on each worker "
             "host.", "",
             "**All four hosts are network namespaces on this one machine and share its cores: no speed-up is "
             "possible, and none is expected. The numbers are the cost of crossing hosts.** `limit` is the time "
             "to read the input CSV from the store on the control host, TensorFlow's own client, imports not "
             "counted: no variant that reads its input from the store can be faster than that. `start-up` is the "
             "driver's total less its components' own times: starting the process on its host and importing "
             "TensorFlow.", ""]
    for name, data in sorted(results["datasets"].items(), key=lambda item: item[1]["rows"]):
        medians = data["median"]
        size = f"{data['bytes'] / 1e6:,.0f} MB" if data["bytes"] >= 1e6 else f"{data['bytes'] / 1e3:,.0f} kB"
        lines += [f"## {name} ({size} of CSV)", "",
                  "| variant | total s | ExampleGen s | Transform s | Trainer s | start-up s | total / one host |",
                  "|---|---|---|---|---|---|---|"]
        base = medians.get("one_host", {}).get("total_s", 0)
        for variant, values in medians.items():
            lines.append(f"| {LABELS[variant]} | {values['total_s']:.1f} | {values['ExampleGen']:.1f} | "
                         f"{values['Transform']:.1f} | {values['Trainer']:.1f} | {values['start_s']:.1f} | "
                         f"{_ratio(values['total_s'], base)} |")
        read_s = median(data["limit_read_s"])
        lines += ["", f"Limit: the input read from the store in {read_s:.2f} s "
                      f"({data['bytes'] / 1e6 / max(read_s, 1e-9):,.1f} MB/s).", ""]
        if {"one_host", "store", "cluster"} <= set(medians):
            lines += ["| component | store / one host | cluster / store | cluster / one host |", "|---|---|---|---|"]
            for component in (*COMPONENTS, "total_s"):
                one, store, cluster = (medians[v][component] for v in ("one_host", "store", "cluster"))
                lines.append(f"| {component.replace('total_s', 'total')} | {_ratio(store, one)} | "
                             f"{_ratio(cluster, store)} | {_ratio(cluster, one)} |")
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
