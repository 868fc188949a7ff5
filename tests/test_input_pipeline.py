"""The tuned input pipeline: tuner rules, same elements as the naive pipeline, cache keys,
corrupt shards, the per-stage breakdown, input stall, and the Trainer's data_accessor."""
import dataclasses
import json
import os
import time
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
from tensorflow_transform.tf_metadata import schema_utils

from hpml.components import artifacts, input_pipeline
from hpml.components.errors import InputDataError, SpecError
from hpml.components.input_pipeline import blocks as blocks_module
from hpml.components.input_pipeline import Measurements, autotune_spec, build_dataset, naive_spec, stages, tune
from hpml.components.input_pipeline.shards import explain_read_error
from hpml.components.trainer.input_stall import describe_stall, measure_input_stall

GIB = 1024 ** 3
SCHEMA = schema_utils.schema_from_feature_spec({
    "id": tf.io.FixedLenFeature([], tf.int64),
    "x": tf.io.FixedLenFeature([3], tf.float32),
    "label": tf.io.FixedLenFeature([], tf.int64),
})


def _write_shard(path, ids, offset=0.0, compression="GZIP"):
    with tf.io.TFRecordWriter(str(path), compression) as writer:
        for i in ids:
            feature = {
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i + offset, i * 0.5, -i])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Six GZIP shards of 150 examples, ids unique across shards."""
    folder = tmp_path_factory.mktemp("shards")
    for shard in range(6):
        _write_shard(folder / f"part-{shard}.gz", range(shard * 1000, shard * 1000 + 150))
    return str(folder)


@pytest.fixture(scope="module")
def tuned(shards):
    files = sorted(tf.io.gfile.glob(os.path.join(shards, "*.gz")))
    measured = input_pipeline.measure_tfrecords(files, SCHEMA, compression="GZIP", batch_size=32, sample_records=300)
    return tune(measured, schema_fingerprint=input_pipeline.schema_fingerprint(SCHEMA), batch_size=32)


def _ids(spec, shards, **kwargs):
    dataset = build_dataset(spec, [os.path.join(shards, "*.gz")], SCHEMA, **kwargs)
    return np.concatenate([batch["id"].numpy() for batch in dataset])


def _measurements(**overrides) -> Measurements:
    base = dict(file_count=16, total_file_bytes=64 * 2**20, sample_records=4096, est_records=1_000_000,
                serialized_bytes_per_record=100.0, parsed_bytes_per_record=64.0,
                read_wall_s_per_record=1e-6, read_cpu_s_per_record=1e-6, parse_one_s_per_record=8e-6,
                parse_batch_s_per_record=1e-6, map_wall_s_per_record=1e-6, map_cpu_s_per_record=1e-6,
                batch_time_p50_s=1e-3, batch_time_p95_s=1.5e-3, cores=4, ram_total_bytes=32 * GIB,
                ram_available_bytes=16 * GIB)
    return Measurements(**dict(base, **overrides))


# (what is simulated, measurement overrides, expected spec fields)
TUNER_RULES = [
    ("CPU-bound reads use one reader per core", {}, {"cycle_length": 4, "read_parallelism": 4}),
    ("latency-bound reads use more readers than cores", {"read_wall_s_per_record": 1e-5},
     {"cycle_length": 16, "read_parallelism": 16}),
    ("never more readers than shards", {"file_count": 2, "read_wall_s_per_record": 1e-5}, {"cycle_length": 2}),
    ("a map that waits gets more calls than cores", {"map_wall_s_per_record": 3e-6}, {"map_parallelism": 12}),
    ("the private pool has a thread per core, not per reader", {"read_wall_s_per_record": 1e-5},
     {"read_parallelism": 16, "map_parallelism": 4, "private_threadpool_size": 4}),
    ("the private pool has a thread per concurrent map call", {"map_wall_s_per_record": 3e-6},
     {"map_parallelism": 12, "private_threadpool_size": 12}),
    ("data that fits RAM is cached in memory", {}, {"cache": "memory", "vectorized_parse": True}),
    ("data larger than the RAM budget is cached on disk", {"ram_available_bytes": 64 * 2**20}, {"cache": "disk"}),
    ("a shuffle buffer holds all the data when memory allows", {}, {"shuffle_buffer": 1_000_000}),
    ("a shuffle buffer is cut to memory otherwise", {"ram_available_bytes": 128 * 2**20},
     {"shuffle_buffer": 128 * 2**20 // 2 // 4 // 64}),
    ("the first epoch streams in eighths of the data", {},
     {"first_epoch_window": 123 * 1024, "shuffle_buffer": 1_000_000}),
    ("data parsed within the latency target is permuted whole from the first epoch", {"est_records": 40_000},
     {"first_epoch_window": 40_000, "shuffle_buffer": 40_000}),
    ("a permuted window is gathered eight chunks at a time", {}, {"parse_batch_size": 1024, "permute_slice": 8192}),
    ("a window of fewer than eight chunks is gathered whole", {"est_records": 200},
     {"parse_batch_size": 32, "shuffle_buffer": 200, "permute_slice": 200}),
    ("a bursty producer gets a deeper prefetch", {"batch_time_p95_s": 6e-3}, {"prefetch": 7}),
    ("budgets follow the machine", {"cores": 8, "ram_available_bytes": 8 * GIB},
     {"cpu_budget": 8, "ram_budget_bytes": 4 * GIB}),
]


@pytest.mark.parametrize("case,overrides,expected", TUNER_RULES, ids=[r[0] for r in TUNER_RULES])
def test_tuner_rules(case, overrides, expected):
    spec = tune(_measurements(**overrides), schema_fingerprint="f", batch_size=32)
    assert {k: getattr(spec, k) for k in expected} == expected, case
    decided = {d["what"] for d in spec.decisions}
    assert {"cycle_length", "vectorized_parse", "map_parallelism", "cache", "shuffle_buffer", "first_epoch_window",
            "permute_slice", "prefetch", "private_threadpool_size", "static_optimizations"} <= decided
    assert all(d["why"] for d in spec.decisions)
    assert spec.measurements["cores"] == _measurements(**overrides).cores


def test_spec_round_trip_and_bad_specs_refused(tuned, tmp_path):
    path = input_pipeline.write_spec(tuned, str(tmp_path))
    assert input_pipeline.read_spec(str(tmp_path)) == tuned
    data = json.load(open(path))
    for field, value, message in [("cache", "ram", "cache must be one of"), ("prefetch", -7, "prefetch must be"),
                                  ("color", 1, "unknown field"), ("version", 1, "spec version 1")]:
        bad = dict(data, **{field: value})
        with pytest.raises(SpecError, match=message):
            input_pipeline.InputPipelineSpec.from_json(json.dumps(bad), source="x.json")


def test_tuned_spec_decides_from_measurements(tuned):
    assert tuned.vectorized_parse and tuned.cache == "memory"
    assert tuned.measurements["file_count"] == 6 and tuned.measurements["sample_records"] == 300
    assert 1 <= tuned.cycle_length <= 6 and tuned.map_parallelism >= 1
    assert tuned.decision("vectorized_parse")["why"].startswith("batching first")


@pytest.mark.parametrize("width", [1, 24])
def test_the_record_count_is_estimated_from_a_sample_within_a_tenth(tmp_path, width):
    """The count (which sizes the shuffle windows) comes from the sample's compressed size. Records of a few dozen
    bytes spend a fifth of it on their CRCs, which do not compress; framing the sample with zeros for them nearly
    doubled the count."""
    path, schema = _write_wide_shard(tmp_path, 60_000, width)
    measured = input_pipeline.measure_tfrecords([path], schema, compression="GZIP", batch_size=64,
                                                sample_records=4096)
    assert measured.sample_records == 4096
    assert 0.9 < measured.est_records / 60_000 < 1.1, measured.est_records


def _write_wide_shard(folder, rows: int, width: int):
    """(path, schema) of one GZIP shard of `rows` tf.Examples: an id and `width` floats."""
    schema = schema_utils.schema_from_feature_spec({"id": tf.io.FixedLenFeature([], tf.int64),
                                                    "x": tf.io.FixedLenFeature([width], tf.float32)})
    values = np.round(np.random.default_rng(0).normal(size=(rows, width)), 2)
    path = str(folder / "part-0.gz")
    with tf.io.TFRecordWriter(path, "GZIP") as writer:
        for i, row in enumerate(values):
            example = tf.train.Example()
            example.features.feature["id"].int64_list.value.append(i)
            example.features.feature["x"].float_list.value.extend(row)
            writer.write(example.SerializeToString())
    return path, schema


def test_a_machine_busy_with_other_work_does_not_read_as_a_parse_that_waits(tmp_path):
    """The parse map's width is cores x (wall / CPU time). Other processes holding the cores stretch the wall time
    without the parse waiting on anything; that time, spent ready to run, is left out, so a loaded machine does not
    tune more parallel calls than an idle one."""
    path, schema = _write_wide_shard(tmp_path, 20_000, 16)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * os.cpu_count())]
    try:
        time.sleep(0.5)
        measured = input_pipeline.measure_tfrecords([path], schema, compression="GZIP", batch_size=256,
                                                    sample_records=16_384)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert measured.map_wall_s_per_record / measured.map_cpu_s_per_record < 1.6, measured
    assert measured.queued_share > 0.3, measured  # the hogs held the cores for much of the profile
    spec = tune(measured, schema_fingerprint="x", batch_size=256)
    assert spec.map_parallelism <= 2 * measured.cores
    assert "waiting for a core" in next(d["why"] for d in spec.decisions if d["what"] == "map_parallelism")


@pytest.mark.parametrize("kwargs", [
    {"shuffle": False},
    {"shuffle": True, "seed": 7, "num_epochs": 3},  # memory cache, reshuffled each epoch
    {"shuffle": True, "seed": 7, "num_epochs": 2, "batch_size": 5},
], ids=["in-order", "shuffled-cached", "odd-batch"])
def test_tuned_yields_the_naive_elements_in_order(tuned, shards, kwargs):
    expected = _ids(naive_spec(tuned), shards, **kwargs)
    assert len(expected) == 900 * kwargs.get("num_epochs", 1)
    np.testing.assert_array_equal(_ids(tuned, shards, **kwargs), expected)
    np.testing.assert_array_equal(_ids(autotune_spec(tuned, keep_order=True), shards, **kwargs), expected)


def test_each_epoch_is_a_fresh_full_permutation_when_the_window_covers_the_data(tuned, shards):
    spec = dataclasses.replace(tuned, shuffle_buffer=4 * 900)  # windows larger than the 900 records
    epochs = _ids(spec, shards, shuffle=True, seed=3, num_epochs=3).reshape(3, 900)
    every_id = sorted(_ids(spec, shards, shuffle=False).tolist())
    for epoch in epochs:  # no window reaches into the next epoch
        assert sorted(epoch.tolist()) == every_id
    assert (epochs[0] != epochs[1]).mean() > 0.9 and (epochs[1] != epochs[2]).mean() > 0.9
    assert (epochs[0] != np.array(every_id)).mean() > 0.9
    np.testing.assert_array_equal(_ids(spec, shards, shuffle=True, seed=3, num_epochs=3).reshape(3, 900), epochs)
    np.testing.assert_array_equal(_ids(naive_spec(spec), shards, shuffle=True, seed=3, num_epochs=3).reshape(3, 900),
                                  epochs)


def test_the_first_epoch_streams_in_small_windows_and_later_epochs_permute_everything(tuned, shards):
    window = 2 * tuned.parse_batch_size
    spec = dataclasses.replace(tuned, shuffle_buffer=4 * 900, first_epoch_window=window)
    epochs = _ids(spec, shards, shuffle=True, seed=5, num_epochs=3).reshape(3, 900)
    read_order = {record: position for position, record in enumerate(_ids(spec, shards, shuffle=False).tolist())}
    for epoch in epochs:
        assert sorted(epoch.tolist()) == sorted(read_order)
    assert (epochs[1] != epochs[2]).mean() > 0.9
    # The first window of the first epoch is exactly the first chunks read, so it is yielded
    # once they are parsed; the second epoch's first window spans all the data.
    first_window_positions = [read_order[r] for r in epochs[0][:window].tolist()]
    later_window_positions = [read_order[r] for r in epochs[1][:window].tolist()]
    assert sorted(first_window_positions) == list(range(window))
    assert epochs[0][:window].tolist() != sorted(epochs[0][:window].tolist(), key=read_order.get)
    assert max(later_window_positions) > 700
    np.testing.assert_array_equal(_ids(naive_spec(spec), shards, shuffle=True, seed=5, num_epochs=3).reshape(3, 900),
                                  epochs)


def _counting_transform(parsed: list):
    """A transform that adds the ids of every record it parses to `parsed`."""
    def counting_transform(features):
        def count(ids):
            parsed.extend(ids.numpy().tolist())
            return ids
        features = dict(features)
        features["id"] = tf.ensure_shape(tf.py_function(count, [features["id"]], tf.int64), features["id"].shape)
        return features
    return counting_transform


def test_a_streamed_first_epoch_fills_the_cache_that_later_epochs_read(tuned, shards):
    parsed: list = []
    counting_transform = _counting_transform(parsed)
    spec = dataclasses.replace(tuned, cache="memory", shuffle_buffer=4 * 900, first_epoch_window=tuned.parse_batch_size)
    dataset = build_dataset(spec, [os.path.join(shards, "*.gz")], SCHEMA, shuffle=True, seed=2, num_epochs=3,
                            transform=counting_transform)
    ids = np.concatenate([batch["id"].numpy() for batch in dataset])
    assert len(ids) == 3 * 900 and sorted(set(ids.tolist())) == sorted(parsed)
    assert len(parsed) == 900, "every record is parsed once; epochs 2 and 3 read the cache"


def test_an_endless_read_past_its_last_pass_parses_a_small_window_not_another_whole_pass(tuned, tmp_path):
    """fit's last batch takes a few rows from the pass after its last epoch. The endless training read drew them
    from a full later-epoch window: every record read and parsed again (a whole pass, at 1M rows about 2 s on
    two cores, while the last validation waited) for the last batch's few rows. Told its passes, it draws them
    from small windows, and the passes themselves are unchanged."""
    for shard in range(4):
        _write_shard(tmp_path / f"part-{shard}.gz", range(shard * 10_000, shard * 10_000 + 5000))
    rows, window = 20_000, 1024  # each pass far larger than the blocks that batches are cut from (4,096 rows)
    spec = dataclasses.replace(tuned, cache="none", vectorized_parse=True, parse_batch_size=256,
                               first_epoch_window=window, shuffle_buffer=2 * rows, permute_slice=256, prefetch=2)

    def read(passes):
        parsed: list = []
        dataset = build_dataset(spec, [str(tmp_path / "*.gz")], SCHEMA, batch_size=128, shuffle=True, seed=5,
                                num_epochs=None, passes=passes, transform=_counting_transform(parsed))
        ids = np.concatenate([batch["id"].numpy() for batch in dataset.take(2 * rows // 128 + 1)])
        time.sleep(0.5)  # what the pipeline reads ahead of the last batch taken is counted too
        return ids, len(parsed)

    endless, parsed_endless = read(None)
    bounded, parsed_bounded = read(2)
    np.testing.assert_array_equal(bounded[:2 * rows], endless[:2 * rows])
    every_id = set(_ids(spec, str(tmp_path), shuffle=False).tolist())
    assert sorted(bounded[:rows].tolist()) == sorted(every_id) and set(bounded[2 * rows:].tolist()) <= every_id
    assert parsed_endless >= 3 * rows, "without passes the third pass is parsed whole"
    assert parsed_bounded <= 2 * rows + 4 * window + 2 * 4096, f"past 2 passes, small windows only: {parsed_bounded}"


@pytest.mark.parametrize("kwargs", [{"shuffle": False}, {"shuffle": True, "seed": 3, "num_epochs": 2}],
                         ids=["parsed-late", "parsed-first"])
def test_a_users_transform_keeps_autograph_where_hpmls_own_functions_are_traced_plain(tuned, shards, kwargs):
    """hpml's own dataset functions skip autograph's conversion; a user's transform that branches on a tensor's
    value (which only autograph turns into graph control flow) still works on either read path."""
    def halve(features):
        features = dict(features)
        if tf.size(features["id"]) > 0:  # a Python `if` on a tensor: autograph's to convert
            features["x"] = features["x"] * 0.5
        return features

    spec = dataclasses.replace(tuned, cache="memory", vectorized_parse=True)
    dataset = build_dataset(spec, [os.path.join(shards, "*.gz")], SCHEMA, batch_size=1, transform=halve,
                            **kwargs)
    rows = [(int(batch["id"][0]), float(batch["x"][0][0])) for batch in dataset]
    assert len(rows) == 900 * kwargs.get("num_epochs", 1)
    assert all(x == i / 2 for i, x in rows), rows[:6]


TAGGED_SCHEMA = schema_utils.schema_from_feature_spec({
    "id": tf.io.FixedLenFeature([], tf.int64),
    "x": tf.io.FixedLenFeature([3], tf.float32),
    "tags": tf.io.VarLenFeature(tf.int64),
    "label": tf.io.FixedLenFeature([], tf.int64),
})


@pytest.fixture(scope="module")
def tagged_shards(tmp_path_factory):
    """Three GZIP shards of 70 examples with a variable-length feature, 0 to 3 tags (= id) each."""
    folder = tmp_path_factory.mktemp("tagged")
    for shard in range(3):
        with tf.io.TFRecordWriter(str(folder / f"part-{shard}.gz"), "GZIP") as writer:
            for i in range(shard * 1000, shard * 1000 + 70):
                feature = {
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i * 0.5, -i])),
                    "tags": tf.train.Feature(int64_list=tf.train.Int64List(value=[i] * (i % 4))),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return str(folder)


@pytest.mark.parametrize("cache,num_epochs", [("memory", 3), ("none", 1)], ids=["cached", "uncached"])
def test_gathering_a_window_in_slices_yields_exactly_the_whole_window_permutation(tuned, tagged_shards, cache,
                                                                                 num_epochs):
    """Slices are a way to schedule the gather, not a different shuffle: every feature of every batch,
    dense and sparse, comes out as it does when each window is gathered in one piece."""
    whole = dataclasses.replace(tuned, schema_fingerprint=input_pipeline.schema_fingerprint(TAGGED_SCHEMA), cache=cache,
                                parse_batch_size=16, shuffle_buffer=96, first_epoch_window=48, permute_slice=0)

    def batches(spec):
        dataset = build_dataset(spec, [os.path.join(tagged_shards, "*.gz")], TAGGED_SCHEMA, label_key="label",
                                batch_size=10, shuffle=True, seed=4, num_epochs=num_epochs)
        # Sparse rows are compared as lists: a batch's dense_shape is the widest row of the window or
        # slice it was gathered from, so only the padding that to_dense would add depends on the slice.
        return [(f["id"].numpy(), f["x"].numpy(), tf.RaggedTensor.from_sparse(f["tags"]).to_list(), label.numpy())
                for f, label in dataset]

    expected = batches(whole)
    assert sum(len(ids) for ids, *_ in expected) == 210 * num_epochs
    ids = np.concatenate([ids for ids, *_ in expected])
    assert (ids[:210] != np.sort(ids[:210])).mean() > 0.9, "the records are shuffled"
    for ids, x, tags, labels in expected:  # each record's features stay together through the gather
        np.testing.assert_array_equal(labels, ids % 3)
        np.testing.assert_allclose(x, np.stack([ids, ids * 0.5, -ids], axis=1))
        assert tags == [[record] * (record % 4) for record in ids.tolist()]
    for permute_slice in (7, 16, 1000):  # a slice that does not divide the window, one chunk, more than a window
        got = batches(dataclasses.replace(whole, permute_slice=permute_slice))
        assert len(got) == len(expected)
        for (ids, x, tags, labels), (want_ids, want_x, want_tags, want_labels) in zip(got, expected):
            np.testing.assert_array_equal(ids, want_ids)
            np.testing.assert_array_equal(x, want_x)
            np.testing.assert_array_equal(labels, want_labels)
            assert tags == want_tags


def _endless_batches(spec, shards, count, **kwargs):
    dataset = build_dataset(spec, [os.path.join(shards, "*.gz")], SCHEMA, label_key="label", **kwargs)
    return [(features["id"].numpy(), features["x"].numpy(), label.numpy()) for features, label in dataset.take(count)]


def test_an_endless_read_cuts_the_batches_a_finite_read_cuts(tuned, shards):
    """An endless cached read cuts its batches from blocks of many batches: the same batches, in order."""
    spec = dataclasses.replace(tuned, cache="memory", shuffle_buffer=4 * tuned.parse_batch_size, first_epoch_window=0,
                               measurements={**tuned.measurements, "est_records": 900})
    assert not blocks_module.held_whole(spec, True, None)
    per_block = blocks_module.BLOCK_ROWS // 30
    count = 5 * 900 // 30  # past the first block
    assert count > per_block
    endless = _endless_batches(spec, shards, count, batch_size=30, shuffle=True, seed=6, num_epochs=None)
    finite = _endless_batches(spec, shards, count, batch_size=30, shuffle=True, seed=6, num_epochs=5)
    assert len(endless) == len(finite) == count
    for (ids, x, labels), (want_ids, want_x, want_labels) in zip(endless, finite):
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(labels, want_labels)


def test_a_var_len_feature_is_cut_from_blocks_and_comes_out_sparse(tuned, tagged_shards):
    """A variable-length feature travels ragged through the cache, shuffle and cut, and is sparse again per batch."""
    spec = dataclasses.replace(tuned, schema_fingerprint=input_pipeline.schema_fingerprint(TAGGED_SCHEMA),
                               cache="memory", parse_batch_size=16, shuffle_buffer=48, first_epoch_window=0,
                               measurements={**tuned.measurements, "est_records": 210})

    def batches(num_epochs):
        dataset = build_dataset(spec, [os.path.join(tagged_shards, "*.gz")], TAGGED_SCHEMA, label_key="label",
                                batch_size=10, shuffle=True, seed=8, num_epochs=num_epochs)
        assert isinstance(dataset.element_spec[0]["tags"], tf.SparseTensorSpec)
        return [(f["id"].numpy(), tf.RaggedTensor.from_sparse(f["tags"]).to_list(), label.numpy())
                for f, label in dataset.take(21 * 25)]

    endless, finite = batches(None), batches(25)  # 25 epochs of 210: past the first block of 4096 rows
    assert len(endless) == len(finite) == 21 * 25
    for (ids, tags, labels), (want_ids, want_tags, want_labels) in zip(endless, finite):
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(labels, want_labels)
        assert tags == want_tags == [[record] * (record % 4) for record in ids.tolist()]


def test_small_data_held_whole_gives_each_epoch_a_fresh_full_permutation(tuned, shards):
    spec = dataclasses.replace(tuned, cache="memory", shuffle_buffer=900, first_epoch_window=0,
                               measurements={**tuned.measurements, "est_records": 900})
    assert blocks_module.held_whole(spec, True, None)
    epochs_per_element = blocks_module.BLOCK_ROWS // 900
    count = (epochs_per_element + 2) * 900 // 32  # into the second element of whole epochs
    batches = _endless_batches(spec, shards, count, batch_size=32, shuffle=True, seed=3, num_epochs=None)
    assert all(len(ids) == 32 for ids, *_ in batches)
    ids = np.concatenate([ids for ids, *_ in batches])
    for ids_, x, labels in batches:  # each record's features and label stay together
        np.testing.assert_array_equal(labels, ids_ % 3)
        np.testing.assert_allclose(x, np.stack([ids_, ids_ * 0.5, -ids_], axis=1))
    every_id = sorted(_ids(spec, shards, shuffle=False).tolist())
    epochs = ids[:len(ids) // 900 * 900].reshape(-1, 900)
    assert len(epochs) > epochs_per_element
    for epoch in epochs:
        assert sorted(epoch.tolist()) == every_id
    for previous, epoch in zip(epochs, epochs[1:]):
        assert (previous != epoch).mean() > 0.9
    again = _endless_batches(spec, shards, count, batch_size=32, shuffle=True, seed=3, num_epochs=None)
    np.testing.assert_array_equal(np.concatenate([ids for ids, *_ in again]), ids)
    other = _endless_batches(spec, shards, 28, batch_size=32, shuffle=True, seed=4, num_epochs=None)
    assert (np.concatenate([ids for ids, *_ in other]) != ids[:28 * 32]).mean() > 0.9


def test_small_data_with_a_sparse_feature_held_whole_keeps_every_row(tuned, tagged_shards):
    spec = dataclasses.replace(tuned, schema_fingerprint=input_pipeline.schema_fingerprint(TAGGED_SCHEMA),
                               cache="memory", parse_batch_size=16, shuffle_buffer=210, first_epoch_window=0,
                               measurements={**tuned.measurements, "est_records": 210})
    assert blocks_module.held_whole(spec, True, None)
    dataset = build_dataset(spec, [os.path.join(tagged_shards, "*.gz")], TAGGED_SCHEMA, label_key="label",
                            batch_size=10, shuffle=True, seed=4, num_epochs=None)
    batches = [(f["id"].numpy(), tf.RaggedTensor.from_sparse(f["tags"]).to_list(), label.numpy())
               for f, label in dataset.take(63)]  # 3 epochs of 210
    ids = np.concatenate([ids for ids, *_ in batches])
    for epoch in ids.reshape(3, 210):
        assert len(set(epoch.tolist())) == 210
    for batch_ids, tags, labels in batches:
        np.testing.assert_array_equal(labels, batch_ids % 3)
        assert tags == [[record] * (record % 4) for record in batch_ids.tolist()]


def test_nondeterministic_tuned_yields_the_same_multiset(tuned, shards):
    spec = dataclasses.replace(tuned, deterministic=False)
    got = _ids(spec, shards, shuffle=True, seed=1, num_epochs=2)
    expected = _ids(naive_spec(tuned), shards, shuffle=True, seed=1, num_epochs=2)
    assert sorted(got.tolist()) == sorted(expected.tolist())


def test_features_and_labels_survive_vectorised_parsing_and_caching(tuned, shards):
    dataset = build_dataset(tuned, [os.path.join(shards, "*.gz")], SCHEMA, label_key="label", shuffle=False,
                            num_epochs=2)
    features, labels = next(iter(dataset))
    ids = features["id"].numpy()
    np.testing.assert_array_equal(labels.numpy(), ids % 3)
    np.testing.assert_allclose(features["x"].numpy(), np.stack([ids, ids * 0.5, -ids], axis=1))
    assert "label" not in features


def test_disk_cache_is_keyed_by_the_input_and_invalidated_when_it_changes(tuned, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for shard in range(3):
        _write_shard(data / f"part-{shard}.gz", range(shard * 100, shard * 100 + 50))
    spec = dataclasses.replace(tuned, cache="disk")
    cache_dir = str(tmp_path / "cache")

    def read():
        report = {}
        dataset = build_dataset(spec, [str(data / "*.gz")], SCHEMA, shuffle=False, num_epochs=2,
                                cache_dir=cache_dir, report=report)
        return np.concatenate([b["x"].numpy()[:, 0] for b in dataset]), report["cache_location"]

    first, first_key = read()
    assert os.listdir(first_key), "the first pass must write the snapshot"
    again, again_key = read()
    assert again_key == first_key and np.array_equal(again, first)
    _write_shard(data / "part-1.gz", range(100, 150), offset=1000.0)  # same ids and size, new values
    changed, changed_key = read()
    assert changed_key != first_key
    assert changed.max() >= 1100 and first.max() < 1000, "a stale cache must not be reused"


def _garbage_in_the_middle(raw: bytes) -> bytes:
    return raw[: len(raw) // 2] + b"garbage" * 40 + raw[len(raw) // 2 + 280:]


def _trailer_cut(raw: bytes) -> bytes:
    return raw[:-4]  # the last 4 bytes of the GZIP or ZLIB trailer, as an interrupted copy leaves it


def _damaged_copy(shards, tmp_path, shard: int, damage):
    """A copy of the shards with part-{shard}.gz damaged; the folder, that shard's path and its whole bytes."""
    folder = tmp_path / "damaged"
    shutil.copytree(shards, folder)
    victim = folder / f"part-{shard}.gz"
    whole = victim.read_bytes()
    victim.write_bytes(damage(whole))
    return str(folder), victim, whole


def test_corrupt_shard_is_named(tuned, shards, tmp_path):
    folder, victim, _ = _damaged_copy(shards, tmp_path, 2, _garbage_in_the_middle)
    with pytest.raises(InputDataError, match="corrupt TFRecord shard") as caught:
        _ids(tuned, folder, shuffle=False)  # a GZIP shard's stream is checked before it is read
    assert str(victim) in str(caught.value) and "part-0" not in str(caught.value)


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_a_compressed_shard_cut_short_is_named_before_it_is_read(tuned, tmp_path, compression):
    for shard in range(3):
        _write_shard(tmp_path / f"part-{shard}.tfrecord", range(shard * 1000, shard * 1000 + 150),
                     compression=compression)
    victim = tmp_path / "part-1.tfrecord"
    whole = victim.read_bytes()
    victim.write_bytes(_trailer_cut(whole))
    # TF's own reader takes the cut shard for a whole one: every record, no error.
    assert tf.data.TFRecordDataset(str(victim), compression).reduce(0, lambda n, _: n + 1).numpy() == 150
    spec = dataclasses.replace(tuned, compression=compression)
    read = lambda: np.concatenate([b["id"].numpy() for b in build_dataset(  # noqa: E731
        spec, [str(tmp_path / "*.tfrecord")], SCHEMA, shuffle=False)])
    with pytest.raises(InputDataError, match="corrupt TFRecord shard") as caught:
        read()
    message = str(caught.value)
    assert str(victim) in message and f"{compression} end-of-stream" in message and "part-0" not in message
    # Mended, the same path reads again: a shard is checked anew once its size or time changes.
    victim.write_bytes(whole)
    assert len(read()) == 450


@pytest.mark.parametrize("compression", ["", "GZIP"])
def test_a_published_shard_cut_between_records_is_named_by_its_recorded_size(tuned, tmp_path, compression):
    split = tmp_path / "Examples" / "Split-train"
    split.mkdir(parents=True)
    for shard in range(3):
        _write_shard(split / f"part-{shard}.tfrecord", range(shard * 1000, shard * 1000 + 150), compression=compression)
    artifacts.record_shard_sizes(str(tmp_path / "Examples"))
    victim = split / "part-1.tfrecord"
    _write_shard(tmp_path / "shorter", range(1000, 1149), compression=compression)
    victim.write_bytes((tmp_path / "shorter").read_bytes())  # a whole file, one record short of what was written
    assert tf.data.TFRecordDataset(str(victim), compression).reduce(0, lambda n, _: n + 1).numpy() == 149
    with pytest.raises(InputDataError, match="corrupt TFRecord shard") as caught:
        build_dataset(dataclasses.replace(tuned, compression=compression), [str(split / "*.tfrecord")], SCHEMA)
    assert f"{victim}: {victim.stat().st_size} bytes, but {tmp_path / 'Examples' / 'shard_sizes.json'} records " \
        in str(caught.value) and "part-0" not in str(caught.value)


def test_shards_not_compressed_as_the_spec_says_are_named(tuned, tmp_path):
    _write_shard(tmp_path / "part-0.tfrecord", range(50), compression="")
    assert tuned.compression == "GZIP"
    with pytest.raises(InputDataError, match="corrupt TFRecord shard") as caught:
        build_dataset(tuned, [str(tmp_path / "*.tfrecord")], SCHEMA)
    assert f"{tmp_path / 'part-0.tfrecord'}: not GZIP-compressed: it starts with bytes" in str(caught.value)


@pytest.mark.parametrize("shard, damage", [(2, _garbage_in_the_middle), (1, _trailer_cut)], ids=["garbage", "cut"])
def test_corrupt_shard_is_skipped_and_counted_when_configured(tuned, shards, tmp_path, shard, damage):
    folder, victim, _ = _damaged_copy(shards, tmp_path, shard, damage)
    report = {}
    ids = np.concatenate([b["id"].numpy() for b in build_dataset(
        dataclasses.replace(tuned, on_corrupt_shard="skip"), [os.path.join(folder, "*.gz")], SCHEMA,
        shuffle=False, report=report)])
    assert list(report["skipped_shards"]) == [str(victim)]
    assert len(ids) == 750 and not any(shard * 1000 <= i < (shard + 1) * 1000 for i in ids)


def test_a_read_error_is_explained_with_the_shard_named(tuned, tmp_path):
    for shard in range(3):
        _write_shard(tmp_path / f"part-{shard}.tfrecord", range(shard * 1000, shard * 1000 + 50), compression="")
    victim = tmp_path / "part-1.tfrecord"
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte: a record's CRC no longer matches
    victim.write_bytes(bytes(raw))
    files = sorted(str(p) for p in tmp_path.glob("*.tfrecord"))
    with pytest.raises(tf.errors.OpError) as caught:
        for _ in build_dataset(dataclasses.replace(tuned, compression=""), files, SCHEMA, shuffle=False):
            pass
    named = explain_read_error(files, "", caught.value)
    assert isinstance(named, InputDataError) and str(victim) in str(named) and "part-0" not in str(named)
    assert "{{function_node" not in str(named) and "[Op:" not in str(named), "TF's own words, not its wrapping"


def test_stage_breakdown_names_the_slowest_stage_and_plots_it(tuned, shards, tmp_path):
    # 50 ms per chunk: the parse map then takes ~1.5 s in all. At 5 ms (~0.15 s), and once at 20 ms (~0.6 s) in a
    # full CI run on a busy 2-core machine, the interleave's own time came out ahead.
    slow = lambda features: dict(features, x=tf.numpy_function(  # noqa: E731
        lambda x: (__import__("time").sleep(0.05), x)[1], [features["x"]], tf.float32, stateful=False))
    profiled = dataclasses.replace(tuned, map_parallelism=1, autotune=True)  # the model needs autotune on
    dataset = build_dataset(profiled, [os.path.join(shards, "*.gz")], SCHEMA, shuffle=False, transform=slow)
    rows = stages.profile_pipeline(dataset)
    names = [r["stage"] for r in rows]
    assert any("Interleave" in n for n in names) and any("Map" in n for n in names)
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-6
    slowest = max(rows, key=lambda r: r["processing_time_s"])
    assert "Map" in slowest["stage"], rows  # the sleeping parse map
    written = stages.write_breakdown(rows, str(tmp_path))
    assert written["recommendation"].startswith(f"Slowest stage: {slowest['stage']} ")
    assert written["recommendation"].endswith("; raise its num_parallel_calls, vectorise it, or cache after it.")
    assert open(written["png"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert json.load(open(written["json"]))["stages"] == json.loads(json.dumps(rows))
    # Shuffled, a second map gathers each permuted window: it was summed into the parse map's row by name.
    shuffled = build_dataset(profiled, [os.path.join(shards, "*.gz")], SCHEMA, shuffle=True, transform=slow)
    rows = stages.profile_pipeline(shuffled)
    names = [r["stage"] for r in rows]
    maps = [n for n in names if n.startswith("ParallelMapV2")]
    assert len(set(names)) == len(names) and len(maps) >= 2, names
    assert maps == [f"ParallelMapV2 #{k}" for k in range(1, len(maps) + 1)], "numbered from the output"


def test_stages_that_drop_out_of_the_model_keep_their_figures_and_the_rest_are_counted_to_the_end():
    """A stage whose input is exhausted leaves tf.data's model: the parse map once a cache is full, every stage
    under the repeat at the end. The breakdown was the last snapshot showing every kind of stage, taken before the
    map finished: its output counts stopped there (4 of 200 elements once, in CI)."""
    options = tf.data.Options()
    options.autotune.enabled = True
    dataset = (tf.data.Dataset.range(40).map(lambda x: x * 2, num_parallel_calls=2).cache().repeat(5)
               .prefetch(1).with_options(options))
    rows = {row["stage"]: row for row in stages.profile_pipeline(dataset)}
    assert "ParallelMapV2" in rows and rows["ParallelMapV2"]["num_elements"] >= 4, rows  # seen until it ended
    assert any("MemoryCache" in name for name in rows), rows
    assert rows["Prefetch"]["num_elements"] == rows["FiniteRepeat"]["num_elements"] == 200, rows
    assert list(rows)[0] == "Prefetch" and abs(sum(row["share"] for row in rows.values()) - 1) < 1e-6
    assert stages.profile_pipeline(dataset, max_elements=50)[0]["num_elements"] <= 51


def test_stage_rows_sum_the_readers_of_all_shards_and_keep_two_maps_apart():
    """The shape of the tuned shuffled pipeline, as tf.data's model reports it: readers of three shards under
    an interleave, the parse map over it and the window-gather map nearer the output. Summed by name, the two
    maps were one row."""
    from tensorflow.core.framework import model_pb2

    model = model_pb2.ModelProto(output=1)
    shape = {1: ("Prefetch", [2], 1), 2: ("ParallelMapV2", [3], 4), 3: ("FlatMap", [4], 1),
             4: ("ParallelMapV2", [5], 12), 5: ("Interleave", [6, 7, 8], 1),
             6: ("TFRecord", [], 2), 7: ("TFRecord", [], 3), 8: ("TFRecord", [], 5)}
    for node_id, (name, inputs, ms) in shape.items():
        node = model.nodes[node_id]
        node.id, node.name, node.processing_time, node.num_elements = node_id, name, ms * 10 ** 6, 10
        node.inputs.extend(inputs)
    rows = stages.stages_from_proto(model)
    assert [(r["stage"], r["nodes"], round(r["processing_time_s"] * 1e3)) for r in rows] == [
        ("Prefetch", 1, 1), ("ParallelMapV2 #1", 1, 4), ("FlatMap", 1, 1), ("ParallelMapV2 #2", 1, 12),
        ("Interleave", 1, 1), ("TFRecord", 3, 10)]
    assert stages.recommendation(rows).startswith("Slowest stage: ParallelMapV2 #2 (41% of the 29.0 ms")


def test_transform_writes_the_tuned_spec_and_breakdown(penguin_outputs):
    folder = penguin_outputs["Transform"]["input_pipeline"]
    spec = input_pipeline.read_spec(folder)
    assert spec.decision("cache")["value"] == "memory" and spec.measurements["sample_records"] > 100
    assert os.path.getsize(os.path.join(folder, "stages.png")) > 1000
    advice = json.load(open(os.path.join(folder, "stages.json")))["recommendation"]
    # The penguin sample costs about a millisecond in all: which stage is slowest then changes from run to run,
    # and advice to tune it would be noise.
    assert advice.startswith("Slowest stage: ") and advice.endswith("; at that cost no stage is worth tuning.")


def _tiny_model():
    import tf_keras

    model = tf_keras.Sequential([tf_keras.layers.Dense(4, activation="relu"), tf_keras.layers.Dense(3)])
    model.compile(tf_keras.optimizers.Adam(0.01), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# Each batch of the slow pipelines below sleeps this long; an in-memory block of steps of the tiny model takes a
# few ms, and up to about 70 ms on a loaded 2-core machine, so the bounds are multiples of the sleep.
SLEEP_S = 0.05


def test_input_stall_separates_a_slow_pipeline_and_leaves_the_model_untouched():
    x = np.random.default_rng(0).normal(size=(640, 5)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    fast = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    slow = fast.map(lambda a, b: tf.numpy_function(lambda a, b: (__import__("time").sleep(SLEEP_S), a, b)[1:],
                                                   [a, b], [tf.float32, tf.int64]))
    slow = slow.map(lambda a, b: (tf.ensure_shape(a, [16, 5]), tf.ensure_shape(b, [16])))
    model = _tiny_model()
    model.fit(fast, steps_per_epoch=5, epochs=1, verbose=0)
    before = [v.numpy().copy() for v in model.variables] + [v.numpy().copy() for v in model.optimizer.variables()]
    waited = measure_input_stall(model, slow, steps=8, block_steps=5)
    after = [v.numpy() for v in model.variables] + [v.numpy() for v in model.optimizer.variables()]
    assert waited["stall_fraction"] > 0.7, waited  # 50 ms of sleep against a sub-millisecond step
    assert waited["real_step_s"] > 0.8 * SLEEP_S > 2 * waited["in_memory_step_s"], waited
    # 3 x 8 steps from each feed, in alternating blocks of 5 (the last one of 4): every pipeline
    # block waited on its sleeps, no in-memory block did.
    assert len(waited["real_block_s"]) == len(waited["in_memory_block_s"]) == 5
    assert min(waited["real_block_s"][:4]) > 4 * SLEEP_S and min(waited["real_block_s"][4:]) > 3 * SLEEP_S, waited
    assert max(waited["in_memory_block_s"]) < 2 * SLEEP_S, waited
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    # 50 ms per batch is a slow stage, not the fixed cost of a feed: the advice points at the breakdown.
    assert describe_stall(waited).endswith("The pipeline is slower than the model; the stage breakdown names where "
                                           "its time goes.")


def test_a_memory_source_gives_the_replayed_batches_and_the_pipeline_is_read_only_for_its_own_feed():
    """The in-memory feed replays the memory source's first batches (the training data unshuffled, say), so the
    probed pipeline is started once, for its own feed, not a second time to fill the replay."""
    x = np.random.default_rng(0).normal(size=(640, 5)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    fast = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    produced = []

    def slowly(a, b):
        produced.append(1)
        __import__("time").sleep(SLEEP_S)
        return a, b

    slow = fast.map(lambda a, b: tf.numpy_function(slowly, [a, b], [tf.float32, tf.int64]))
    slow = slow.map(lambda a, b: (tf.ensure_shape(a, [16, 5]), tf.ensure_shape(b, [16])))
    model = _tiny_model()
    model.fit(fast, steps_per_epoch=5, epochs=1, verbose=0)
    waited = measure_input_stall(model, slow, steps=8, block_steps=5, memory_source=fast)
    assert waited["stall_fraction"] > 0.7 and max(waited["in_memory_block_s"]) < 2 * SLEEP_S, waited
    # 2 warm-up and 3 x 8 timed steps, and what the feed's prefetch reads ahead; filling the replay from the pipeline
    # would read 2 + 8 more
    assert 26 <= len(produced) < 26 + 8, len(produced)
    with pytest.raises(ValueError, match="needs 8 batches to replay, the memory source has 3"):
        measure_input_stall(model, slow, steps=8, memory_source=fast.take(3))


def test_a_stall_from_the_fixed_cost_of_a_short_step_says_so():
    """A sub-millisecond step over a fast pipeline stalls only on what feeding any step costs; the penguin run
    logged an 18% stall with no word on why, which read as a slow pipeline."""
    short = {"stall_fraction": 1 - 0.67 / 0.82, "real_step_s": 0.00082, "in_memory_step_s": 0.00067}
    assert describe_stall(short) == (
        "Input stall: 18.3% of each step waits on input (0.82 ms per step from the pipeline, 0.67 ms from memory). "
        "The pipeline adds 0.15 ms per batch, the fixed cost of feeding a step, which is a large share of a step "
        "this short; a larger batch_size spreads it over more examples.")
    # Under B3's 5% there is nothing to advise.
    assert describe_stall({"stall_fraction": 0.04, "real_step_s": 0.0104, "in_memory_step_s": 0.01}) == (
        "Input stall: 4.0% of each step waits on input (10.40 ms per step from the pipeline, 10.00 ms from memory).")


def test_input_stall_is_in_the_run_record(penguin_dag_run):
    from hpml.pipelines import records

    run = records.client().get_run(penguin_dag_run["mlflow_run_id"])
    assert 0.0 <= run.data.metrics["input_stall_fraction"] < 1.0
    assert run.data.metrics["input_step_seconds"] > 0 and run.data.metrics["skipped_shards"] == 0
    assert run.data.tags["hpml.input_pipeline"].startswith("Slowest stage: ")
    assert run.data.tags["input_pipeline.cache"] == "memory"


def test_trainer_data_accessor_reads_what_tfxio_reads(penguin_outputs):
    from tfx_bsl.public import tfxio

    from hpml.components.trainer.fn_args import make_data_accessor, tfxio_data_accessor

    schema = tft.TFTransformOutput(penguin_outputs["Transform"]["transform_graph"]).transformed_metadata.schema
    pattern = [os.path.join(penguin_outputs["Transform"]["transformed_examples"], "Split-train", "*.gz")]
    options = tfxio.TensorFlowDatasetOptions(batch_size=8, label_key="species", num_epochs=1, shuffle=False)

    def rows(accessor):
        out = []
        for features, labels in accessor.tf_dataset_factory(pattern, options, schema):
            out += list(zip(labels.numpy().ravel().tolist(), np.ravel(features["body_mass_g"].numpy()).tolist()))
        return sorted(out)

    tuned = make_data_accessor(penguin_outputs["Transform"]["input_pipeline"])
    assert rows(tuned) == rows(tfxio_data_accessor()) and len(rows(tuned)) > 150


@pytest.mark.parametrize("damage, named", [
    (lambda raw: raw[:200] + b"\x00garbage" * 30 + raw[440:], "corrupt TFRecord shard"),  # read, then named
    (_trailer_cut, "Trainer examples: shard.s. not as their writer left them"),  # named from its size, unread
], ids=["garbage", "cut"])
def test_trainer_names_a_corrupt_transformed_shard(penguin_outputs, tmp_path, damage, named):
    from hpml.components.trainer import TRAINER

    examples = tmp_path / "examples"
    shutil.copytree(penguin_outputs["Transform"]["transformed_examples"], examples)
    victim = sorted((examples / "Split-train").glob("*.gz"))[0]
    victim.write_bytes(damage(victim.read_bytes()))
    inputs = {"examples": str(examples), "transform_graph": penguin_outputs["Transform"]["transform_graph"],
              "schema": penguin_outputs["ExampleGen"]["schema"],
              "input_pipeline": penguin_outputs["Transform"]["input_pipeline"]}
    outputs = {"model": str(tmp_path / "model"), "model_run": str(tmp_path / "model_run")}
    with pytest.raises(InputDataError, match=f"{named}.*{victim.name}"):
        TRAINER.run(inputs, outputs, {"module": "hpml.examples.penguin.module", "hyperparameters": {"epochs": 1}})
    assert not os.path.exists(outputs["model"]), "a failed Trainer publishes nothing"


def _cache_ops(dataset) -> list[str]:
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    return [node.op for node in graph.node if "Cache" in node.op or "Snapshot" in node.op]


def test_a_trainer_of_one_epoch_caches_nothing(penguin_outputs, tmp_path):
    """A cache pays only when the data is read again; for one epoch it would only hold every row, in memory that
    grows with the data. More epochs keep the tuned cache."""
    from tfx_bsl.public import tfxio

    from hpml.components.input_pipeline import read_spec
    from hpml.components.trainer import TRAINER
    from hpml.components.trainer.fn_args import make_data_accessor

    tuned = penguin_outputs["Transform"]["input_pipeline"]
    assert read_spec(tuned).cache == "memory"
    schema = tft.TFTransformOutput(penguin_outputs["Transform"]["transform_graph"]).transformed_metadata.schema
    pattern = [os.path.join(penguin_outputs["Transform"]["transformed_examples"], "Split-train", "*.gz")]
    endless = tfxio.TensorFlowDatasetOptions(batch_size=8, label_key="species", num_epochs=None, shuffle=True)
    ops = {epochs: _cache_ops(make_data_accessor(tuned, epochs=epochs).tf_dataset_factory(pattern, endless, schema))
           for epochs in (1, 2, None)}
    assert ops == {1: [], 2: ["CacheDatasetV2"], None: ["CacheDatasetV2"]}

    inputs = {"examples": penguin_outputs["Transform"]["transformed_examples"], "input_pipeline": tuned,
              "transform_graph": penguin_outputs["Transform"]["transform_graph"],
              "schema": penguin_outputs["ExampleGen"]["schema"]}
    result = TRAINER.run(inputs, {"model": str(tmp_path / "model"), "model_run": str(tmp_path / "model_run")},
                         {"module": "hpml.examples.penguin.module", "hyperparameters": {"epochs": 1}})
    assert result["input_cache"] == "none (one epoch reads the data once; tuned: memory)"
    assert result["history"] and len(result["history"]) == 1


def test_the_passes_a_trainer_reads_in_full_count_its_epochs_last_batches_and_nothing_it_cannot_know():
    """Past them the training read draws small windows (see shuffle_and_repeat): a count too high would thin the
    shuffle of real training rows, so where an epoch is not known to be one pass none is given."""
    from hpml.components.trainer.fn_args import training_epochs, training_passes

    assert training_epochs(3, None, "one_device") == 3
    assert training_epochs(3, 50, "one_device") is None, "the user's train_steps set the epoch, not the data"
    assert training_epochs(3, None, "parameter_server") is None, "the coordinator hands out steps to any worker"
    assert training_epochs(3, None, "multi_worker_mirrored") is None
    assert training_epochs(None, None, "mirrored") is None
    # 666,693 rows in batches of 1,024: an epoch is 652 steps, 955 rows into the next pass.
    assert training_passes(1, 666_693, 1024) == 1
    assert training_passes(698, 666_693, 1024) == 698 and training_passes(699, 666_693, 1024) == 700
    assert training_passes(50, 20_000, 1024) == 51, "50 epochs of 20 steps read 51.2 passes"
    assert training_passes(5, 1024, 1024) == 5
    assert training_passes(3, None, 1024) is None and training_passes(None, 1000, 32) is None
