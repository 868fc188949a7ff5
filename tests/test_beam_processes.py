"""Beam beyond one process: ExampleGen and Transform on Beam's multi-process runner (two SDK worker processes),
writing to the object store on loopback, write what the in-process runner writes to local disk. SoftTargets
likewise, in test_distill_pipeline.py."""
import logging
import os

import numpy as np
import pytest
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


@pytest.fixture
def workers(monkeypatch) -> list:
    """The SDK worker processes Beam starts, one entry per process, as the runner starts them (the in-process
    runner starts none). Counted at the runner, which is where they start whatever earlier tests have done."""
    from apache_beam.runners.portability import local_job_service

    started = []
    run = local_job_service.SubprocessSdkWorker.run

    def counted(worker):
        started.append(worker._worker_id)
        return run(worker)

    monkeypatch.setattr(local_job_service.SubprocessSdkWorker, "run", counted)
    return started


def _started(workers: list) -> int:
    """How many worker processes started since the last call."""
    count = len(workers)
    workers.clear()
    return count


def test_example_gen_and_transform_in_two_beam_processes_write_the_in_process_output(tmp_path, penguin_csv, workers,
                                                                                      gcs, monkeypatch):
    """ExampleGen is given its Beam args; Transform, given none, takes the deployment's (HPML_BEAM_PIPELINE_ARGS).
    In two processes, Transform's module is a file, as `hpml init` writes one: the workers cannot import it by name,
    so its code travels with the pickled functions."""
    from hpml.examples.penguin import module as penguin_module

    runs = {}
    for name, args, root, module in (
            ("in_process", [], str(tmp_path), "hpml.examples.penguin.module"),
            ("two_processes", TWO_PROCESSES, f"{gcs.root}/{tmp_path.name}", penguin_module.__file__)):
        gen = {"examples": f"{root}/{name}/examples", "schema": f"{root}/{name}/schema"}
        transform = {key: f"{root}/{name}/{key}" for key in ("transform_graph", "transformed_examples",
                                                            "input_pipeline")}
        EXAMPLE_GEN.run({}, gen, {"input_path": penguin_csv, "beam_pipeline_args": args})
        gen_workers = _started(workers)
        monkeypatch.setenv("HPML_BEAM_PIPELINE_ARGS", " ".join(args))
        TRANSFORM.run(gen, transform, {"module": module})
        runs[name] = (gen, transform, gen_workers, _started(workers))
    (gen, transform, *started), (gen2, transform2, *started2) = runs["in_process"], runs["two_processes"]
    assert started2 == [2, 2], "two worker processes for each component"
    assert started == [0, 0]
    for split in ("train", "eval"):
        assert _records(gen2["examples"], split) == _records(gen["examples"], split)
        # Means and variances combined from two workers' partial sums may differ in the last bits.
        np.testing.assert_allclose(_rows(transform2["transformed_examples"], split),
                                   _rows(transform["transformed_examples"], split), rtol=1e-6, atol=1e-6)
    assert gen2["examples"].startswith("gs://")
    assert tf.io.gfile.GFile(os.path.join(gen2["schema"], "schema.pbtxt")).read() == \
        open(os.path.join(gen["schema"], "schema.pbtxt")).read()
    assert _assets(transform2["transform_graph"]) == _assets(transform["transform_graph"])


def test_the_deployment_beam_args_apply_where_a_component_is_given_none(monkeypatch):
    from apache_beam.options.pipeline_options import DirectOptions

    from hpml.components.beam_utils import make_pipeline
    from hpml.components.errors import SpecError

    monkeypatch.setenv("HPML_BEAM_PIPELINE_ARGS", "--direct_num_workers=3 --job_name='nightly run'")
    assert make_pipeline([]).options.view_as(DirectOptions).direct_num_workers == 3
    assert make_pipeline(["--direct_num_workers=5"]).options.view_as(DirectOptions).direct_num_workers == 5
    monkeypatch.setenv("HPML_BEAM_PIPELINE_ARGS", "--job_name='nightly")
    with pytest.raises(SpecError, match="HPML_BEAM_PIPELINE_ARGS: No closing quotation"):
        make_pipeline([])


def test_large_input_runs_on_a_worker_process_per_core_unless_args_say_otherwise(monkeypatch):
    from apache_beam.options.pipeline_options import DirectOptions

    from hpml.components import beam_utils

    monkeypatch.delenv("HPML_BEAM_PIPELINE_ARGS", raising=False)
    monkeypatch.setattr(beam_utils, "_cores", lambda: 3)
    large = beam_utils.LOCAL_PARALLEL_BYTES

    def mode(args, size):
        options = beam_utils.make_pipeline(args, size).options.view_as(DirectOptions)
        return options.direct_running_mode, options.direct_num_workers

    assert mode([], large) == ("multi_processing", 3)
    assert mode([], large - 1) == ("in_memory", 1)
    assert mode(["--direct_num_workers=1"], large) == ("in_memory", 1), "given args are kept as they are"
    monkeypatch.setenv("HPML_BEAM_PIPELINE_ARGS", "--direct_running_mode=in_memory")
    assert mode([], large) == ("in_memory", 1), "and so are the deployment's"
    monkeypatch.delenv("HPML_BEAM_PIPELINE_ARGS")
    monkeypatch.setattr(beam_utils, "_cores", lambda: 1)
    assert mode([], large) == ("in_memory", 1), "one core: no worker processes"


def test_example_gen_and_transform_on_large_input_take_the_worker_processes(
        tmp_path, penguin_csv, caplog, workers, monkeypatch):
    from hpml.components import beam_utils

    monkeypatch.delenv("HPML_BEAM_PIPELINE_ARGS", raising=False)
    monkeypatch.setattr(beam_utils, "_cores", lambda: 2)
    monkeypatch.setattr(beam_utils, "LOCAL_PARALLEL_BYTES", os.path.getsize(penguin_csv))  # penguin is "large"
    outputs = {}
    for name, args in (("default", []), ("in_process", ["--direct_running_mode=in_memory"])):
        outputs[name] = {"examples": str(tmp_path / name / "examples"), "schema": str(tmp_path / name / "schema")}
        with caplog.at_level(logging.INFO):
            caplog.clear()
            EXAMPLE_GEN.run({}, outputs[name], {"input_path": penguin_csv, "beam_pipeline_args": args})
            outputs[name]["log"] = caplog.text
            outputs[name]["workers"] = _started(workers)
    assert outputs["default"]["workers"] == 2
    assert "one worker process per core (2)" in outputs["default"]["log"]
    assert outputs["in_process"]["workers"] == 0
    for split in ("train", "eval"):
        assert _records(outputs["default"]["examples"], split) == _records(outputs["in_process"]["examples"], split)
    # Transform has a threshold of its own, on the bytes of its examples.
    monkeypatch.setattr(beam_utils, "TRANSFORM_PARALLEL_BYTES", 1)
    transformed = {key: str(tmp_path / "transform" / key) for key in ("transform_graph", "transformed_examples",
                                                                      "input_pipeline")}
    with caplog.at_level(logging.INFO):
        caplog.clear()
        TRANSFORM.run({key: outputs["default"][key] for key in ("examples", "schema")}, transformed,
                      {"module": "hpml.examples.penguin.module"})
    assert _started(workers) == 2
    assert "one worker process per core (2)" in caplog.text
    assert len(_records(transformed["transformed_examples"], "train")) == len(_records(outputs["default"]["examples"],
                                                                                       "train"))
