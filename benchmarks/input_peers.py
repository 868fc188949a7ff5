"""hpml's tuned input pipeline against what users would otherwise use: TFX's data accessor and an expert's tf.data.

    python benchmarks/input_peers.py [--repeats 5] [--examples 200000]

Two data shapes, each in 8 GZIP shards of tf.Examples, batch 256, with a transform that runs once per
record before any cache (hpml, expert) or on every batch of every epoch (TFXIO, as in a TFX run_fn):
  floats:  B2's data (16 float features, an elementwise transform);
  strings: 4 string features and a variable-length list of 0-4 string tags, each looked up in its
           vocabulary (as tf.Transform's vocabularies are applied), and 4 float features.
Pipelines, each in its own process, side by side in every repeat (medians reported):
  tfxio:          tfx_bsl's TFExampleRecord(...).TensorFlowDataset, what TFX's Trainer hands a run_fn
                  (shuffled, endless), then the transform as a parallel map and a prefetch;
  expert:         the tf.data guide's pipeline written by an expert: a parallel, unordered interleave of the
                  shards, each read in batches (interleaving single records costs ~3 s more per cold
                  epoch of the floats data here), vectorised parse_example and transform, cache, shuffle
                  whole batches, repeat, prefetch AUTOTUNE. Records of a batch stay together in every
                  epoch, and each shard ends in a short batch;
  expert-records: the same with each record shuffled in a buffer as large as the data, after the cache:
                  the shuffle hpml's tuned spec gives this data (each warm epoch a full permutation);
  hpml:           the spec hpml's Transform tunes for this data, read by `build_dataset`.
An epoch is timed as the batches holding `examples` records, consumed in a tf.function loop (Python's
per-batch cost is not counted).
Consumers, input stall = 1 - step time from memory / step time from the pipeline (the Trainer's own measure):
  B3:      B3's MLP on the floats data, the 5 warm epochs after the first in 50-step blocks;
  penguin: penguin's model on its transformed train split (217 rows, batch 32), as its Trainer reads it.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import input_pipeline as b2  # noqa: E402
from benchmarks._common import machine, median, peak_rss_mib, write_results  # noqa: E402

SHAPES = ("floats", "strings")
PIPELINES = ("tfxio", "expert", "expert-records", "hpml")
CONSUMER_PIPELINES = ("tfxio", "expert-records", "hpml")
BATCH, SHARDS, WARM_EPOCHS = 256, 8, 3
CATEGORIES = {"cat0": 10, "cat1": 100, "cat2": 1000, "cat3": 5000}  # feature: vocabulary size
TAGS, MAX_TAGS, NUMBERS = 200, 4, 4
PENGUIN_BATCH, PENGUIN_WARM_STEPS = 32, 70
HPML = os.path.join(os.path.dirname(sys.executable), "hpml")


# ---------------------------------------------------------------- the strings data and its transform

def _strings_schema():
    import tensorflow as tf
    from tensorflow_transform.tf_metadata import schema_utils

    spec = {name: tf.io.FixedLenFeature([], tf.string) for name in CATEGORIES}
    spec["tags"] = tf.io.VarLenFeature(tf.string)
    spec.update({f"n{i}": tf.io.FixedLenFeature([], tf.float32) for i in range(NUMBERS)})
    spec["label"] = tf.io.FixedLenFeature([], tf.int64)
    return schema_utils.schema_from_feature_spec(spec)


def _vocabulary(name: str, size: int) -> list[str]:
    return [f"{name}-{i}" for i in range(size)]


def _generate_strings(folder: str, examples: int) -> list[str]:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    per_shard = -(-examples // SHARDS)
    files = []
    for shard in range(SHARDS):
        path = os.path.join(folder, f"part-{shard:05d}-of-{SHARDS:05d}.gz")
        rows = max(0, min(per_shard, examples - shard * per_shard))
        picks = {name: rng.zipf(1.3, size=rows) % size for name, size in CATEGORIES.items()}
        tags, counts = rng.integers(0, TAGS, size=(rows, MAX_TAGS)), rng.integers(0, MAX_TAGS + 1, size=rows)
        numbers = rng.normal(size=(rows, NUMBERS)).astype("float32")
        with tf.io.TFRecordWriter(path, "GZIP") as writer:
            for row in range(rows):
                feature = {name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"{name}-{picks[name][row]}"
                                                                                      .encode()]))
                           for name in CATEGORIES}
                feature["tags"] = tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[f"tag-{t}".encode() for t in tags[row, :counts[row]]]))
                feature.update({f"n{i}": tf.train.Feature(float_list=tf.train.FloatList(value=[numbers[row, i]]))
                                for i in range(NUMBERS)})
                feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(
                    value=[int(picks["cat0"][row] % 2 == 0) ^ int(numbers[row, 0] > 0)]))
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        files.append(path)
    return files


class StringsTransform:
    """Vocabulary lookups (0 for a value outside the vocabulary) and a scaled copy of the numbers.

    The tables are made once, eagerly, and captured by every dataset function that calls this.
    """

    def __init__(self):
        import tensorflow as tf

        def table(words):
            init = tf.lookup.KeyValueTensorInitializer(tf.constant(words), tf.range(1, len(words) + 1, dtype=tf.int64))
            return tf.lookup.StaticHashTable(init, default_value=0)

        self.tables = {name: table(_vocabulary(name, size)) for name, size in CATEGORIES.items()}
        self.tables["tags"] = table(_vocabulary("tag", TAGS))

    def __call__(self, features):
        import tensorflow as tf

        out = {name: value for name, value in features.items() if name == "label"}
        for name in CATEGORIES:
            out[name] = self.tables[name].lookup(features[name])
        out["tags"] = tf.sparse.map_values(self.tables["tags"].lookup, features["tags"])
        for i in range(NUMBERS):
            value = features[f"n{i}"]
            out[f"n{i}"] = tf.math.log1p(tf.abs(value)) * tf.sign(value)
        return out


def _shape(name: str):
    """(schema, transform) of a data shape."""
    if name == "floats":
        return b2._schema(), b2.transform
    return _strings_schema(), StringsTransform()


# ---------------------------------------------------------------- the pipelines

def _split_label(features, label_key: str):
    features = dict(features)
    return features, features.pop(label_key)


def expert_dataset(files: list[str], feature_spec: dict, transform, batch: int, examples: int, *,
                   shuffle_records: bool, label_key: str, seed: int = 1):
    """The tf.data guide's pipeline as an expert writes it, shuffling whole batches or, with
    `shuffle_records`, every record in a buffer as large as the data."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type="GZIP").batch(batch),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    dataset = dataset.map(
        lambda records: _split_label(transform(tf.io.parse_example(records, feature_spec)), label_key),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=False).cache()
    if shuffle_records:
        dataset = dataset.unbatch().shuffle(examples, seed=seed, reshuffle_each_iteration=True).batch(batch)
    else:
        dataset = dataset.shuffle(-(-examples // batch), seed=seed, reshuffle_each_iteration=True)
    return dataset.repeat().prefetch(tf.data.AUTOTUNE)


def tfxio_dataset(files: list[str], schema, transform, batch: int, *, label_key: str, seed: int = 1):
    """TFX's data accessor for tf.Example files, then the transform on each batch (a run_fn's map)."""
    import tensorflow as tf
    from tfx_bsl.public import tfxio

    options = tfxio.TensorFlowDatasetOptions(batch_size=batch, shuffle=True, shuffle_seed=seed, num_epochs=None,
                                             label_key=label_key)
    dataset = tfxio.TFExampleRecord(file_pattern=files, schema=schema, telemetry_descriptors=["bench"]) \
        .TensorFlowDataset(options)
    dataset = dataset.map(lambda features, label: _split_label(transform({**features, label_key: label}), label_key),
                          num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def pipeline(name: str, files: list[str], schema, transform, batch: int, spec_path: str, examples: int,
             label_key: str = "label"):
    """The named pipeline over `files`, endless, yielding (features, label) batches."""
    from tensorflow_transform.tf_metadata import schema_utils

    from hpml.components.input_pipeline import InputPipelineSpec, build_dataset

    if name == "hpml":
        spec = InputPipelineSpec.from_json(open(spec_path).read())
        return build_dataset(spec, files, schema, label_key=label_key, batch_size=batch, shuffle=True,
                             num_epochs=None, seed=1, transform=transform)
    transform = transform or (lambda features: features)
    if name == "tfxio":
        return tfxio_dataset(files, schema, transform, batch, label_key=label_key)
    feature_spec = schema_utils.schema_as_feature_spec(schema).feature_spec
    return expert_dataset(files, feature_spec, transform, batch, examples, shuffle_records=name == "expert-records",
                          label_key=label_key)


# ---------------------------------------------------------------- children, each in its own process

def child_epochs(shape: str, name: str, folder: str, spec_path: str, examples: int) -> dict:
    """One cold and WARM_EPOCHS warm epochs, consumed in a tf.function loop, and peak RSS."""
    import tensorflow as tf

    schema, transform = _shape(shape)
    files = sorted(glob.glob(os.path.join(folder, "*.gz")))
    iterator = iter(pipeline(name, files, schema, transform, BATCH, spec_path, examples))

    @tf.function
    def consume(wanted):
        """Batches until `wanted` records have passed: an epoch, whatever its batches' sizes."""
        rows = tf.constant(0, tf.int64)
        while rows < wanted:
            _, label = next(iterator)
            rows += tf.shape(label, out_type=tf.int64)[0]
        return rows

    consume(tf.constant(0, tf.int64))  # traced here, not inside the cold epoch
    epochs, cpu = [], []
    for _ in range(1 + WARM_EPOCHS):
        start, start_cpu = time.perf_counter(), time.process_time()
        consume(tf.constant(examples, tf.int64)).numpy()
        epochs.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return {"cold_s": epochs[0], "warm_s": median(epochs[1:]), "cold_cpu_s": cpu[0], "warm_cpu_s": median(cpu[1:]),
            "peak_rss_mib": peak_rss_mib()}


def child_b3(name: str, folder: str, spec_path: str, examples: int) -> dict:
    """B3's MLP trained from the pipeline: warm input stall (5 epochs after the first)."""
    from hpml.components.trainer.input_stall import measure_input_stall

    files = sorted(glob.glob(os.path.join(folder, "*.gz")))
    dataset = pipeline(name, files, b2._schema(), b2.transform_to_matrix, BATCH, spec_path, examples)
    model = b2.b3_model()
    model.fit(dataset, steps_per_epoch=5, epochs=1, verbose=0)  # build and trace
    epoch = -(-examples // BATCH)
    warm = measure_input_stall(model, dataset, steps=epoch, repeats=5, warmup=epoch)
    return {"stall_fraction": warm["stall_fraction"], "real_step_s": warm["real_step_s"],
            "in_memory_step_s": warm["in_memory_step_s"], "peak_rss_mib": peak_rss_mib()}


def _penguin_run(home: str) -> str:
    """The Transform output folder of a fresh penguin run under HPML_HOME=`home`."""
    done = subprocess.run([HPML, "run", "penguin", "--param", "strategy=one_device"], capture_output=True, text=True,
                          env=dict(os.environ, HPML_HOME=home), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"hpml run penguin failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    (transform,) = glob.glob(os.path.join(home, "artifacts", "penguin", "*", "Transform"))
    return transform


def child_penguin(name: str, transform_dir: str) -> dict:
    """Penguin's model trained from its transformed train split: input stall after 2 warm-up epochs."""
    import tensorflow as tf
    import tensorflow_transform as tft

    from hpml.components.trainer.input_stall import measure_input_stall
    from hpml.examples.penguin import module

    output = tft.TFTransformOutput(os.path.join(transform_dir, "transform_graph"))
    files = sorted(glob.glob(os.path.join(transform_dir, "transformed_examples", "Split-train", "*")))
    schema = output.transformed_metadata.schema
    rows = sum(1 for _ in tf.data.TFRecordDataset(files, compression_type="GZIP"))
    dataset = pipeline(name, files, schema, None, PENGUIN_BATCH,
                       os.path.join(transform_dir, "input_pipeline", "input_pipeline.json"), rows,
                       label_key=module.LABEL_KEY)
    model = module.build_model(output, 0.01, 1, None)
    epoch = -(-rows // PENGUIN_BATCH)
    model.fit(dataset, steps_per_epoch=epoch, epochs=2, verbose=0)
    result = measure_input_stall(model, dataset, steps=PENGUIN_WARM_STEPS, repeats=5, warmup=2 * epoch)
    return {"stall_fraction": result["stall_fraction"], "real_step_s": result["real_step_s"],
            "in_memory_step_s": result["in_memory_step_s"], "rows": rows}


def _run_child(*args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"child {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the run and its tables

def _prepare(shape: str, workdir: str, examples: int) -> tuple[str, str]:
    """The shape's data folder and the path of the spec hpml tunes for it."""
    from hpml.components.input_pipeline import measure_tfrecords, schema_fingerprint, tune, write_spec

    folder = os.path.join(workdir, shape)
    os.makedirs(folder)
    started = time.perf_counter()
    files = b2.generate(folder, examples, SHARDS) if shape == "floats" else _generate_strings(folder, examples)
    schema, transform = _shape(shape)
    measured = measure_tfrecords(files, schema, compression="GZIP", batch_size=BATCH, transform=transform)
    spec_dir = os.path.join(workdir, f"{shape}-spec")
    os.makedirs(spec_dir)
    write_spec(tune(measured, schema_fingerprint=schema_fingerprint(schema), batch_size=BATCH), spec_dir)
    print(f"{shape}: {examples} examples written and tuned in {time.perf_counter() - started:.0f}s", flush=True)
    return folder, os.path.join(spec_dir, "input_pipeline.json")


def _ratio(runs: dict, a: str, b: str, key: str) -> float:
    """Median over repeats of a's `key` / b's: both measured in the same repeat, so one slow spell hits both."""
    return median([x[key] / y[key] for x, y in zip(runs[a], runs[b])])


def run(repeats: int, examples: int, workdir: str) -> dict:
    data = {shape: _prepare(shape, workdir, examples) for shape in SHAPES}
    penguin = _penguin_run(os.path.join(workdir, "home"))
    epochs = {shape: {name: [] for name in PIPELINES} for shape in SHAPES}
    b3 = {name: [] for name in PIPELINES}
    penguin_runs = {name: [] for name in CONSUMER_PIPELINES}
    for rep in range(repeats):
        for shape, (folder, spec) in data.items():
            for name in PIPELINES:
                epochs[shape][name].append(_run_child("epochs", shape, name, folder, spec, str(examples)))
        for name in PIPELINES:
            b3[name].append(_run_child("b3", "floats", name, *data["floats"], str(examples)))
        for name in CONSUMER_PIPELINES:
            penguin_runs[name].append(_run_child("penguin", "-", name, penguin, "-", "0"))
        print(f"repeat {rep + 1}/{repeats}: " + "; ".join(
            f"{shape} " + ", ".join(f"{n} {r[-1]['cold_s']:.2f}/{r[-1]['warm_s']:.2f}s" for n, r in runs.items())
            for shape, runs in epochs.items()) + "; B3 stall " + ", ".join(
            f"{n} {r[-1]['stall_fraction']:.1%}" for n, r in b3.items()) + "; penguin stall " + ", ".join(
            f"{n} {r[-1]['stall_fraction']:.1%}" for n, r in penguin_runs.items()), flush=True)

    def medians(runs):
        return {name: {key: median([r[key] for r in rs]) for key in rs[0]} for name, rs in runs.items()}

    shapes = {}
    for shape, runs in epochs.items():
        ratios = {f"hpml_over_{peer}": {key: _ratio(runs, "hpml", peer, key) for key in ("cold_s", "warm_s")}
                  for peer in ("expert", "expert-records")}
        ratios["tfxio_over_hpml_warm"] = _ratio(runs, "tfxio", "hpml", "warm_s")
        shapes[shape] = {"medians": medians(runs), "runs": runs, **ratios, "targets": {
            "hpml_le_expert_records": max(ratios["hpml_over_expert-records"].values()) <= 1.0,
            "hpml_le_expert": max(ratios["hpml_over_expert"].values()) <= 1.0,
            "hpml_ge_3x_tfxio_warm": ratios["tfxio_over_hpml_warm"] >= 3.0}}
    b3_medians, penguin_medians = medians(b3), medians(penguin_runs)
    for table in (b3_medians, penguin_medians):
        for row in table.values():
            row["memory_over_real"] = row["in_memory_step_s"] / row["real_step_s"]
    return {"examples": examples, "shapes": shapes,
            "b3": {"medians": b3_medians, "runs": b3, "targets": {
                "hpml_stall_le_expert_records": b3_medians["hpml"]["stall_fraction"]
                <= b3_medians["expert-records"]["stall_fraction"],
                "hpml_real_over_memory_ge_0.95": b3_medians["hpml"]["memory_over_real"] >= 0.95}},
            "penguin": {"medians": penguin_medians, "runs": penguin_runs, "targets": {
                "hpml_stall_lt_5pct": penguin_medians["hpml"]["stall_fraction"] < 0.05,
                "hpml_real_over_memory_ge_0.95": penguin_medians["hpml"]["memory_over_real"] >= 0.95}}}


# Why hpml can take longer than the expert that shuffles whole batches (what each shape's extra work is).
WHY_SLOWER_THAN_BATCH_SHUFFLE = {
    "floats": "Why hpml is over the batch-shuffling expert's time: that expert hands out its cached batches as they "
              "are, while every warm epoch of hpml's gathers each record anew into a fresh permutation (the whole "
              "data copied once an epoch) and the batches are cut from it. The same record shuffle costs the "
              "expert far more (expert-records).",
    "strings": "Why hpml is over the batch-shuffling expert's time: besides the fresh permutation each epoch (see "
               "floats), each batch's variable-length tags are rebuilt from ragged rows into a sparse tensor; the "
               "expert caches finished sparse batches and never re-forms one. The first epoch also permutes its "
               "windows and packs the cache, which the expert's cold epoch does not.",
}


def _in_order(rows: dict) -> list:
    """(name, row) in PIPELINES' order: the results file's keys come back sorted."""
    return [(name, rows[name]) for name in PIPELINES if name in rows]


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def render(data: dict) -> str:
    results, lines = data["results"], []
    lines += [f"Input pipelines against their peers ({data['machine']['cpus']} CPUs, {data['machine']['date']}), "
              f"medians of {data['repeats']} runs; every pipeline in its own process, side by side in each run. "
              "What each pipeline is: the docstring of `benchmarks/input_peers.py`.", ""]
    described = {"floats": f"{results['examples']} tf.Examples, 16 float features",
                 "strings": f"{results['examples']} tf.Examples, 4 string features and 0-{MAX_TAGS} string tags "
                            "looked up in vocabularies, 4 floats"}
    for shape, result in results["shapes"].items():
        m = result["medians"]
        lines += [f"**{shape}** ({described[shape]}, {SHARDS} GZIP shards, batch {BATCH})", "",
                  "| pipeline | shuffle | cold epoch s | warm epoch s | cold CPU s | warm CPU s | peak RSS MiB |",
                  "|---|---|---|---|---|---|---|"]
        shuffles = {"tfxio": "records, 10000-record buffer (TFXIO's default)", "expert": "whole batches",
                    "expert-records": "records, buffer = the data", "hpml": "records, full permutation"}
        lines += [f"| {name} | {shuffles[name]} | {row['cold_s']:.2f} | {row['warm_s']:.3f} | {row['cold_cpu_s']:.2f} "
                  f"| {row['warm_cpu_s']:.2f} | {row['peak_rss_mib']:.0f} |" for name, row in _in_order(m)]
        same, guide, targets = result["hpml_over_expert-records"], result["hpml_over_expert"], result["targets"]
        lines += ["", f"hpml / expert-records (the same shuffle quality), median of per-run ratios: cold "
                  f"{same['cold_s']:.2f}x, warm {same['warm_s']:.2f}x; target <= 1.0x: "
                  f"{_met(targets['hpml_le_expert_records'])}. hpml / expert (whole batches shuffled, a weaker "
                  f"shuffle): cold {guide['cold_s']:.2f}x, warm {guide['warm_s']:.2f}x ("
                  f"{'at most' if targets['hpml_le_expert'] else '**over**'} 1.0x). TFXIO / hpml, warm: "
                  f"{result['tfxio_over_hpml_warm']:.1f}x; target >= 3x: {_met(targets['hpml_ge_3x_tfxio_warm'])}.", ""]
        if not targets["hpml_le_expert"]:
            lines += [WHY_SLOWER_THAN_BATCH_SHUFFLE[shape], ""]
    for key, title in (("b3", "**B3's consumer** (the MLP 16-256-256-2 on the floats data, batch 256; the 5 warm "
                               "epochs after the first, in 50-step blocks alternating with the same batches from "
                               "memory)"),
                       ("penguin", f"**Penguin's Trainer model** (its transformed train split, batch {PENGUIN_BATCH}; "
                                   f"{PENGUIN_WARM_STEPS} x 5 steps after 2 warm-up epochs, in 50-step blocks)")):
        m, targets = results[key]["medians"], results[key]["targets"]
        lines += [title, "", "| pipeline | input stall | step ms from pipeline | step ms from memory "
                  "| examples/s from pipeline / from memory |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {row['stall_fraction']:.1%} | {row['real_step_s'] * 1e3:.3f} | "
                  f"{row['in_memory_step_s'] * 1e3:.3f} | {row['memory_over_real']:.3f} |"
                  for name, row in _in_order(m)]
        verdicts = [f"hpml's examples/s from the pipeline / from memory >= 0.95: "
                    f"{_met(targets['hpml_real_over_memory_ge_0.95'])}."]
        if key == "b3":
            verdicts.insert(0, "hpml's stall no higher than expert-records': "
                               f"{_met(targets['hpml_stall_le_expert_records'])}.")
        else:
            verdicts.insert(0, f"hpml's stall < 5%: {_met(targets['hpml_stall_lt_5pct'])}.")
        lines += ["", " ".join(verdicts), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--examples", type=int, default=200_000)
    parser.add_argument("--child", nargs=6, metavar=("KIND", "SHAPE", "PIPELINE", "DATA", "SPEC", "EXAMPLES"))
    args = parser.parse_args()
    if args.child:
        kind, shape, name, folder, spec, examples = args.child
        if kind == "epochs":
            result = child_epochs(shape, name, folder, spec, int(examples))
        elif kind == "b3":
            result = child_b3(name, folder, spec, int(examples))
        else:
            result = child_penguin(name, folder)
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory(prefix="hpml-bench-peers-") as workdir:
        results = run(args.repeats, args.examples, workdir)
    data = {"machine": machine(), "repeats": args.repeats, "results": results}
    write_results("input_peers", data, render(data))


if __name__ == "__main__":
    main()
