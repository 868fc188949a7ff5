"""The InputPipeline artifact: a JSON spec of how to read one data set, every choice with its reason.

The spec carries a fingerprint of the schema it was tuned for, so it is never applied to data of
another shape, and the measurements its decisions came from, so a reader can check them.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field

from hpml.components import artifacts, files
from hpml.components.errors import SpecError

SPEC_FILE = artifacts.INPUT_PIPELINE_SPEC_FILE
SPEC_VERSION = 2
AUTOTUNE = -1  # stands for tf.data.AUTOTUNE in the JSON
CACHE_MODES = ("none", "memory", "disk")
CORRUPT_SHARD_MODES = ("error", "skip")


@dataclass
class InputPipelineSpec:
    """How to read TFRecord shards: extraction, parsing, caching, shuffling, prefetch and Options."""

    schema_fingerprint: str
    batch_size: int = 32
    compression: str = "GZIP"
    cycle_length: int = AUTOTUNE  # shards read at once
    read_parallelism: int = AUTOTUNE  # interleave num_parallel_calls
    deterministic: bool = True
    vectorized_parse: bool = True  # batch, then parse_example on the whole batch
    parse_batch_size: int = 256  # records per chunk: read, parsed, cached and shuffled together
    map_parallelism: int = AUTOTUNE  # num_parallel_calls of the parse (and transform) map
    cache: str = "none"
    shuffle_buffer: int = 1024  # records permuted together (a window of chunks)
    first_epoch_window: int = 0  # the window while the shards are first read; 0: shuffle_buffer
    permute_slice: int = 0  # records gathered at a time from a permuted window; 0: the whole window
    prefetch: int = AUTOTUNE
    ram_budget_bytes: int = 0  # 0: tf.data's default (half the RAM)
    cpu_budget: int = 0  # 0: tf.data's default (all cores)
    private_threadpool_size: int = 0  # 0: the shared inter-op pool
    static_optimizations: dict = field(default_factory=dict)
    apply_default_optimizations: bool = True
    autotune: bool = True
    on_corrupt_shard: str = "error"
    measurements: dict = field(default_factory=dict)
    decisions: list = field(default_factory=list)
    version: int = SPEC_VERSION

    def __post_init__(self):
        positive = ("batch_size", "parse_batch_size")
        for name in positive:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise SpecError(f"input pipeline spec: {name} must be a positive integer, not {getattr(self, name)!r}")
        for name in ("cycle_length", "read_parallelism", "map_parallelism", "prefetch"):
            value = getattr(self, name)
            if not isinstance(value, int) or (value < 0 and value != AUTOTUNE):
                raise SpecError(f"input pipeline spec: {name} must be >= 0 or {AUTOTUNE} (AUTOTUNE), not {value!r}")
        for name in ("shuffle_buffer", "first_epoch_window", "permute_slice", "ram_budget_bytes", "cpu_budget",
                     "private_threadpool_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise SpecError(f"input pipeline spec: {name} must be a non-negative integer")
        if self.cache not in CACHE_MODES:
            raise SpecError(f"input pipeline spec: cache must be one of {', '.join(CACHE_MODES)}, not {self.cache!r}")
        if self.on_corrupt_shard not in CORRUPT_SHARD_MODES:
            raise SpecError(f"input pipeline spec: on_corrupt_shard must be one of "
                            f"{', '.join(CORRUPT_SHARD_MODES)}, not {self.on_corrupt_shard!r}")
        if self.cache != "none" and not self.vectorized_parse:
            raise SpecError("input pipeline spec: a cache needs vectorized_parse (it caches parsed chunks)")
        if self.compression not in ("", "GZIP", "ZLIB"):
            raise SpecError(f"input pipeline spec: compression must be '', GZIP or ZLIB, not {self.compression!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, source: str = "input pipeline spec") -> InputPipelineSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise SpecError(f"{source}: not valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise SpecError(f"{source}: expected a JSON object")
        if data.get("version") != SPEC_VERSION:
            raise SpecError(f"{source}: spec version {data.get('version')!r} is not {SPEC_VERSION}",
                            hint="re-run Transform to tune a current spec")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise SpecError(f"{source}: unknown field(s) {', '.join(unknown)}")
        try:
            return cls(**data)
        except TypeError as err:
            raise SpecError(f"{source}: {err}") from None

    def decision(self, what: str) -> dict | None:
        return next((d for d in self.decisions if d["what"] == what), None)


def schema_fingerprint(schema) -> str:
    """A stable fingerprint of a tensorflow_metadata Schema."""
    return hashlib.sha256(schema.SerializeToString(deterministic=True)).hexdigest()[:16]


def write_spec(spec: InputPipelineSpec, artifact_dir: str) -> str:
    path = os.path.join(artifact_dir, SPEC_FILE)
    files.write_text(path, spec.to_json())
    return path


def read_spec(artifact_dir: str) -> InputPipelineSpec:
    path = os.path.join(artifact_dir, SPEC_FILE)
    try:
        return InputPipelineSpec.from_json(files.read_text(path), source=path)
    except FileNotFoundError:
        raise SpecError(f"input pipeline spec {path} does not exist") from None
