"""The Schema artifact's file (schema.pbtxt): read and written here, by ExampleGen that infers it and by the
components that read it, and which features it marks as input columns that held no value."""
from __future__ import annotations

from tensorflow_metadata.proto.v0 import schema_pb2

from hpml.components import files
from hpml.components.errors import InputDataError

# The comment on a feature that `add_empty_columns` disables.
EMPTY_COLUMN = "no value in any row of the input"


def is_empty_column(feature: schema_pb2.Feature) -> bool:
    return feature.lifecycle_stage == schema_pb2.DISABLED and EMPTY_COLUMN in feature.annotation.comment



def read_schema(path: str) -> schema_pb2.Schema:
    from google.protobuf import text_format

    if not files.isfile(path):
        raise InputDataError(f"schema file {path} does not exist")
    try:
        return text_format.Parse(files.read_text(path), schema_pb2.Schema())
    except text_format.ParseError as err:
        raise InputDataError(f"{path}: not a valid schema.pbtxt ({err})") from None


def write_schema(schema: schema_pb2.Schema, path: str) -> None:
    from google.protobuf import text_format

    files.write_text(path, text_format.MessageToString(schema))
