"""The per-epoch metrics line: throughput and step time measure training, not validation."""
import re
import time

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from hpml.components.trainer.callbacks import EpochMetricsLogger, read_metrics

SLEEP_S = 0.3  # per validation batch: far longer than a training step of this model


def _slow(x, y):
    def wait(v):
        time.sleep(SLEEP_S)
        return v

    return tf.py_function(wait, [x], tf.float32), y


def test_throughput_and_step_time_leave_validation_out(tmp_path, caplog):
    x, y = np.ones((64, 3), np.float32), np.zeros((64, 1), np.float32)
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    validation = tf.data.Dataset.from_tensor_slices((x[:16], y[:16])).batch(8).map(_slow)
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with caplog.at_level("INFO", logger="hpml.trainer"):
        model.fit(train, validation_data=validation, epochs=2, verbose=0,
                  callbacks=[EpochMetricsLogger(str(tmp_path), batch_size=8, total_epochs=2)])
    rows = read_metrics(str(tmp_path))
    assert [row["epoch"] for row in rows] == [1, 2]
    for row in rows:
        assert row["val_seconds"] >= 2 * SLEEP_S, row
        train_seconds = row["step_time_ms"] * 8 / 1000.0  # 8 steps
        assert train_seconds + row["val_seconds"] <= row["seconds"], "the epoch-end callbacks are in neither"
        assert row["examples_per_sec"] == pytest.approx(64 / train_seconds, rel=1e-6)
        assert train_seconds < row["seconds"] - 2 * SLEEP_S, "the slow validation is not in the throughput"
    # The log line rounds each figure to what it can tell: before, "examples_per_sec=20202.2407".
    lines = [r.getMessage() for r in caplog.records if r.name == "hpml.trainer"]
    assert len(lines) == 2
    assert re.fullmatch(r"epoch 1/2 examples_per_sec=\d+ loss=\d+\.\d{4} step_time_ms=\d+\.\d{2} "
                        r"val_loss=\d+\.\d{4} eta=\d+\.\ds", lines[0]), lines[0]
    assert f"examples_per_sec={rows[0]['examples_per_sec']:.0f} " in lines[0]


def test_a_small_loss_is_not_shown_as_zero():
    from hpml.components.trainer.callbacks.epoch_metrics import shown as _shown

    shown = [_shown("loss", v) for v in (0.0117, 0.00014, 1.2e-5, 0.0, float("nan"))]
    assert shown == ["0.0117", "1.400e-04", "1.200e-05", "0.0000", "nan"]  # 0.00014 read as "0.0001"


def test_throughput_counts_the_examples_of_a_short_last_batch(tmp_path):
    """60 examples in batches of 8 make 8 steps, the last of 4 examples. Throughput counted 8 x 8 = 64 examples
    per epoch: 7% too many here, and 2.4x for penguin's 217 train examples at batch_size 512."""
    x, y = np.ones((60, 3), np.float32), np.zeros((60, 1), np.float32)
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    logger = EpochMetricsLogger(str(tmp_path), batch_size=8, total_epochs=2, examples_per_epoch=60)
    model.fit(train, epochs=2, verbose=0, callbacks=[logger])
    for row in read_metrics(str(tmp_path)):
        train_seconds = row["step_time_ms"] * 8 / 1000.0
        assert row["examples_per_sec"] == pytest.approx(60 / train_seconds, rel=1e-6)


def test_a_batch_size_above_the_training_split_is_named_in_a_warning(tmp_path, caplog):
    """batch_size 512 on penguin's ~230 train examples trained one short step per epoch, and nothing said so."""
    import types

    from hpml.components.trainer.callbacks import epoch_size, standard_callbacks

    fn_args = types.SimpleNamespace(working_dir=str(tmp_path / "work"), model_run_dir=str(tmp_path / "run"))
    data = tf.data.Dataset.from_tensor_slices(np.ones((60, 3), np.float32))
    for batch_size in (64, 60, 8):
        steps, examples = epoch_size(data.batch(batch_size))
        caplog.clear()
        with caplog.at_level("WARNING", logger="hpml.trainer"):
            standard_callbacks(fn_args, "one_device", batch_size, epochs=1, examples_per_epoch=examples)
        warnings = [r.getMessage() for r in caplog.records if "training examples" in r.getMessage()]
        if batch_size > 60:
            assert steps == 1
            assert warnings == ["batch_size 64 is larger than the 60 training examples: each epoch is one step of "
                                "60 examples; lower batch_size for more than one step per epoch"]
        else:
            assert warnings == [], batch_size


def test_an_epoch_s_length_comes_from_the_examples_example_gen_and_transform_counted(penguin_outputs, tmp_path):
    """ExampleGen and Transform record each split's examples: given a whole split's file pattern, epoch_size answers
    from the record what a pass over the data counts, without the pass; a list of chosen shards, or examples with no
    record (TFX's ExampleGen writes none), are counted."""
    import functools
    import glob
    import shutil

    from hpml.components import artifacts
    from hpml.components.trainer.callbacks import epoch_size

    for node, output, pattern_of in (("ExampleGen", "examples", artifacts.examples_file_pattern),
                                     ("Transform", "transformed_examples",
                                      artifacts.transformed_examples_file_pattern)):
        uri = penguin_outputs[node][output]
        patterns = [pattern_of(uri, split) for split in ("train", "eval")]
        counted = {}
        for pattern in patterns:
            data = tf.data.TFRecordDataset(sorted(glob.glob(pattern)), compression_type="GZIP").batch(16)
            counted[pattern] = epoch_size(data)
            assert counted[pattern][1] > 50
            # data.take(1) would count one batch: the answer comes from the record
            assert epoch_size(data.take(1), [pattern], 16) == counted[pattern], (node, pattern)
        both = sum(examples for _, examples in counted.values())
        assert epoch_size(data.take(1), patterns, 16) == (-(-both // 16), both)
        assert epoch_size(data.take(1), sorted(glob.glob(patterns[0])), 16) == (1, 16), "chosen shards: counted"

        def never_built():
            raise AssertionError("the recorded count answers without building the dataset")

        # A function that builds the dataset is called only where a pass must count.
        assert epoch_size(never_built, [patterns[0]], 16) == counted[patterns[0]]
        assert epoch_size(functools.partial(data.take, 1), sorted(glob.glob(patterns[0])), 16) == (1, 16)

    unrecorded = tmp_path / "examples"
    shutil.copytree(penguin_outputs["ExampleGen"]["examples"], unrecorded)
    (unrecorded / artifacts.SPLIT_EXAMPLES_FILE).unlink()
    assert artifacts.recorded_examples([artifacts.examples_file_pattern(str(unrecorded), "train")]) is None
