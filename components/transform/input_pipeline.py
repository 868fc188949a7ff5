"""The InputPipeline artifact: a JSON spec of how to read transformed examples, and
`build_dataset`, which turns the spec into a tf.data.Dataset.

The spec records every decision with its reason, and a fingerprint of the schema it was
made for, so a spec is never applied to data of another shape.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field

from components.errors import SpecError

SPEC_FILE = "input_pipeline.json"
SPEC_VERSION = 1


@dataclass
class InputPipelineSpec:
    schema_fingerprint: str
    batch_size: int = 32
    shuffle_buffer: int = 1024
    num_parallel_reads: int = -1  # -1 means tf.data.AUTOTUNE
    prefetch: int = -1
    compression: str = "GZIP"
    deterministic: bool = True
    decisions: list[dict] = field(default_factory=list)
    version: int = SPEC_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "input pipeline spec") -> "InputPipelineSpec":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SpecError(f"{source}: not valid JSON ({err})") from None
        if data.get("version") != SPEC_VERSION:
            raise SpecError(f"{source}: spec version {data.get('version')!r} is not {SPEC_VERSION}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"{source}: unknown field(s) {', '.join(unknown)}")
        return cls(**data)


def schema_fingerprint(schema) -> str:
    """A stable fingerprint of a tensorflow_metadata Schema's features."""
    return hashlib.sha256(schema.SerializeToString(deterministic=True)).hexdigest()[:16]


def write_spec(spec: InputPipelineSpec, artifact_dir: str) -> None:
    with open(os.path.join(artifact_dir, SPEC_FILE), "w", encoding="utf-8") as handle:
        handle.write(spec.to_json())


def read_spec(artifact_dir: str) -> InputPipelineSpec:
    path = os.path.join(artifact_dir, SPEC_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            return InputPipelineSpec.from_json(handle.read(), source=path)
    except FileNotFoundError:
        raise SpecError(f"input pipeline spec {path} does not exist") from None


def plain_spec(schema, batch_size: int) -> InputPipelineSpec:
    """A sensible untuned spec: parallel reads and prefetch left to AUTOTUNE."""
    return InputPipelineSpec(
        schema_fingerprint=schema_fingerprint(schema),
        batch_size=batch_size,
        decisions=[
            {"what": "num_parallel_reads", "value": "AUTOTUNE", "why": "untuned default"},
            {"what": "prefetch", "value": "AUTOTUNE", "why": "overlap input with training"},
        ],
    )


def build_dataset(
    spec: InputPipelineSpec,
    file_patterns: list[str],
    schema,
    *,
    label_key: str | None = None,
    batch_size: int | None = None,
    shuffle: bool = True,
    num_epochs: int | None = 1,
    seed: int | None = None,
):
    """A batched dataset of (features, label) or features, built as the spec says."""
    import tensorflow as tf
    from tensorflow_transform.tf_metadata import schema_utils

    if schema_fingerprint(schema) != spec.schema_fingerprint:
        raise SpecError(
            "the input pipeline spec was made for a different schema "
            f"({spec.schema_fingerprint} != {schema_fingerprint(schema)})",
            hint="re-run Transform for this data",
        )
    files = tf.io.gfile.glob(list(file_patterns))
    if not files:
        raise SpecError(f"no files match {', '.join(file_patterns)}")
    autotune = tf.data.AUTOTUNE
    feature_spec = schema_utils.schema_as_feature_spec(schema).feature_spec
    dataset = tf.data.Dataset.from_tensor_slices(sorted(files))
    if shuffle:
        dataset = dataset.shuffle(len(files), seed=seed)
    dataset = dataset.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=spec.compression),
        num_parallel_calls=spec.num_parallel_reads if spec.num_parallel_reads != -1 else autotune,
        deterministic=spec.deterministic,
    )
    if shuffle:
        dataset = dataset.shuffle(spec.shuffle_buffer, seed=seed)
    dataset = dataset.batch(batch_size or spec.batch_size)
    dataset = dataset.map(lambda records: tf.io.parse_example(records, feature_spec), num_parallel_calls=autotune)
    if label_key is not None:
        dataset = dataset.map(lambda feats: (feats, feats.pop(label_key)))
    if num_epochs != 1:
        dataset = dataset.repeat(num_epochs)
    return dataset.prefetch(spec.prefetch if spec.prefetch != -1 else autotune)
