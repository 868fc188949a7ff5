"""The two untuned pipelines a tuned spec is measured against, built from the same spec fields.

Both keep the tuned spec's shard order (cycle length), so that in deterministic mode all three
yield the same elements in the same order and differ only in how fast they do it.
"""
from __future__ import annotations

from dataclasses import replace

from hpml.components.input_pipeline.spec import AUTOTUNE, InputPipelineSpec


def naive_spec(like: InputPipelineSpec) -> InputPipelineSpec:
    """Parallelism 1 everywhere, per-record parsing, no cache, no prefetch, no static optimisations."""
    return replace(
        like, read_parallelism=1, vectorized_parse=False, map_parallelism=1, cache="none", prefetch=0,
        ram_budget_bytes=0, cpu_budget=0, private_threadpool_size=0, static_optimizations={},
        apply_default_optimizations=False, autotune=False, deterministic=True,
        decisions=[{"what": "baseline", "value": "naive", "why": "sequential reference"}],
    )


def autotune_spec(like: InputPipelineSpec, keep_order: bool = False) -> InputPipelineSpec:
    """AUTOTUNE on every interleave, map and prefetch; per-record parsing; no cache."""
    return replace(
        like, cycle_length=like.cycle_length if keep_order else AUTOTUNE, read_parallelism=AUTOTUNE,
        vectorized_parse=False, map_parallelism=AUTOTUNE, cache="none", prefetch=AUTOTUNE,
        ram_budget_bytes=0, cpu_budget=0, private_threadpool_size=0, static_optimizations={},
        apply_default_optimizations=True, autotune=True,
        decisions=[{"what": "baseline", "value": "autotune-everywhere", "why": "tf.data defaults"}],
    )


def plain_spec(schema_fingerprint: str, batch_size: int) -> InputPipelineSpec:
    """An untuned spec for when Transform is told not to tune: AUTOTUNE reads and prefetch."""
    spec = autotune_spec(InputPipelineSpec(schema_fingerprint=schema_fingerprint, batch_size=batch_size))
    return replace(spec, vectorized_parse=True,
                   decisions=[{"what": "tuning", "value": "off",
                               "why": "Transform ran with tune_input_pipeline=False"}])
