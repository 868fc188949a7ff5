"""Infer a tensorflow_metadata Schema from tf.Examples, and check data against a given one.

A feature present in every example with exactly one value gets `shape {dim {size: 1}}`,
which tf.Transform reads as a FixedLenFeature; anything else stays a VarLenFeature, as TFX's
SchemaGen does with infer_feature_shape=True.
"""
from __future__ import annotations

import apache_beam as beam
from tensorflow_metadata.proto.v0 import schema_pb2

from hpml.components.errors import InputDataError
from hpml.components.schema_file import EMPTY_COLUMN, is_empty_column

_KINDS = {"int64_list": schema_pb2.INT, "float_list": schema_pb2.FLOAT, "bytes_list": schema_pb2.BYTES}
_KIND_NAMES = {schema_pb2.INT: "INT", schema_pb2.FLOAT: "FLOAT", schema_pb2.BYTES: "BYTES"}


class FeatureStats(beam.CombineFn):
    """Per feature and kind: how many examples have it, its min and max value counts, and the first record
    (by file, then index) that stores it so. Takes (file, record index, serialized tf.Example)."""

    def create_accumulator(self):
        return {"_n": 0}

    def add_input(self, acc, record):
        import tensorflow as tf

        path, index, serialized = record
        example = tf.train.Example.FromString(serialized)
        acc["_n"] += 1
        for name, feature in example.features.feature.items():
            kind = feature.WhichOneof("kind")
            if kind is None:
                continue
            count = len(getattr(feature, kind).value)
            kinds = acc.get(name)
            stats = None if kinds is None else kinds.get(kind)
            # What `_add` does, written out: this runs for every feature of every example.
            if stats is None:
                acc.setdefault(name, {})[kind] = [1, count, count, (path, index)]
                continue
            stats[0] += 1
            if count < stats[1]:
                stats[1] = count
            elif count > stats[2]:
                stats[2] = count
            first = stats[3]
            if path < first[0] or (index < first[1] and path == first[0]):  # bundles need not come in order
                stats[3] = (path, index)
        return acc

    def merge_accumulators(self, accs):
        merged = self.create_accumulator()
        for acc in accs:
            for name, kinds in acc.items():
                if name == "_n":
                    merged["_n"] += kinds
                    continue
                for kind, stats in kinds.items():
                    _add(merged.setdefault(name, {}), kind, list(stats))
        return merged

    def extract_output(self, acc):
        for name, kinds in sorted(acc.items()):
            if name != "_n" and len(kinds) > 1:
                raise _mixed_kinds(name, kinds)
        return {name: (stats if name == "_n" else next(iter(stats.items()))) for name, stats in acc.items()}


def _add(kinds: dict, kind: str, stats: list) -> None:
    """Folds one kind's [examples, min count, max count, first (file, index)] into a feature's stats."""
    mine = kinds.get(kind)
    if mine is None:
        kinds[kind] = stats
        return
    mine[0] += stats[0]
    mine[1] = min(mine[1], stats[1])
    mine[2] = max(mine[2], stats[2])
    mine[3] = min(mine[3], stats[3])


def _mixed_kinds(name: str, kinds: dict) -> InputDataError:
    """Names, for a feature stored as more than one kind of list, how many records hold each and the first."""
    ordered = sorted(kinds.items(), key=lambda item: (-item[1][0], item[1][3]))
    parts = [f"{kind} in {stats[0]} record{'s' if stats[0] != 1 else ''} (first {stats[3][0]}: record {stats[3][1]})"
             for kind, stats in ordered]
    return InputDataError(f"feature {name!r} is {' and '.join(parts)}",
                          hint="store each feature as the same kind of list in every record")


def schema_from_stats(stats: dict) -> schema_pb2.Schema:
    total = stats["_n"]
    schema = schema_pb2.Schema()
    for name in sorted(k for k in stats if k != "_n"):
        kind, (present, min_count, max_count, _) = stats[name]
        feature = schema.feature.add(name=name, type=_KINDS[kind])
        if present == total and min_count == 1 and max_count == 1:
            feature.shape.dim.add(size=1)
            feature.presence.min_fraction = 1.0
        else:
            feature.value_count.min = min_count
            feature.value_count.max = max_count
        feature.presence.min_count = 1
    return schema


def add_empty_columns(schema: schema_pb2.Schema, columns) -> list[str]:
    """Adds each input column that held no value in any row as a DISABLED feature, so the schema still names it
    (TFX's readers and tf.Transform skip DISABLED features) and a later "feature 'sex' is not in the schema"
    can say why. Returns their names."""
    present = {f.name for f in schema.feature}
    empty = [name for name in columns if name not in present]
    for name in empty:
        feature = schema.feature.add(name=name, type=schema_pb2.BYTES, lifecycle_stage=schema_pb2.DISABLED)
        feature.annotation.comment.append(EMPTY_COLUMN)
    return empty


def check_against(expected: schema_pb2.Schema, inferred: schema_pb2.Schema, source: str) -> None:
    """Every feature the expected schema names must exist in the data with the same type."""
    found = {f.name: f for f in inferred.feature if not is_empty_column(f)}
    empty = {f.name for f in inferred.feature if is_empty_column(f)}
    for feature in expected.feature:
        actual = found.get(feature.name)
        if feature.name in empty:
            raise InputDataError(f"{source}: schema field {feature.name!r} is a column with no value in any row",
                                 hint="check the export that wrote the data")
        if actual is None:
            raise InputDataError(
                f"{source}: schema field {feature.name!r} is not in the data",
                hint=f"the data has: {', '.join(sorted(found))}",
            )
        if actual.type != feature.type:
            raise InputDataError(
                f"{source}: schema field {feature.name!r} is {_KIND_NAMES.get(feature.type)} "
                f"but the data holds {_KIND_NAMES.get(actual.type)}"
            )


class MergedFeatureStats(beam.CombineFn):
    """`FeatureStats` over accumulators that writers computed for a batch of records each."""

    def create_accumulator(self):
        return {"_n": 0}

    def add_input(self, acc, stats):
        return FeatureStats().merge_accumulators([acc, stats])

    def merge_accumulators(self, accs):
        return FeatureStats().merge_accumulators(accs)

    def extract_output(self, acc):
        return FeatureStats().extract_output(acc)
