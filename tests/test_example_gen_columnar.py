"""ExampleGen's columnar CSV path against the per-row rules it replaces: same records, bytes, splits and schema, on
CSVs made to be awkward, read as many pieces and chunks; the native tf.Example encoder against protobuf."""
import csv
import glob
import gzip
import io
import math
import os
import random

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

from hpml.components.example_gen import EXAMPLE_GEN, csv_chunks, example_encoder
from hpml.components.example_gen.csv_rows import BYTES, INT, NONE, column_kind_of
from hpml.components.schema_file import read_schema

HEADER = ["id", "amount", "count", "note", "code", "empty", "big"]


def _tricky_rows(n: int, seed: int = 3) -> list[list[str]]:
    """Rows whose cells exercise quoting, white space, spellings of numbers, missing values and long integers."""
    rng = random.Random(seed)
    notes = ['plain', 'with, comma', 'say "hi"', 'two\nlines', 'three\r\nlines\r\nhere', '  padded  ', 'Dr\u00e9am',
             '\u4e2d\u6587', '', 'NA', '"', 'tab\tinside', 'x' * 300]
    amounts = ["1.5", "+2.5", ".5", "5.", "1e3", "-1E-3", "nan", "NaN", "", "NA", "7", " 8.25 ", "3.4e38", "-0.0"]
    counts = ["1", "+2", "-3", "007", "-0", "", "9007199254740993", "NA", "nan", "42", " 5 "]
    codes = ["2023_01", "12", "abc", "\u0661\u0662", "1e5", ""]
    rows = []
    for i in range(n):
        rows.append([str(i), rng.choice(amounts), rng.choice(counts), rng.choice(notes), rng.choice(codes), "",
                     rng.choice(["99999999999999999999", "1", "-9223372036854775808", "9223372036854775807"])])
    return rows


def _write(path, header, rows, line_end="\n"):
    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator=line_end)
    writer.writerow(header)
    writer.writerows(rows)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write(text.getvalue())
    return str(path)


def _reference(paths, na=("", "NA")) -> list[bytes]:
    """The examples the per-row rules make of the files: kinds from `column_kind_of`, values as ExampleGen's
    row-at-a-time conversion stored them, serialized deterministically."""
    rows = []
    for path in paths:
        with open(path, encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle)
            header = [name.strip() for name in next(reader)]
            rows += [[None if c.strip() in na else c.strip() for c in row] for row in reader if row]
    kinds = [max([column_kind_of(row[i]) for row in rows if row[i] is not None], default=NONE)
             for i in range(len(header))]
    out = []
    for row in rows:
        example = tf.train.Example()
        for name, kind, text in zip(header, kinds, row):
            if text is None:
                continue
            if kind == BYTES:
                example.features.feature[name].bytes_list.value.append(text.encode())
                continue
            if kind == INT:
                try:
                    integer = int(text)
                except ValueError:  # NaN, in a column of integers
                    integer = None
                if integer is not None:  # looked up only now: the lookup alone adds the feature
                    example.features.feature[name].int64_list.value.append(integer)
                    continue
            number = float(text)
            if not math.isnan(number):
                example.features.feature[name].float_list.value.append(number)
        out.append(example.SerializeToString(deterministic=True))
    return out


def _records(examples_dir, split="*"):
    return [r.numpy() for f in sorted(glob.glob(os.path.join(examples_dir, f"Split-{split}", "*.gz")))
            for r in tf.data.TFRecordDataset(f, compression_type="GZIP")]


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
def test_many_pieces_and_chunks_write_the_records_the_row_rules_make(tmp_path, monkeypatch, line_end):
    monkeypatch.setattr(csv_chunks, "PIECE_BYTES", 24 << 10)
    monkeypatch.setattr(csv_chunks, "CHUNK_BYTES", 5 << 10)
    rows = _tricky_rows(3000)
    first = _write(tmp_path / "a.csv", HEADER, rows[:2000], line_end)
    second = _write(tmp_path / "b.csv", HEADER, rows[2000:], line_end)
    assert len(csv_chunks.plan_pieces(first, "utf-8")) >= 3, "the first file must be read as several pieces"
    out = {"examples": str(tmp_path / "out" / "examples"), "schema": str(tmp_path / "out" / "schema")}
    props = EXAMPLE_GEN.run({}, out, {"input_path": str(tmp_path / "*.csv")})
    want = _reference([first, second])
    got = _records(out["examples"])
    assert sorted(got) == sorted(want), "the same records, byte for byte"
    assert props["split_counts"]["train"] + props["split_counts"]["eval"] == 3000
    # Each record's split is Fingerprint64(record) mod 3 < 2 for train, whatever piece wrote it.
    train = set(_records(out["examples"], "train"))
    buckets = tf.strings.to_hash_bucket_fast(np.array(want, dtype=object), 3).numpy()
    assert train == {record for record, bucket in zip(want, buckets) if bucket < 2}
    kinds = {f.name: f.type for f in read_schema(os.path.join(out["schema"], "schema.pbtxt")).feature}
    assert (kinds["amount"], kinds["count"], kinds["note"], kinds["code"], kinds["big"]) == (3, 2, 1, 1, 1)
    assert props["empty_columns"] == ["empty"]
    shards = sorted(os.listdir(os.path.join(out["examples"], "Split-train")))
    assert len(shards) >= 3 and all(name.endswith(f"-of-{len(shards):05d}.gz") for name in shards), shards


def test_bad_rows_across_chunks_are_skipped_named_and_counted_once(tmp_path, monkeypatch, caplog):
    """Pass 1 reads a chunk with a bad row again row by row without counting; pass 2 counts and names it."""
    monkeypatch.setattr(csv_chunks, "CHUNK_BYTES", 2 << 10)
    rows = [[str(i), f"{i}.5", str(i % 7), "n", "c", "", "1"] for i in range(2000)]
    bad_lines = {}
    for index, cells in ((50, [str(50), "inf", "1", "n", "c", "", "1"]), (700, ["700", "1.5"]),
                         (1500, ["1500", "abc", "1", "n", "c", "", "1"])):
        rows[index] = cells
        bad_lines[index + 2] = cells
    path = _write(tmp_path / "bad.csv", HEADER, rows)
    out = {"examples": str(tmp_path / "o" / "examples"), "schema": str(tmp_path / "o" / "schema")}
    params = {"input_path": path, "skip_bad_rows": True, "numeric_columns": ["amount"]}
    with caplog.at_level("WARNING", logger="hpml.example_gen"):
        props = EXAMPLE_GEN.run({}, out, params)
    assert props["bad_rows"] == 3 and sum(props["split_counts"].values()) == 1997
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped bad row")]
    assert skipped == [f"skipped bad row {path}:52: column 'amount' must hold a finite number, got 'inf'",
                       f"skipped bad row {path}:702: expected 7 fields, got 2",
                       f"skipped bad row {path}:1502: column 'amount' must hold a number, got 'abc'"]
    good = [r for i, r in enumerate(rows) if i + 2 not in bad_lines]
    assert sorted(_records(out["examples"])) == sorted(_reference([_write(tmp_path / "good.csv", HEADER, good)]))


def test_an_infinity_found_only_when_converting_names_its_line_in_a_later_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(csv_chunks, "CHUNK_BYTES", 1 << 10)
    rows = [[str(i), f"{i}.5", "1", "n", "c", "", "1"] for i in range(800)]
    rows[640][1] = "-Infinity"
    path = _write(tmp_path / "inf.csv", HEADER, rows)
    out = {"examples": str(tmp_path / "o" / "examples"), "schema": str(tmp_path / "o" / "schema")}
    from hpml.components.errors import InputDataError

    with pytest.raises(InputDataError) as err:
        EXAMPLE_GEN.run({}, out, {"input_path": path})
    assert str(err.value) == f"{path}:642: column 'amount' must hold a finite number, got '-Infinity'"


def test_pieces_start_and_end_at_record_boundaries_outside_quotes(tmp_path):
    rows = _tricky_rows(4000, seed=9)
    path = _write(tmp_path / "q.csv", HEADER, rows)
    pieces = csv_chunks.plan_pieces(path, "utf-8", piece_bytes=8 << 10)
    assert len(pieces) > 10
    data = open(path, "rb").read()
    assert pieces[0].start == 0 and pieces[-1].end is None
    assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
    parsed = []
    for piece in pieces:
        text = data[piece.start:piece.end].decode("utf-8")
        parsed += list(csv.reader(io.StringIO(text, newline="")))
    assert parsed == [HEADER, *rows], "every piece holds whole records"
    # GZIP is one piece, read from the start.
    packed = tmp_path / "q.csv.gz"
    packed.write_bytes(gzip.compress(data))
    assert csv_chunks.plan_pieces(str(packed), "utf-8", piece_bytes=8 << 10) == [csv_chunks.Piece(str(packed))]


def test_num_shards_writes_that_many_shards_per_split(tmp_path):
    rows = [[str(i), f"{i}.5", "1", "n", "c", "", "1"] for i in range(300)]
    path = _write(tmp_path / "s.csv", HEADER, rows)
    out = {"examples": str(tmp_path / "o" / "examples"), "schema": str(tmp_path / "o" / "schema")}
    EXAMPLE_GEN.run({}, out, {"input_path": path, "num_shards": 3})
    for split in ("train", "eval"):
        assert sorted(os.listdir(os.path.join(out["examples"], f"Split-{split}"))) == \
            [f"data_tfrecord-0000{i}-of-00003.gz" for i in range(3)]
    assert len(_records(out["examples"])) == 300


@pytest.mark.parametrize("rows", [300, 9000], ids=["direct", "dictionary"])
def test_the_encoder_writes_protobufs_deterministic_bytes(rows):
    rng = np.random.default_rng(5)
    ints = rng.integers(-2 ** 63, 2 ** 63 - 1, rows, dtype=np.int64)
    ints[: rows // 2] = rng.integers(-200, 200, rows // 2)
    floats = (rng.normal(size=rows) * 10.0 ** rng.integers(-30, 30, rows)).astype(np.float32)
    words = np.array([("w" * int(k) + "\u00e9").encode() for k in rng.integers(0, 200, 40)], dtype=object)
    columns = {"year": pa.array(ints, mask=rng.random(rows) < 0.2),
               "bill": pa.array(floats, mask=rng.random(rows) < 0.3),
               "k" * 150: pa.array(words[rng.integers(0, 40, rows)], pa.binary(), mask=rng.random(rows) < 0.5),
               "none": pa.array(np.zeros(rows, dtype=np.int64), mask=np.ones(rows, dtype=bool)),
               # protobuf orders a key before its own prefix ('f10' before 'f1'): not plain byte order
               **{name: pa.array(rng.integers(0, 5, rows)) for name in ("f1", "f10", "f2", "ye", "y")}}
    got = example_encoder.encode(columns, rows).to_pylist()
    for i in range(rows):
        example = tf.train.Example()
        for name, values in columns.items():
            value = values[i].as_py()
            if value is None:
                continue
            feature = example.features.feature[name]
            (feature.bytes_list if isinstance(value, bytes) else
             feature.int64_list if isinstance(value, int) else feature.float_list).value.append(value)
        assert got[i] == example.SerializeToString(deterministic=True), i


def test_tfrecord_input_in_many_batches_keeps_each_records_split_and_names_bad_records(tmp_path, monkeypatch):
    """Read back as TFRecord input, ExampleGen's own examples land in the same split each (one hash for CSV and
    TFRecord); a bad record in a later batch is named by its index in the file."""
    from hpml.components.errors import InputDataError
    from hpml.components.example_gen import tfrecord_source

    monkeypatch.setattr(tfrecord_source, "BATCH_RECORDS", 64)
    rows = [[str(i), f"{i}.5", str(i % 7), f"n{i % 5}", "c", "", "1"] for i in range(1000)]
    path = _write(tmp_path / "t.csv", HEADER, rows)
    first = {"examples": str(tmp_path / "a" / "examples"), "schema": str(tmp_path / "a" / "schema")}
    EXAMPLE_GEN.run({}, first, {"input_path": path})
    again = {"examples": str(tmp_path / "b" / "examples"), "schema": str(tmp_path / "b" / "schema")}
    props = EXAMPLE_GEN.run({}, again, {"input_path": first["examples"] + "/Split-*/*.gz", "input_format": "tfrecord"})
    assert sum(props["split_counts"].values()) == 1000
    for split in ("train", "eval"):
        assert sorted(_records(again["examples"], split)) == sorted(_records(first["examples"], split))
    # The same schema, but for the CSV's all-empty column, which only a CSV header can name.
    want = read_schema(os.path.join(first["schema"], "schema.pbtxt"))
    del want.feature[[f.name for f in want.feature].index("empty")]
    assert read_schema(os.path.join(again["schema"], "schema.pbtxt")) == want

    records = sorted(_records(first["examples"]))
    bad = tf.train.Example.FromString(records[300])
    bad.features.feature["amount"].float_list.value[0] = float("inf")
    records[300] = bad.SerializeToString()
    records[700] = b"not an example"
    source = str(tmp_path / "bad.tfrecord")
    with tf.io.TFRecordWriter(source) as writer:
        for record in records:
            writer.write(record)
    params = {"input_path": source, "input_format": "tfrecord"}
    with pytest.raises(InputDataError) as err:
        EXAMPLE_GEN.run({}, {"examples": str(tmp_path / "c" / "e"), "schema": str(tmp_path / "c" / "s")}, params)
    assert str(err.value) == (f"{source}: record 301: feature 'amount' must hold finite numbers, got [inf] "
                              "(leave the feature out where its value is missing)")
    props = EXAMPLE_GEN.run({}, {"examples": str(tmp_path / "d" / "e"), "schema": str(tmp_path / "d" / "s")},
                            dict(params, skip_bad_rows=True))
    assert props["bad_rows"] == 2 and sum(props["split_counts"].values()) == 998
    # Corruption in a later batch is placed after the last whole record, not at the batch's start.
    data = open(source, "rb").read()
    cut = tmp_path / "cut.tfrecord"
    offset = sum(len(r) + 16 for r in records[:500])
    cut.write_bytes(data[:offset + 20] + b"\xff" * 40 + data[offset + 60:])
    with pytest.raises(InputDataError, match=r"cut.tfrecord: corrupted TFRecord after record 500 "):
        EXAMPLE_GEN.run({}, {"examples": str(tmp_path / "e" / "e"), "schema": str(tmp_path / "e" / "s")},
                        {"input_path": str(cut), "input_format": "tfrecord", "skip_bad_rows": True})


@pytest.mark.parametrize("encoding", ["utf-16", "latin-1"])
def test_a_csv_in_another_encoding_over_many_chunks_writes_what_its_utf8_copy_writes(tmp_path, monkeypatch, encoding):
    """UTF-16 cannot be cut at byte offsets: it is read as text, row by row; Latin-1 takes the columnar path."""
    monkeypatch.setattr(csv_chunks, "CHUNK_BYTES", 2 << 10)
    rows = [[str(i), f"{i}.25", str(i % 9), ["Dr\u00e9am", "caf\u00e9, noir", 'a "b"', "x\ny"][i % 4], "c", "", "1"]
            for i in range(600)]
    utf8 = _write(tmp_path / "utf8.csv", HEADER, rows)
    other = tmp_path / f"{encoding}.csv"
    other.write_bytes(open(utf8, encoding="utf-8", newline="").read().encode(encoding))
    outputs = {}
    for name, path, params in (("utf8", utf8, {}), ("other", str(other), {"encoding": encoding})):
        outputs[name] = {"examples": str(tmp_path / name / "e"), "schema": str(tmp_path / name / "s")}
        props = EXAMPLE_GEN.run({}, outputs[name], {"input_path": path, **params})
        assert sum(props["split_counts"].values()) == 600
    assert sorted(_records(outputs["other"]["examples"])) == sorted(_records(outputs["utf8"]["examples"]))


def test_a_tfrecord_feature_present_without_a_kind_is_missing_not_a_crash(tmp_path):
    """A feature every record carries as an empty Feature decodes as Arrow's null type; required, it is a bad
    record, named; otherwise it is simply missing, as the per-record rules say."""
    from hpml.components.errors import InputDataError

    path = str(tmp_path / "empty_kind.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(30):
            example = tf.train.Example()
            example.features.feature["x"].float_list.value.append(i + 0.5)
            example.features.feature["label"]  # present, with no kind
            example.features.feature["tag"]
            writer.write(example.SerializeToString())
    out = {"examples": str(tmp_path / "o" / "e"), "schema": str(tmp_path / "o" / "s")}
    props = EXAMPLE_GEN.run({}, out, {"input_path": path, "input_format": "tfrecord", "numeric_columns": ["tag"]})
    assert sum(props["split_counts"].values()) == 30
    assert [f.name for f in read_schema(os.path.join(out["schema"], "schema.pbtxt")).feature] == ["x"]
    with pytest.raises(InputDataError, match=r"empty_kind.tfrecord: record 1: required feature 'label' has no value$"):
        EXAMPLE_GEN.run({}, {"examples": str(tmp_path / "r" / "e"), "schema": str(tmp_path / "r" / "s")},
                        {"input_path": path, "input_format": "tfrecord", "required_columns": ["label"]})
