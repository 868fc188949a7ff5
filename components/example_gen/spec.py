"""ExampleGen's spec: raw files in, Examples and Schema out."""
from __future__ import annotations

from hpml.components import artifacts
from hpml.components.example_gen.text_encoding import DEFAULT_ENCODING, check_encoding
from hpml.components.spec import ComponentSpec, Parameter, names, non_empty


def _check_splits(splits: dict) -> str | None:
    if not splits:
        return "needs at least one split"
    for name, buckets in splits.items():
        if not isinstance(name, str) or not artifacts.SPLIT_NAME_RE.match(name):
            return f"split name {name!r} must match ^[A-Za-z0-9][A-Za-z0-9_-]*$"
        if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 1:
            return f"split {name!r} needs a positive whole number of hash buckets, got {buckets!r}"
    return None


def _check_renames(renames: dict) -> str | None:
    for column, feature in renames.items():
        if not isinstance(column, str) or not isinstance(feature, str) or not column.strip() or not feature.strip():
            return f"maps CSV column names to feature names (non-empty strings), got {column!r}: {feature!r}"
    repeated = sorted({f for f in renames.values() if list(renames.values()).count(f) > 1})
    return f"gives feature name(s) {', '.join(map(repr, repeated))} to more than one column" if repeated else None


EXAMPLE_GEN = ComponentSpec(
    name="ExampleGen",
    inputs={},
    outputs={"examples": artifacts.EXAMPLES, "schema": artifacts.SCHEMA},
    parameters={
        "input_path": Parameter(str, check=non_empty, help="a CSV/TFRecord file, a directory of them, or a glob"),
        "input_format": Parameter(str, "csv", choices=("csv", "tfrecord")),
        "splits": Parameter(dict, {"train": 2, "eval": 1}, check=_check_splits,
                            help="split name -> hash buckets; the default is train:eval 2:1"),
        "partition_feature": Parameter((str, type(None)), None,
                                       help="hash this feature instead of the whole example"),
        "skip_bad_rows": Parameter(bool, False, help="skip and count malformed rows instead of failing"),
        "na_values": Parameter(list, ["", "NA"], help="CSV cell values that mean missing"),
        "encoding": Parameter(str, DEFAULT_ENCODING, check=check_encoding,
                              help="the CSV files' text encoding, e.g. latin-1 or cp1252; UTF-8 may start with a "
                                   "byte-order mark"),
        "required_columns": Parameter(list, [], check=names("column"),
                                      help="columns that every row must hold a value in, e.g. the label: a row "
                                           "without one is a bad row"),
        "numeric_columns": Parameter(list, [], check=names("column"),
                                     help="columns (or features) that must hold numbers: a value that is not one is "
                                          "a bad row, not a reason to read it as text"),
        "rename_columns": Parameter(dict, {}, check=_check_renames,
                                    help="CSV column name -> feature name, for columns whose names cannot name a "
                                         "feature (spaces, say); other parameters use the feature names"),
        "schema_path": Parameter((str, type(None)), None, help="a schema.pbtxt the data must match"),
        "num_shards": Parameter(int, 0, check=lambda n: None if n >= 0 else "must be >= 0",
                                help="output shards per split; 0: one per ~64 MB piece of a large file, small "
                                     "files together"),
        "beam_pipeline_args": Parameter(list, [], help="passed to Beam unchanged (e.g. --runner=DataflowRunner); "
                                                        "without --runner, Beam's in-process FnApiRunner"),
    },
    executor="hpml.components.example_gen.executor:run",
)
