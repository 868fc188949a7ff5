"""ExampleGen on Beam's in-process runner: TFX layout, hash split, schema, bad input."""
import glob
import gzip
import json
import logging
import math
import os
import re

import pytest
import tensorflow as tf
from tensorflow_metadata.proto.v0 import schema_pb2

from hpml.components import artifacts
from hpml.components.errors import InputDataError, SpecError
from hpml.components.example_gen import EXAMPLE_GEN
from hpml.components.schema_file import read_schema, write_schema
from tests.helpers import write_csv

HEADER = "species,island,bill_length_mm,year"


def _rows(n):
    islands = ["Biscoe", "Dream", "Torgersen"]
    return [f"{['Adelie', 'Gentoo'][i % 2]},{islands[i % 3]},{30 + i * 0.5},{2007 + i % 3}" for i in range(n)]


def _run(tmp_path, params, name="out"):
    outputs = {"examples": str(tmp_path / name / "examples"), "schema": str(tmp_path / name / "schema")}
    return EXAMPLE_GEN.run({}, outputs, params), outputs


def _read(pattern):
    return [tf.train.Example.FromString(r.numpy())
            for f in sorted(glob.glob(pattern)) for r in tf.data.TFRecordDataset(f, compression_type="GZIP")]


def test_tfx_layout_split_and_schema(tmp_path):
    csv = write_csv(tmp_path / "data.csv", HEADER, _rows(300))
    props, out = _run(tmp_path, {"input_path": csv})
    assert sorted(os.listdir(out["examples"])) == ["Split-eval", "Split-train", "shard_sizes.json",
                                                   "split_examples.json"]
    assert json.load(open(os.path.join(out["examples"], "split_examples.json"))) == props["split_counts"]
    assert sum(props["split_counts"].values()) == 300
    recorded = json.load(open(os.path.join(out["examples"], "shard_sizes.json")))["shards"]
    for split in ("train", "eval"):
        files = os.listdir(os.path.join(out["examples"], f"Split-{split}"))
        assert files == ["data_tfrecord-00000-of-00001.gz"]
        with open(os.path.join(out["examples"], f"Split-{split}", files[0]), "rb") as handle:
            assert handle.read(2) == b"\x1f\x8b", "records must be GZIP-compressed"
        assert recorded[f"Split-{split}/{files[0]}"] == os.path.getsize(
            os.path.join(out["examples"], f"Split-{split}", files[0]))
    assert len(recorded) == 2
    counts = props["split_counts"]
    assert counts["train"] + counts["eval"] == 300
    assert 0.55 < counts["train"] / 300 < 0.78, f"2:1 hash split expected, got {counts}"
    example = _read(os.path.join(out["examples"], "Split-train", "*.gz"))[0]
    feats = example.features.feature
    assert feats["year"].int64_list.value and feats["bill_length_mm"].float_list.value
    assert feats["species"].bytes_list.value[0] in (b"Adelie", b"Gentoo")
    schema = read_schema(os.path.join(out["schema"], "schema.pbtxt"))
    kinds = {f.name: f.type for f in schema.feature}
    from tensorflow_metadata.proto.v0 import schema_pb2

    assert kinds == {"species": schema_pb2.BYTES, "island": schema_pb2.BYTES,
                     "bill_length_mm": schema_pb2.FLOAT, "year": schema_pb2.INT}


def test_beam_runs_in_process_and_never_tries_to_fetch_prism(tmp_path, caplog):
    """Beam 2.77's DirectRunner first downloads its Prism runner from GitHub (and logs that it does so); the
    default runner must never try. Naming DirectRunner in beam_pipeline_args gives those lines here."""
    caplog.set_level(logging.INFO, logger="apache_beam")
    csv = write_csv(tmp_path / "data.csv", HEADER, _rows(30))
    props, _ = _run(tmp_path, {"input_path": csv})
    assert props["split_counts"]["train"] + props["split_counts"]["eval"] == 30
    beam_lines = [r.getMessage() for r in caplog.records if r.name.startswith("apache_beam")]
    assert beam_lines, "Beam's own log lines are what this test reads"
    assert not [line for line in beam_lines if "prism" in line.lower()]


def test_split_is_deterministic_and_configurable(tmp_path):
    csv = write_csv(tmp_path / "data.csv", HEADER, _rows(120))
    a, out_a = _run(tmp_path, {"input_path": csv}, "a")
    b, out_b = _run(tmp_path, {"input_path": csv}, "b")
    assert a["split_counts"] == b["split_counts"]
    assert [e.SerializeToString() for e in _read(out_a["examples"] + "/Split-eval/*.gz")] == \
        [e.SerializeToString() for e in _read(out_b["examples"] + "/Split-eval/*.gz")]
    c, out_c = _run(tmp_path, {"input_path": csv, "splits": {"train": 8, "eval": 1, "test": 1}}, "c")
    assert artifacts.list_splits(out_c["examples"]) == ["eval", "test", "train"]
    assert c["split_counts"]["train"] > 3 * c["split_counts"]["eval"]


def test_split_is_the_same_in_every_process(tmp_path):
    """The hash split keys on serialized examples: map order must not depend on the process."""
    import subprocess
    import sys

    header = ",".join(f"c{i}" for i in range(24))
    csv = write_csv(tmp_path / "wide.csv", header, [",".join(str(i * j % 17) for j in range(24)) for i in range(90)])
    script = ("import sys; from hpml.components.example_gen import EXAMPLE_GEN; "
              "print('COUNTS', EXAMPLE_GEN.run({}, {'examples': sys.argv[2], 'schema': sys.argv[3]}, "
              "{'input_path': sys.argv[1]})['split_counts'])")
    runs = []
    for name in ("first", "second"):
        out = tmp_path / name
        done = subprocess.run([sys.executable, "-c", script, csv, str(out / "examples"), str(out / "schema")],
                              capture_output=True, text=True, timeout=300,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert done.returncode == 0, done.stderr[-2000:]
        eval_bytes = [open(f, "rb").read() for f in sorted(glob.glob(str(out / "examples" / "Split-eval" / "*.gz")))]
        runs.append((done.stdout.split("COUNTS", 1)[1].strip(), [gzip.decompress(b) for b in eval_bytes]))
    assert runs[0] == runs[1], "two processes split the same CSV differently"


def test_missing_values_leave_the_feature_out_and_schema_marks_it_optional(tmp_path, penguin_csv):
    props, out = _run(tmp_path, {"input_path": penguin_csv})
    schema = {f.name: f for f in read_schema(os.path.join(out["schema"], "schema.pbtxt")).feature}
    assert not schema["sex"].HasField("shape"), "sex has NA rows, so it must be a VarLen feature"
    assert schema["year"].shape.dim[0].size == 1, "year is never missing, so it is fixed-length"
    examples = _read(out["examples"] + "/Split-*/*.gz")
    assert len(examples) == 344
    assert sum("sex" not in e.features.feature for e in examples) == 11


def test_a_column_with_no_value_in_any_row_is_named_and_disabled_in_the_schema(tmp_path, caplog):
    """An all-empty column used to vanish from the schema, so Transform said "feature 'island' is not in the
    schema" of a column the CSV plainly has. It is now a DISABLED feature (which tf.Transform skips), and the
    log and the result name it."""
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tensorflow_transform.tf_metadata import schema_utils

    rows = [",".join(cell if i != 1 else "NA" for i, cell in enumerate(row.split(","))) for row in _rows(30)]
    csv = write_csv(tmp_path / "no_island.csv", HEADER, rows)
    with caplog.at_level("WARNING", logger="hpml.example_gen"):
        props, out = _run(tmp_path, {"input_path": csv}, "no_island")
    assert props["empty_columns"] == ["island"]
    assert any("column(s) island hold no value in any row" in r.getMessage() for r in caplog.records)
    schema = read_schema(os.path.join(out["schema"], "schema.pbtxt"))
    features = {f.name: f for f in schema.feature}
    assert sorted(features) == ["bill_length_mm", "island", "species", "year"]
    assert features["island"].lifecycle_stage == schema_pb2.DISABLED
    assert sorted(schema_utils.schema_as_feature_spec(schema).feature_spec) == ["bill_length_mm", "species", "year"]
    assert all("island" not in e.features.feature for e in _read(out["examples"] + "/Split-*/*.gz"))
    full, _ = _run(tmp_path, {"input_path": write_csv(tmp_path / "full.csv", HEADER, _rows(30))}, "full")
    assert full["empty_columns"] == []
    # A schema the data must match that names the empty column says so, rather than "not in the data".
    expected = tmp_path / "expected.pbtxt"
    write_schema(read_schema(os.path.join(out["schema"], "schema.pbtxt")), str(expected))
    named = read_schema(str(expected))
    features = {f.name: f for f in named.feature}
    features["island"].lifecycle_stage = schema_pb2.UNKNOWN_STAGE
    features["island"].ClearField("annotation")
    write_schema(named, str(expected))
    with pytest.raises(InputDataError, match=r"schema field 'island' is a column with no value in any row$"):
        _run(tmp_path, {"input_path": csv, "schema_path": str(expected)}, "expected")
    # One that does not name it is matched, and the column is still named, as in an inferred schema.
    del named.feature[[f.name for f in named.feature].index("island")]
    write_schema(named, str(expected))
    props, out = _run(tmp_path, {"input_path": csv, "schema_path": str(expected)}, "expected_without")
    assert props["empty_columns"] == ["island"]
    assert read_schema(os.path.join(out["schema"], "schema.pbtxt")) == schema


def test_malformed_row_names_file_and_line(tmp_path):
    rows = _rows(10)
    rows[4] = "Adelie,Dream,1.0,2007,EXTRA"
    csv = write_csv(tmp_path / "bad.csv", HEADER, rows)
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": csv})
    assert str(err.value) == f"{csv}:6: expected 4 fields, got 5"
    assert err.value.hint == "fix the row, or set skip_bad_rows=true", "Beam's re-raise must keep the hint"
    assert os.listdir(tmp_path / "out") == [], "a failed run must leave no artifact and no temporary"


@pytest.mark.parametrize("last_column", [False, True], ids=["ragged", "width-kept"])
def test_an_unclosed_quote_is_named_where_it_opened_not_at_the_end_of_the_file(tmp_path, monkeypatch, last_column):
    """The per-row reader reads to the end of the file inside the quote; where the quote is in the last column,
    Arrow accepts the rest of the file as one value, so the chunk must still be read row by row."""
    from hpml.components.example_gen import csv_chunks

    monkeypatch.setattr(csv_chunks, "CHUNK_BYTES", 1 << 10)  # many chunks before the quote, and after it
    rows = _rows(400)
    rows[250] = 'Adelie,Dream,1.0,"2007' if last_column else 'Adelie,"Dream,1.0,2007'
    csv = write_csv(tmp_path / "bad.csv", HEADER, rows)
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": csv})
    assert str(err.value) == f"{csv}:252: a quoted value opened on this line is never closed, so lines 252-401 " \
                             "read as one row"
    assert err.value.hint == 'close the quote (a quote inside a quoted value is written twice: ""), or set ' \
                             'skip_bad_rows=true'
    props, _ = _run(tmp_path, {"input_path": csv, "skip_bad_rows": True}, "skipped")
    assert (props["bad_rows"], sum(props["split_counts"].values())) == (1, 250)


def test_a_nul_byte_in_a_value_is_a_bad_row_named_by_line_and_column(tmp_path, caplog):
    rows = _rows(40)
    rows[7] = "Adelie,Dr\x00eam,1.0,2007"
    csv = write_csv(tmp_path / "nul.csv", HEADER, rows)
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": csv})
    assert str(err.value) == f"{csv}:9: column 'island' holds a NUL byte (\\x00)"
    assert "UTF-16" in err.value.hint and err.value.hint.endswith("or set skip_bad_rows=true")
    with caplog.at_level("WARNING", logger="hpml.example_gen"):
        props, out = _run(tmp_path, {"input_path": csv, "skip_bad_rows": True}, "skipped")
    assert (props["bad_rows"], sum(props["split_counts"].values())) == (1, 39)
    assert f"skipped bad row {csv}:9: column 'island' holds a NUL byte (\\x00)" in caplog.messages
    stored = [v for e in _read(os.path.join(out["examples"], "*", "*.gz")) for v in
              e.features.feature["island"].bytes_list.value]
    assert len(stored) == 39 and not any(b"\x00" in v for v in stored)


def test_rename_columns_gives_csv_columns_feature_names(tmp_path):
    csv = write_csv(tmp_path / "data.csv", "Species name,island,bill length (mm),year", _rows(60))
    props, out = _run(tmp_path, {"input_path": csv, "rename_columns": {"Species name": "species",
                                                                         "bill length (mm)": "bill_length_mm"},
                                 "required_columns": ["species"], "numeric_columns": ["bill_length_mm"]})
    assert sum(props["split_counts"].values()) == 60
    assert {f.name for f in read_schema(os.path.join(out["schema"], "schema.pbtxt")).feature} == \
        {"species", "island", "bill_length_mm", "year"}
    assert set(_read(os.path.join(out["examples"], "*", "*.gz"))[0].features.feature) == \
        {"species", "island", "bill_length_mm", "year"}
    with pytest.raises(InputDataError, match=r"data\.csv:1: rename_columns names column\(s\) 'species' that the "
                                             r"header does not hold") as err:
        _run(tmp_path, {"input_path": csv, "rename_columns": {"species": "kind"}}, "unknown")
    assert "Species name" in err.value.hint
    with pytest.raises(InputDataError, match=r"feature name\(s\) 'island' name more than one column"):
        _run(tmp_path, {"input_path": csv, "rename_columns": {"Species name": "island"}}, "clash")
    with pytest.raises(SpecError, match=r"gives feature name\(s\) 'x' to more than one column"):
        _run(tmp_path, {"input_path": csv, "rename_columns": {"Species name": "x", "island": "x"}}, "twice")


def test_skip_bad_rows_counts_them_and_logs_the_first_few(tmp_path, caplog):
    """A skipped row used to leave no trace but a count in the run record: the user could not tell which
    rows, or why, without turning skip_bad_rows off again."""
    rows = _rows(40)
    rows[3] = "Adelie,Dream"
    rows[7] = "Adelie,Dream,1,2,3,4"
    for i in range(10, 16):
        rows[i] = "Adelie,Dream,x,2007"
    csv = write_csv(tmp_path / "bad.csv", HEADER, rows)
    with caplog.at_level("WARNING", logger="hpml.example_gen"):
        props, _ = _run(tmp_path, {"input_path": csv, "skip_bad_rows": True, "numeric_columns": ["bill_length_mm"]})
    assert props["bad_rows"] == 8
    assert sum(props["split_counts"].values()) == 32
    logged = [r.getMessage() for r in caplog.records if r.name == "hpml.example_gen"]
    assert logged[:5] == [f"skipped bad row {csv}:5: expected 4 fields, got 2",
                          f"skipped bad row {csv}:9: expected 4 fields, got 6",
                          *[f"skipped bad row {csv}:{n}: column 'bill_length_mm' must hold a number, got 'x'"
                            for n in (12, 13, 14)]]
    assert logged[5:] == ["ExampleGen skipped 8 bad row(s) of 40 (skip_bad_rows=true); the log above names the first"]


def test_missing_label_column(tmp_path):
    csv = write_csv(tmp_path / "nolabel.csv", "island,year", ["Dream,2007"] * 5)
    with pytest.raises(InputDataError, match=r"nolabel.csv:1: required column 'species' is missing"):
        _run(tmp_path, {"input_path": csv, "required_columns": ["species"]})
    # European Excel's "CSV" is ';'-separated, which reads as one column named by the whole header line.
    csv = write_csv(tmp_path / "excel.csv", HEADER.replace(",", ";"), ["Adelie;Dream;31.0;2007"] * 5)
    with pytest.raises(InputDataError, match=r"excel.csv:1: required column 'species' is missing") as err:
        _run(tmp_path, {"input_path": csv, "required_columns": ["species"]})
    assert err.value.hint == ("the columns are: species;island;bill_length_mm;year; the file looks ';'-separated, "
                              "and ExampleGen reads comma-separated CSV")


@pytest.mark.parametrize("content, message", [
    ("", "the file is empty"),
    (HEADER + "\n", "has a header but no data rows"),
])
def test_empty_input(tmp_path, content, message):
    path = tmp_path / "empty.csv"
    path.write_text(content)
    with pytest.raises(InputDataError, match=message):
        _run(tmp_path, {"input_path": str(path)})


def test_no_matching_files(tmp_path):
    with pytest.raises(InputDataError, match="no input files match"):
        _run(tmp_path, {"input_path": str(tmp_path / "nothing*.csv")})


def test_wrong_schema_names_the_field(tmp_path):
    csv = write_csv(tmp_path / "data.csv", HEADER, _rows(30))
    _, good = _run(tmp_path, {"input_path": csv}, "good")
    schema = read_schema(os.path.join(good["schema"], "schema.pbtxt"))
    for feature in schema.feature:
        if feature.name == "year":
            feature.type = 1  # BYTES
    wrong = str(tmp_path / "wrong.pbtxt")
    write_schema(schema, wrong)
    with pytest.raises(InputDataError, match="schema field 'year' is BYTES but the data holds INT"):
        _run(tmp_path, {"input_path": csv, "schema_path": wrong}, "bad")


def test_reads_existing_tfrecords_and_rejects_corrupt_ones(tmp_path):
    csv = write_csv(tmp_path / "data.csv", HEADER, _rows(90))
    _, first = _run(tmp_path, {"input_path": csv}, "first")
    props, _ = _run(tmp_path, {"input_path": first["examples"] + "/Split-*/*.gz", "input_format": "tfrecord"},
                    "again")
    assert sum(props["split_counts"].values()) == 90
    corrupt = tmp_path / "corrupt.tfrecord.gz"
    data = gzip.open(glob.glob(first["examples"] + "/Split-train/*.gz")[0]).read()
    with gzip.open(corrupt, "wb") as handle:
        handle.write(data[: len(data) // 2] + b"\x00garbage")
    with pytest.raises(InputDataError, match=r"corrupt.tfrecord.gz: corrupted TFRecord after record \d+ "
                                             r"\((corrupted|truncated) record at \d+[^{}\[\]]*\)$"):
        _run(tmp_path, {"input_path": str(corrupt), "input_format": "tfrecord"}, "bad")
    # TF's GZIP reader stops at the last whole record and never reads the trailer: a copy cut inside the
    # trailer read as complete, and so did the file of a writer killed after a flush, with records missing.
    whole = open(glob.glob(first["examples"] + "/Split-train/*.gz")[0], "rb").read()
    cut = tmp_path / "cut.tfrecord.gz"
    records = [e.SerializeToString() for e in _read(glob.glob(first["examples"] + "/Split-*/*.gz")[0])]
    with tf.io.TFRecordWriter(str(tmp_path / "flushed.gz"), options="GZIP") as writer:
        for record in records[:20]:
            writer.write(record)
            writer.flush()
        flushed = open(tmp_path / "flushed.gz", "rb").read()  # what a writer killed here leaves
    assert len(_read(str(tmp_path / "flushed.gz"))) == 20
    for name, data in (("trailer", whole[:-4]), ("flushed", flushed)):
        cut.write_bytes(data)
        if name == "flushed":
            assert [r.numpy() for r in tf.data.TFRecordDataset(str(cut), "GZIP")] == records[:20], "no error in TF"
        with pytest.raises(InputDataError) as err:
            _run(tmp_path, {"input_path": str(cut), "input_format": "tfrecord"}, name)
        assert re.fullmatch(rf"{cut}: corrupted GZIP data after record \d+ \(the file ends before its GZIP "
                            r"end-of-stream marker and trailer\)", str(err.value)), str(err.value)
    # Concatenated members (`cat train.gz eval.gz`) are one valid GZIP file, and every record in both is read.
    both = tmp_path / "both.tfrecord.gz"
    both.write_bytes(b"".join(open(f, "rb").read() for f in sorted(glob.glob(first["examples"] + "/Split-*/*.gz"))))
    props, _ = _run(tmp_path, {"input_path": str(both), "input_format": "tfrecord"}, "both")
    assert sum(props["split_counts"].values()) == 90
    # A CSV file read as TFRecord was "corrupted after record 0", quoting TF's op-level message.
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": csv, "input_format": "tfrecord"}, "csv")
    assert str(err.value) == f"{csv}: not a TFRecord file (it starts with 'species,island,bill_leng')"
    assert err.value.hint == "ExampleGen reads CSV files with input_format='csv'"


def test_a_word_in_a_numeric_column_is_a_bad_row_not_a_text_column(tmp_path):
    """Without numeric_columns one stray word turns the whole column into text, and the failure
    only shows much later, as a tf.Transform graph error that names neither file nor row."""
    rows = _rows(30)
    rows[6] = "Adelie,Dream,abc,2007"
    csv = write_csv(tmp_path / "word.csv", HEADER, rows)
    numeric = {"numeric_columns": ["bill_length_mm", "year"]}
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": csv, **numeric}, "strict")
    assert str(err.value) == f"{csv}:8: column 'bill_length_mm' must hold a number, got 'abc'"
    assert err.value.hint == "fix the row, or set skip_bad_rows=true"

    props, out = _run(tmp_path, {"input_path": csv, "skip_bad_rows": True, **numeric}, "skipped")
    assert props["bad_rows"] == 1 and sum(props["split_counts"].values()) == 29
    kinds = {f.name: f.type for f in read_schema(os.path.join(out["schema"], "schema.pbtxt")).feature}
    from tensorflow_metadata.proto.v0 import schema_pb2

    assert kinds["bill_length_mm"] == schema_pb2.FLOAT and kinds["year"] == schema_pb2.INT

    # Missing values (NA) and numbers in any notation are fine; a misspelt column name is not.
    rows[6] = "Adelie,Dream,NA,2007"
    rows[7] = "Adelie,Dream,1e2,2007"
    fine = write_csv(tmp_path / "fine.csv", HEADER, rows)
    assert sum(_run(tmp_path, {"input_path": fine, **numeric}, "fine")[0]["split_counts"].values()) == 30
    with pytest.raises(InputDataError, match=r"fine.csv:1: numeric column 'bill_lenght_mm' is missing"):
        _run(tmp_path, {"input_path": fine, "numeric_columns": ["bill_lenght_mm"]}, "typo")


def test_bytes_or_nan_in_a_numeric_tfrecord_feature_names_the_record(tmp_path):
    def example(value):
        feature = tf.train.Feature(**value)
        return tf.train.Example(features=tf.train.Features(feature={"x": feature})).SerializeToString()

    path = str(tmp_path / "mixed.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(20):
            writer.write(example({"float_list": tf.train.FloatList(value=[i])}))
        writer.write(example({"bytes_list": tf.train.BytesList(value=[b"oops"])}))
    params = {"input_path": path, "input_format": "tfrecord", "numeric_columns": ["x"]}
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, params, "strict")
    assert str(err.value) == f"{path}: record 21: feature 'x' must hold numbers, got bytes_list [b'oops']"
    props, _ = _run(tmp_path, dict(params, skip_bad_rows=True), "skipped")
    assert props["bad_rows"] == 1 and sum(props["split_counts"].values()) == 20

    # NaN would make the feature's statistics NaN; a tf.Example leaves a missing feature out instead.
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(20):
            writer.write(example({"float_list": tf.train.FloatList(value=[float("nan") if i == 4 else i])}))
    with pytest.raises(InputDataError, match=r"mixed.tfrecord: record 5: feature 'x' must hold finite numbers, "
                                             r"got \[nan\] \(leave the feature out where its value is missing\)$"):
        _run(tmp_path, params, "nan")
    # Declared or not: a float feature is a number column, as an inferred CSV column is.
    with pytest.raises(InputDataError, match=r"mixed.tfrecord: record 5: feature 'x' must hold finite numbers"):
        _run(tmp_path, dict(params, numeric_columns=[]), "nan_undeclared")
    props, _ = _run(tmp_path, dict(params, numeric_columns=[], skip_bad_rows=True), "nan_skipped")
    assert props["bad_rows"] == 1 and sum(props["split_counts"].values()) == 19


def test_a_tfrecord_feature_of_two_kinds_names_a_record_of_each(tmp_path):
    """A feature stored as float_list in one record and int64_list in another has no one schema type. The error
    named the feature only, so finding the odd record in a large input meant searching all of it."""
    def example(feature):
        return tf.train.Example(features=tf.train.Features(feature={"x": feature})).SerializeToString()

    first, second = str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")
    with tf.io.TFRecordWriter(first) as writer:
        for i in range(10):
            writer.write(example(tf.train.Feature(float_list=tf.train.FloatList(value=[i + 0.5]))))
    with tf.io.TFRecordWriter(second) as writer:
        for i in range(10):
            kind = tf.train.Feature(int64_list=tf.train.Int64List(value=[i])) if i == 6 else \
                tf.train.Feature(float_list=tf.train.FloatList(value=[i + 0.5]))
            writer.write(example(kind))
    params = {"input_path": str(tmp_path / "*.tfrecord"), "input_format": "tfrecord"}
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, params)
    assert str(err.value) == (f"feature 'x' is float_list in 19 records (first {first}: record 1) "
                              f"and int64_list in 1 record (first {second}: record 7)")
    assert err.value.hint == "store each feature as the same kind of list in every record"
    # skip_bad_rows does not choose between the kinds: either could be the intended one.
    with pytest.raises(InputDataError, match="feature 'x' is float_list in 19 records"):
        _run(tmp_path, dict(params, skip_bad_rows=True), "skipping")


def test_the_penguin_pipeline_declares_its_numeric_columns(tmp_path, penguin_csv):
    from hpml.pipelines import runner
    from hpml.examples.penguin.pipeline import PIPELINE

    header, *rows = open(penguin_csv, encoding="utf-8").read().splitlines()
    fields = rows[9].split(",")
    fields[header.split(",").index("flipper_length_mm")] = "n/a"
    rows[9] = ",".join(fields)
    csv = write_csv(tmp_path / "penguins.csv", header, rows)
    with pytest.raises(InputDataError, match=r"penguins.csv:11: column 'flipper_length_mm' must hold a number, "
                                             r"got 'n/a'$") as err:
        runner.run_local(PIPELINE, {"data_path": csv, "epochs": 1})
    assert err.value.hint == "fix the row, or set skip_bad_rows=true"


def test_a_byte_order_mark_is_not_part_of_the_first_column_name(tmp_path):
    """Excel's "CSV UTF-8" starts the file with a BOM; read as plain UTF-8 it glued itself to the first
    column's name, so 'species' was reported missing while the hint listed a 'species' column."""
    plain = write_csv(tmp_path / "plain.csv", HEADER, _rows(40))
    marked = tmp_path / "excel.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + open(plain, "rb").read())
    params = {"required_columns": ["species"], "numeric_columns": ["bill_length_mm"]}
    _, want = _run(tmp_path, {"input_path": plain, **params}, "plain")
    _, got = _run(tmp_path, {"input_path": str(marked), **params}, "marked")
    assert open(os.path.join(got["schema"], "schema.pbtxt")).read() == \
        open(os.path.join(want["schema"], "schema.pbtxt")).read()
    assert [e.SerializeToString() for e in _read(got["examples"] + "/Split-*/*.gz")] == \
        [e.SerializeToString() for e in _read(want["examples"] + "/Split-*/*.gz")]


def test_a_row_without_a_label_is_a_bad_row(tmp_path):
    """A missing label used to pass ExampleGen and Transform (tf.Transform maps it to -1) and only
    failed mid-training: 'Received a label value of -1 which is outside the valid range'."""
    rows = _rows(30)
    rows[2] = "NA,Dream,31.0,2007"
    csv = write_csv(tmp_path / "nolabel.csv", HEADER, rows)
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": csv, "required_columns": ["species"]}, "strict")
    assert str(err.value) == f"{csv}:4: required column 'species' has no value"
    props, _ = _run(tmp_path, {"input_path": csv, "required_columns": ["species"], "skip_bad_rows": True}, "skip")
    assert props["bad_rows"] == 1 and sum(props["split_counts"].values()) == 29
    # Other columns may still be missing: only the required ones must hold a value.
    rows[2] = "Adelie,NA,NA,2007"
    gaps = write_csv(tmp_path / "gaps.csv", HEADER, rows)
    assert _run(tmp_path, {"input_path": gaps, "required_columns": ["species"]}, "gaps")[0]["bad_rows"] == 0

    path = str(tmp_path / "nolabel.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(12):
            label = {"species": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"Adelie"]))} if i != 4 else {}
            x = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=[i]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature={**x, **label})).SerializeToString())
    with pytest.raises(InputDataError, match=r"nolabel.tfrecord: record 5: required feature 'species' has no value$"):
        _run(tmp_path, {"input_path": path, "input_format": "tfrecord", "required_columns": ["species"]}, "tfr")


def test_a_spark_style_output_directory_reads_only_its_data_files(tmp_path):
    """Spark and Hadoop leave an empty _SUCCESS marker and hidden .crc checksums beside the part files;
    as in Hadoop's input formats they are not data, so the directory reads as its parts alone."""
    folder = tmp_path / "export"
    folder.mkdir()
    rows = _rows(40)
    write_csv(folder / "part-00000.csv", HEADER, rows[:25])
    write_csv(folder / "part-00001.csv", HEADER, rows[25:])
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / ".part-00000.csv.crc").write_bytes(b"crc\x00\x9f")
    props, _ = _run(tmp_path, {"input_path": str(folder)})
    assert props["input_files"] == 2 and sum(props["split_counts"].values()) == 40
    # Spark names that directory after its format (df.write.csv("data.csv")): a glob of CSV files matched it,
    # and ExampleGen died with a bare IsADirectoryError.
    folder.rename(tmp_path / "data.csv")
    write_csv(tmp_path / "more.csv", HEADER, rows)
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": str(tmp_path / "*.csv")}, "globbed")
    assert str(err.value) == f"{tmp_path}/data.csv: a directory, matched by {tmp_path}/*.csv"
    assert err.value.hint.startswith("give the directory itself as the input path to read its files")


def test_files_whose_headers_differ_are_named_with_the_difference(tmp_path):
    """The error named the two files and nothing else; in a folder of a hundred parts, or one that also holds
    a stray notes file, the user had to diff the headers by hand."""
    folder = tmp_path / "export"
    folder.mkdir()
    write_csv(folder / "part-0.csv", HEADER, _rows(10))
    write_csv(folder / "part-1.csv", HEADER.replace("year", "yr"), _rows(10))
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": str(folder)})
    assert str(err.value) == (f"{folder}/part-1.csv: header differs from {folder}/part-0.csv: column 4 is 'yr', "
                              "not 'year'")
    assert err.value.hint == "every input file must hold the same columns in the same order; a glob such as " \
                             f"{folder}/*.csv picks the parts alone"
    (folder / "part-1.csv").unlink()
    (folder / "readme.txt").write_text("to do:\nmore penguins\n")
    with pytest.raises(InputDataError, match=r"readme.txt: header differs from .*part-0.csv: it has 1 column\(s\), "
                                             r"not 4 \(species, island, bill_length_mm, year\)$"):
        _run(tmp_path, {"input_path": str(folder)})


def test_gzip_csv_parts_read_like_plain_ones_and_unreadable_files_are_named(tmp_path):
    plain = write_csv(tmp_path / "plain.csv", HEADER, _rows(40))
    packed = tmp_path / "packed.csv.gz"
    packed.write_bytes(gzip.compress(open(plain, "rb").read()))
    _, want = _run(tmp_path, {"input_path": plain}, "plain")
    _, got = _run(tmp_path, {"input_path": str(packed)}, "packed")
    assert [e.SerializeToString() for e in _read(got["examples"] + "/Split-*/*.gz")] == \
        [e.SerializeToString() for e in _read(want["examples"] + "/Split-*/*.gz")]

    truncated = tmp_path / "truncated.csv.gz"
    truncated.write_bytes(gzip.compress(open(plain, "rb").read() * 50)[:-200])
    with pytest.raises(InputDataError, match=r"truncated.csv.gz: corrupted GZIP data after line \d+ "):
        _run(tmp_path, {"input_path": str(truncated)}, "truncated")
    # Excel's "Unicode text" is UTF-16: this used to end in a bare UnicodeDecodeError traceback.
    utf16 = tmp_path / "utf16.csv"
    utf16.write_bytes(open(plain, encoding="utf-8").read().encode("utf-16"))
    with pytest.raises(InputDataError, match=r"utf16.csv:1: the header is not UTF-8 text \(byte 0xff\)$") as err:
        _run(tmp_path, {"input_path": str(utf16)}, "utf16")
    assert err.value.hint == "set encoding to the file's own (often latin-1 or cp1252, from older spreadsheets), " \
                             "or save the file as UTF-8 CSV"


@pytest.mark.parametrize("name, compression", [("part.tfrecord.gz", "GZIP"), ("examples", "")])
def test_tfrecords_read_as_csv_are_named_as_tfrecords(tmp_path, name, compression):
    """A TFRecord file read as CSV failed on its header: as a column named by binary bytes, or as "not UTF-8
    text" with a hint to save the file as UTF-8 CSV. The file's framing tells it apart, whatever its name."""
    path = tmp_path / name
    with tf.io.TFRecordWriter(str(path), options=compression) as writer:
        for i in range(3):
            example = tf.train.Example()
            example.features.feature["year"].int64_list.value.append(2007 + i)
            writer.write(example.SerializeToString())
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": str(path)})
    assert str(err.value) == f"{path}: a TFRecord file, not CSV"
    assert err.value.hint == "ExampleGen reads TFRecord files with input_format='tfrecord'"
    props, _ = _run(tmp_path, {"input_path": str(path), "input_format": "tfrecord", "splits": {"all": 1}}, "read")
    assert props["split_counts"] == {"all": 3}


def test_a_row_that_is_not_utf8_is_a_bad_row_named_by_line_and_column(tmp_path):
    """One Latin-1 cell in a UTF-8 export failed the whole file with no line named: the decoder reads ahead
    in 8 KB blocks, so the csv reader's line count was wherever the block began."""
    rows = _rows(400)
    rows[250] = "Adelie,Dr\xe9am,31.0,2007"
    path = tmp_path / "latin.csv"
    path.write_bytes(("\n".join([HEADER] + rows) + "\n").encode("latin-1"))
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": str(path)}, "strict")
    assert str(err.value) == f"{path}:252: column 'island' is not UTF-8 text (byte 0xe9 after 'Dr')"
    assert err.value.hint == "set encoding if the whole file is in another one (often latin-1 or cp1252), or save " \
                             "it as UTF-8 CSV, or set skip_bad_rows=true"
    props, out = _run(tmp_path, {"input_path": str(path), "skip_bad_rows": True}, "skipping")
    assert props["bad_rows"] == 1 and sum(props["split_counts"].values()) == 399
    islands = {e.features.feature["island"].bytes_list.value[0] for e in _read(out["examples"] + "/Split-*/*.gz")}
    assert islands == {b"Biscoe", b"Dream", b"Torgersen"}


def test_a_file_in_another_encoding_is_read_with_the_encoding_parameter(tmp_path):
    """Latin-1 and Windows-1252 exports failed at their first accented row, or, under skip_bad_rows, lost every
    such row; with `encoding` they are read as written, and the examples hold UTF-8 as TFX's do."""
    rows = _rows(60)
    rows[7], rows[20] = "Adelie,Dr\xe9am,31.0,2007", "Gentoo,Biscoe \u2013 north,40.5,2008"
    text = "\n".join([HEADER] + rows) + "\n"
    for encoding in ("latin-1", "cp1252"):
        path = tmp_path / f"{encoding}.csv"
        path.write_bytes(text.replace("\u2013", "-" if encoding == "latin-1" else "\u2013").encode(encoding))
        with pytest.raises(InputDataError, match=r":9: column 'island' is not UTF-8 text \(byte 0xe9 after 'Dr'\)$"):
            _run(tmp_path, {"input_path": str(path)}, f"{encoding}-as-utf8")
        props, out = _run(tmp_path, {"input_path": str(path), "encoding": encoding}, encoding)
        assert props["bad_rows"] == 0 and sum(props["split_counts"].values()) == 60
        examples = _read(out["examples"] + "/Split-*/*.gz")
        islands = {e.features.feature["island"].bytes_list.value[0].decode("utf-8") for e in examples}
        dash = "-" if encoding == "latin-1" else "\u2013"
        assert islands == {"Biscoe", "Dream", "Torgersen", "Dr\xe9am", f"Biscoe {dash} north"}
    # 0x81 means nothing in Windows-1252: the row holding it is a bad row, named by line and column.
    path = tmp_path / "bad-cp1252.csv"
    path.write_bytes(text.replace("\u2013", "-").encode("cp1252").replace(b"Dr\xe9am", b"Dr\x81am"))
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": str(path), "encoding": "cp1252"}, "bad-cp1252")
    assert str(err.value) == f"{path}:9: column 'island' is not cp1252 text (byte 0x81 after 'Dr')"
    assert err.value.hint == "check that the whole file is cp1252 text, or set skip_bad_rows=true"


@pytest.mark.parametrize("encoding, message", [("latin-9000", "unknown text encoding 'latin-9000'"),
                                               ("base64", "'base64' is not a text encoding")])
def test_an_unknown_encoding_is_refused_before_reading(tmp_path, encoding, message):
    csv = write_csv(tmp_path / "data.csv", HEADER, _rows(10))
    with pytest.raises(SpecError, match=f"'encoding'.*{message}"):
        _run(tmp_path, {"input_path": csv, "encoding": encoding}, "refused")


def test_nan_in_a_numeric_column_is_missing_and_infinity_is_a_bad_row(tmp_path):
    """pandas and numpy write a missing number as NaN. Kept as a value it made the column's mean NaN, and
    every z-score with it: the penguin model fell from 0.94 to 0.44 eval accuracy over one NaN cell."""
    rows = _rows(30)
    rows[3] = "Adelie,Dream,NaN,2007"
    rows[4] = "Adelie,Dream,nan,2007"
    csv = write_csv(tmp_path / "nan.csv", HEADER, rows)
    props, out = _run(tmp_path, {"input_path": csv, "numeric_columns": ["bill_length_mm"]}, "nan")
    assert props["bad_rows"] == 0
    examples = _read(out["examples"] + "/Split-*/*.gz")
    assert len(examples) == 30 and sum("bill_length_mm" not in e.features.feature for e in examples) == 2
    values = [v for e in examples for v in e.features.feature["bill_length_mm"].float_list.value]
    assert all(v == v for v in values), "no NaN may reach the examples"
    rows[4] = "Adelie,Dream,-inf,2007"
    inf = write_csv(tmp_path / "inf.csv", HEADER, rows)
    with pytest.raises(InputDataError, match=r"inf.csv:6: column 'bill_length_mm' must hold a finite number, "
                                             r"got '-inf'$"):
        _run(tmp_path, {"input_path": inf, "numeric_columns": ["bill_length_mm"]}, "inf")


def test_infinity_is_a_bad_row_in_any_column_read_as_numbers(tmp_path):
    """Not declared numeric, 'bill_length_mm' is read as numbers all the same; an infinity there used to
    reach the examples, and its column's mean and z-scores with it."""
    rows = _rows(30)
    rows[7] = "Adelie,Dream,inf,2007"
    csv = write_csv(tmp_path / "inf_undeclared.csv", HEADER, rows)
    with pytest.raises(InputDataError, match=r"inf_undeclared.csv:9: column 'bill_length_mm' must hold a finite "
                                             r"number, got 'inf'$") as err:
        _run(tmp_path, {"input_path": csv}, "inf_refused")
    assert err.value.hint == "fix the row, or set skip_bad_rows=true"
    props, out = _run(tmp_path, {"input_path": csv, "skip_bad_rows": True}, "inf_skipped")
    assert props["bad_rows"] == 1
    examples = _read(out["examples"] + "/Split-*/*.gz")
    values = [v for e in examples for v in e.features.feature["bill_length_mm"].float_list.value]
    assert len(examples) == 29 and len(values) == 29 and all(math.isfinite(v) for v in values)


def test_a_skipped_infinity_leaves_its_column_kind_alone(tmp_path):
    """A skipped row must not shape the data that is kept: an 'inf' in the integer column 'year' used to turn
    every year into a float, and a schema_path saying INT then refused data whose every kept value is an int."""
    rows = _rows(30)
    rows[4] = "Adelie,Dream,31.0,inf"
    csv = write_csv(tmp_path / "inf_year.csv", HEADER, rows)
    with pytest.raises(InputDataError, match=r"inf_year.csv:6: column 'year' must hold a finite number, got 'inf'$"):
        _run(tmp_path, {"input_path": csv}, "inf_refused")
    props, out = _run(tmp_path, {"input_path": csv, "skip_bad_rows": True}, "inf_skipped")
    assert props["bad_rows"] == 1
    examples = _read(out["examples"] + "/Split-*/*.gz")
    assert sorted({v for e in examples for v in e.features.feature["year"].int64_list.value}) == [2007, 2008, 2009]
    assert len(examples) == 29
    schema = {f.name: f for f in read_schema(os.path.join(out["schema"], "schema.pbtxt")).feature}
    assert schema["year"].type == schema_pb2.INT


@pytest.mark.parametrize("numeric_columns", [[], ["bill_length_mm"]], ids=["inferred", "declared"])
def test_a_number_beyond_float32_is_a_bad_row_like_an_infinity(tmp_path, numeric_columns):
    """A tf.Example holds 32-bit floats: '1e39' passed the infinity check as a 64-bit float and was stored as
    inf, which turns the column's mean and every z-score into NaN."""
    rows = _rows(30)
    rows[5] = "Adelie,Dream,-1e39,2007"
    csv = write_csv(tmp_path / "big.csv", HEADER, rows)
    params = {"input_path": csv, "numeric_columns": numeric_columns}
    with pytest.raises(InputDataError, match=r"big.csv:7: column 'bill_length_mm' holds '-1e39', beyond the "
                                             r"±3.4e38 range of the 32-bit floats a tf.Example stores$"):
        _run(tmp_path, params, "refused")
    props, out = _run(tmp_path, {**params, "skip_bad_rows": True}, "skipped")
    assert props["bad_rows"] == 1
    values = [v for e in _read(out["examples"] + "/Split-*/*.gz") for v in e.features.feature["bill_length_mm"]
              .float_list.value]
    assert len(values) == 29 and all(math.isfinite(v) for v in values)


def test_an_integer_beyond_64_bits_makes_its_column_text_as_tfx_reads_it(tmp_path):
    """Long integers are identifiers more often than quantities; TFX's CSV decoder reads them as text. This
    one used to stop ExampleGen with a bare 'Value out of range', naming neither file nor row."""
    rows = _rows(30)
    rows[5] = "Adelie,Dream,31.5,99999999999999999999"
    csv = write_csv(tmp_path / "wide.csv", HEADER, rows)
    _, out = _run(tmp_path, {"input_path": csv}, "wide")
    years = sorted(v.decode() for e in _read(out["examples"] + "/Split-*/*.gz")
                   for v in e.features.feature["year"].bytes_list.value)
    assert len(years) == 30 and years[0] == "2007" and years[-1] == "99999999999999999999"
    schema = {f.name: f for f in read_schema(os.path.join(out["schema"], "schema.pbtxt")).feature}
    assert schema["year"].type == schema_pb2.BYTES
    with pytest.raises(InputDataError, match=r"wide.csv:7: column 'year' must hold a number, got "
                                             r"'99999999999999999999' \(an integer beyond 64 bits\)$"):
        _run(tmp_path, {"input_path": csv, "numeric_columns": ["year"]}, "declared")


@pytest.mark.parametrize("header, message, hint", [
    # pandas' to_csv() writes the index as a first column without a name.
    (",species,island,bill_length_mm,year", "column 1 has no name", "to_csv(index=False)"),
    ("species,island,bill_length_mm,year,", "column 5 has no name", "a comma at the end of the header row"),
    # Two unnamed columns used to be reported as "duplicate column name(s) " naming nothing.
    (",species,island,,year", "columns 1 and 4 have no name", "to_csv(index=False)"),
    ("species,island,species,year", "duplicate column name(s) species", None),
])
def test_a_header_with_unnamed_or_repeated_columns_is_refused(tmp_path, header, message, hint):
    rows = [f"{i},Adelie,Dream,{30 + i},2007" if header.startswith(",") else f"Adelie,Dream,{30 + i},2007,"
            for i in range(30)]
    csv = write_csv(tmp_path / "header.csv", header, rows)
    with pytest.raises(InputDataError) as err:
        _run(tmp_path, {"input_path": csv})
    assert str(err.value) == f"{csv}:1: {message}"
    assert (err.value.hint is None) if hint is None else (hint in err.value.hint)


def test_nan_is_missing_in_any_column_read_as_numbers(tmp_path):
    """Declared numeric or not: 'year' is not in numeric_columns here, and its NaN cells used to become NaN
    values, which turn tf.Transform's mean of the column into NaN."""
    rows = _rows(30)
    rows[5], rows[6] = "Adelie,Dream,31.0,NaN", "Adelie,Dream,31.0,nan"
    csv = write_csv(tmp_path / "nan_year.csv", HEADER, rows)
    _, out = _run(tmp_path, {"input_path": csv}, "nan_year")
    examples = _read(out["examples"] + "/Split-*/*.gz")
    assert len(examples) == 30 and sum("year" not in e.features.feature for e in examples) == 2
    years = [v for e in examples for v in e.features.feature["year"].int64_list.value]
    assert len(years) == 28, "a missing value leaves the column's kind alone: the years stay integers"
    schema = {f.name: f for f in read_schema(os.path.join(out["schema"], "schema.pbtxt")).feature}
    assert not schema["year"].HasField("shape"), "two rows lack a year, so it is a VarLen feature"


def test_only_plain_ascii_numbers_make_a_numeric_column(tmp_path):
    """Python's int() and float() also read '2023_01' as 202301 and Arabic-Indic digits as numbers: a column of
    period codes became integers that no longer said which month they were."""
    header = "period,code,amount"
    rows = [f"2023_{i % 12 + 1:02d},{'١٢' if i % 2 else '34'},{i}.5" for i in range(30)]
    csv = write_csv(tmp_path / "codes.csv", header, rows)
    _, out = _run(tmp_path, {"input_path": csv}, "codes")
    feats = _read(out["examples"] + "/Split-*/*.gz")[0].features.feature
    assert feats["period"].bytes_list.value[0].decode().startswith("2023_")
    assert feats["code"].bytes_list.value and feats["amount"].float_list.value
    with pytest.raises(InputDataError, match=r"codes.csv:2: column 'period' must hold a number, got '2023_01'$"):
        _run(tmp_path, {"input_path": csv, "numeric_columns": ["period"]}, "strict")


@pytest.mark.parametrize("packed", [False, True])
def test_a_long_run_logs_its_progress_through_the_file(tmp_path, monkeypatch, caplog, packed):
    """A large CSV ran for minutes with no line in the task log. With lines due at every look at the clock (once a
    chunk of rows), each pass names the file, the rows done and, while writing, how far through the file it is (its
    compressed bytes, when GZIP)."""
    from hpml.components import progress_log
    from hpml.components.example_gen import csv_chunks, progress

    monkeypatch.setattr(progress_log, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(csv_chunks, "CHUNK_BYTES", 16 << 10)
    path = write_csv(tmp_path / "penguins.csv", HEADER, _rows(5000))
    if packed:
        path = str(tmp_path / "penguins.csv.gz")
        with open(tmp_path / "penguins.csv", "rb") as plain, gzip.open(path, "wb") as handle:
            handle.write(plain.read())
    with caplog.at_level("INFO", logger=progress.NAMESPACE):
        _run(tmp_path, {"input_path": path})
    messages = [r.getMessage() for r in caplog.records]
    pattern = r"ExampleGen: {}: ([\d,]+) rows(?: \((\d+)%\))? in \d+ s, [\d,]+ rows/s"
    kinds = [re.fullmatch(pattern.format(re.escape(path + ": column kinds")), m) for m in messages]
    counts = [int(m.group(1).replace(",", "")) for m in kinds if m]
    assert len(counts) >= 4 and counts == sorted(counts) and counts[-1] == 5000, messages
    written = [re.fullmatch(pattern.format(re.escape(path + ": written")), m) for m in messages]
    written = [(int(m.group(1).replace(",", "")), int(m.group(2))) for m in written if m]
    assert [rows for rows, _ in written] == counts, messages
    shares = [share for _, share in written]
    # GZIP reads its compressed bytes ahead in blocks, so its share moves in steps; plain text moves with the rows.
    assert shares == sorted(shares) and shares[0] < (100 if packed else 30) and shares[-1] == 100, shares
