"""The Trainer's input on s3:// (moto's S3 server on loopback): shards fetched a few ahead of tf.data's reader, into
the local cache, with the same elements as from local disk, and damaged or missing shards named by their URL."""
import json
import os
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_transform.tf_metadata import schema_utils

from hpml.components import artifacts, files, publishing, s3_files
from hpml.components.errors import InputDataError
from hpml.components.input_pipeline import build_dataset, read_ahead, read_spec, schema_fingerprint
from hpml.components.input_pipeline.spec import InputPipelineSpec
from tests.helpers import served_weights, trainer_inputs, trainer_outputs

SCHEMA = schema_utils.schema_from_feature_spec({"id": tf.io.FixedLenFeature([], tf.int64),
                                                "x": tf.io.FixedLenFeature([2], tf.float32)})
ROWS = 100  # per shard


def _write_shard(path: str, first: int) -> None:
    with tf.io.TFRecordWriter(path, "GZIP") as writer:
        for i in range(first, first + ROWS):
            feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                       "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i * 0.5, -i]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


@pytest.fixture
def shards_on_s3(s3, tmp_path, monkeypatch):
    """(local split folder, its copy on s3://) of GZIP shards; the local cache in tmp_path, emptied per test."""
    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "cache"))
    local = tmp_path / "examples" / "Split-train"
    local.mkdir(parents=True)
    for shard in range(12):
        _write_shard(str(local / f"part-{shard:02d}.gz"), shard * 1000)
    remote = f"{s3.root}/{tmp_path.name}/examples"
    files.copy_tree(str(tmp_path / "examples"), remote)
    yield str(local), f"{remote}/Split-train"
    read_ahead.release()


def _spec(**overrides) -> InputPipelineSpec:
    return InputPipelineSpec(**{**dict(schema_fingerprint=schema_fingerprint(SCHEMA), batch_size=32,
                                       compression="GZIP", cycle_length=1, read_parallelism=1, map_parallelism=1,
                                       prefetch=0, deterministic=True), **overrides})


def _ids(dataset) -> np.ndarray:
    return np.concatenate([batch["id"].numpy() for batch in dataset])


def _copies(tmp_path) -> list[str]:
    folder = tmp_path / "cache" / "s3"
    return sorted(name for name in os.listdir(folder) if ".partial-" not in name) if folder.exists() else []


@pytest.mark.parametrize("spec", [_spec(), _spec(cycle_length=4, read_parallelism=4, map_parallelism=2,
                                                 vectorized_parse=True, prefetch=2, cache="memory")],
                         ids=["sequential", "parallel-cached"])
def test_a_dataset_over_shards_on_s3_has_the_elements_of_the_same_shards_on_local_disk(shards_on_s3, spec):
    local, remote = shards_on_s3
    for shuffle, epochs in ((False, 1), (True, 2)):
        kwargs = dict(shuffle=shuffle, num_epochs=epochs, seed=7)
        from_s3 = _ids(build_dataset(spec, [f"{remote}/*.gz"], SCHEMA, **kwargs))
        np.testing.assert_array_equal(from_s3, _ids(build_dataset(spec, [f"{local}/*.gz"], SCHEMA, **kwargs)))
        assert len(from_s3) == 12 * ROWS * epochs


def test_shards_are_fetched_a_few_ahead_of_the_reader_not_all_at_once(shards_on_s3, tmp_path):
    _, remote = shards_on_s3
    dataset = iter(build_dataset(_spec(), [f"{remote}/*.gz"], SCHEMA, shuffle=False))
    assert next(dataset)["id"].numpy()[0] == 0
    ahead = read_ahead.AHEAD + 1  # the reader opens one shard at a time
    deadline = time.time() + 30
    while len(_copies(tmp_path)) < 1 + ahead and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # time enough for a download past the window to show
    assert 1 + ahead <= len(_copies(tmp_path)) <= 2 + ahead, "the shards opened and the next few, not all twelve"
    rest = np.concatenate([batch["id"].numpy() for batch in dataset])
    assert len(rest) == 12 * ROWS - 32
    assert len(_copies(tmp_path)) == 12, "one copy per shard once the reader is through"


def test_a_later_epoch_and_another_dataset_read_the_copies_without_downloading_again(shards_on_s3, tmp_path):
    _, remote = shards_on_s3
    _ids(build_dataset(_spec(), [f"{remote}/*.gz"], SCHEMA, shuffle=False))
    modified = {name: os.stat(tmp_path / "cache" / "s3" / name).st_mtime_ns for name in _copies(tmp_path)}
    again = _ids(build_dataset(_spec(), [f"{remote}/*.gz"], SCHEMA, shuffle=True, num_epochs=2, seed=3))
    assert sorted(again) == sorted([i for shard in range(12) for i in range(shard * 1000, shard * 1000 + ROWS)] * 2)
    assert {name: os.stat(tmp_path / "cache" / "s3" / name).st_mtime_ns for name in _copies(tmp_path)} == modified


def test_a_shard_not_the_size_its_writer_recorded_is_named_by_its_url_before_any_download(shards_on_s3, tmp_path):
    _, remote = shards_on_s3
    root = os.path.dirname(remote)
    shard = f"{remote}/part-03.gz"
    files.write_text(f"{root}/{artifacts.SHARD_SIZES_FILE}",
                     json.dumps({"shards": {"Split-train/part-03.gz": s3_files.stat(shard)["size"] + 1}}))
    with pytest.raises(InputDataError, match=rf"{shard}: \d+ bytes, but .* records \d+ as written"):
        build_dataset(_spec(), [f"{remote}/*.gz"], SCHEMA)
    assert _copies(tmp_path) == []


def test_a_shard_cut_short_is_named_by_its_url_or_skipped(shards_on_s3, tmp_path):
    _, remote = shards_on_s3
    shard = f"{remote}/part-05.gz"
    s3_files.write_bytes(shard, s3_files.read_bytes(shard)[:-6])
    with pytest.raises(tf.errors.OpError):
        _ids(build_dataset(_spec(), [f"{remote}/*.gz"], SCHEMA, shuffle=False))
    failure = read_ahead.failure()
    assert isinstance(failure, InputDataError) and shard in str(failure), failure
    read_ahead.release()

    report: dict = {}
    ids = _ids(build_dataset(_spec(on_corrupt_shard="skip"), [f"{remote}/*.gz"], SCHEMA, shuffle=False,
                             report=report))
    assert list(report["skipped_shards"]) == [shard]
    assert len(ids) == 11 * ROWS and not any(5000 <= i < 6000 for i in ids)


def test_a_shard_removed_from_the_store_after_the_listing_is_named_by_its_url(shards_on_s3):
    _, remote = shards_on_s3
    dataset = build_dataset(_spec(), [f"{remote}/*.gz"], SCHEMA, shuffle=False)
    s3_files.remove(f"{remote}/part-11.gz")
    with pytest.raises(tf.errors.OpError):
        _ids(dataset)
    assert isinstance(read_ahead.failure(), FileNotFoundError)
    assert f"{remote}/part-11.gz" in str(read_ahead.failure())


def test_the_trainer_reads_its_examples_on_s3_ahead_of_training_and_trains_as_from_local_disk(
        penguin_outputs, s3, tmp_path, monkeypatch):
    """The transformed examples published on s3://, the rest local: the Trainer reads the shards through the
    cache, one copy per shard (no copy of the whole artifact), and ends with the weights of the local run."""
    from hpml.components.trainer import TRAINER

    monkeypatch.setenv("HPML_CACHE_DIR", str(tmp_path / "cache"))
    inputs = dict(trainer_inputs(penguin_outputs), input_pipeline=penguin_outputs["Transform"]["input_pipeline"])
    remote = f"{s3.root}/{tmp_path.name}/transformed_examples"
    with publishing.publish(remote) as target:
        files.copy_tree(inputs["examples"], target)
    params = {"module": "hpml.examples.penguin.module", "strategy": "one_device",
              "hyperparameters": {"epochs": 2, "batch_size": 8}}
    local_run, s3_run = trainer_outputs(tmp_path, "local"), trainer_outputs(tmp_path, "s3")
    TRAINER.run(inputs, local_run, params)
    TRAINER.run(dict(inputs, examples=remote), s3_run, params)

    shards = [path for split in ("train", "eval")
              for path in files.glob(artifacts.transformed_examples_file_pattern(remote, split))]
    copies = os.listdir(tmp_path / "cache" / "s3")
    assert len(copies) == len(shards) and all(os.path.isfile(tmp_path / "cache" / "s3" / c) for c in copies)
    local, from_s3 = served_weights(local_run["model"]), served_weights(s3_run["model"])
    assert sorted(local) == sorted(from_s3)
    for key, value in local.items():
        np.testing.assert_array_equal(from_s3[key], value, err_msg=key)
    assert read_spec(inputs["input_pipeline"]).compression == "GZIP"
