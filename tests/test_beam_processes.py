"""Beam beyond one process: ExampleGen and Transform on Beam's multi-process runner (two SDK worker processes),
writing to the object store on loopback, write what the in-process runner writes to local disk. SoftTargets
likewise, in test_distill_pipeline.py."""
import logging
import os

import numpy as np
import tensorflow as tf

from hpml.components.example_gen import EXAMPLE_GEN
from hpml.components.transform import TRANSFORM

TWO_PROCESSES = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def _records(folder: str, split: str) -> list[bytes]:
    files = tf.io.gfile.glob(os.path.join(folder, f"Split-{split}", "*.gz"))
    assert files, folder
    return sorted(r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP"))


def _rows(folder: str, split: str) -> np.ndarray:
    """Each transformed example as a row of its features' values (names sorted), rows sorted."""
    rows = []
    for record in _records(folder, split):
        features = tf.train.Example.FromString(record).features.feature
        row = []
        for name in sorted(features):
            kind = features[name].WhichOneof("kind")
            row.extend(float(v) for v in getattr(features[name], kind).value)
        rows.append(row)
    return np.array(sorted(rows, key=lambda row: [round(v, 4) for v in row]))


def _assets(transform_graph: str) -> dict:
    folder = os.path.join(transform_graph, "transform_fn", "assets")
    return {name: tf.io.gfile.GFile(os.path.join(folder, name), "rb").read()
            for name in sorted(tf.io.gfile.listdir(folder))}


def test_example_gen_and_transform_in_two_beam_processes_write_the_in_process_output(tmp_path, penguin_csv, caplog,
                                                                                      gcs):
    runs = {}
    for name, args, root in (("in_process", [], str(tmp_path)),
                             ("two_processes", TWO_PROCESSES, f"{gcs.root}/{tmp_path.name}")):
        gen = {"examples": f"{root}/{name}/examples", "schema": f"{root}/{name}/schema"}
        transform = {key: f"{root}/{name}/{key}" for key in ("transform_graph", "transformed_examples",
                                                            "input_pipeline")}
        with caplog.at_level(logging.INFO):
            caplog.clear()
            EXAMPLE_GEN.run({}, gen, {"input_path": penguin_csv, "beam_pipeline_args": args})
            TRANSFORM.run(gen, transform, {"module": "hpml.examples.penguin.module", "beam_pipeline_args": args})
            runs[name] = (gen, transform, caplog.text)
    (gen, transform, _), (gen2, transform2, log2) = runs["in_process"], runs["two_processes"]
    # Each SDK worker process logs its start through the job service; the in-process runner starts none.
    started = 'Worker: severity: INFO', 'message: "Logging handler created."'
    assert sum(all(part in line for part in started) for line in log2.splitlines()) >= 2, "no worker processes"
    assert not any(all(part in line for part in started) for line in runs["in_process"][2].splitlines())
    for split in ("train", "eval"):
        assert _records(gen2["examples"], split) == _records(gen["examples"], split)
        # Means and variances combined from two workers' partial sums may differ in the last bits.
        np.testing.assert_allclose(_rows(transform2["transformed_examples"], split),
                                   _rows(transform["transformed_examples"], split), rtol=1e-6, atol=1e-6)
    assert gen2["examples"].startswith("gs://")
    assert tf.io.gfile.GFile(os.path.join(gen2["schema"], "schema.pbtxt")).read() == \
        open(os.path.join(gen["schema"], "schema.pbtxt")).read()
    assert _assets(transform2["transform_graph"]) == _assets(transform["transform_graph"])
