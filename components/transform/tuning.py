"""Transform's last step: tune the input pipeline on the transformed examples and explain it.

Writes the InputPipeline artifact: input_pipeline.json (the spec), and stages.json/stages.png,
the per-stage breakdown of the tuned pipeline over (at most a bounded sample of) one pass of the profiled split.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any
from collections.abc import Mapping

import tensorflow as tf

from hpml.components import input_pipeline
from hpml.components.input_pipeline import stages

log = logging.getLogger(__name__)


SUMMARY_KNOBS = ("cache", "map_parallelism", "cycle_length", "shuffle_buffer", "prefetch")
# The per-stage breakdown runs the tuned pipeline over at most this many times `profile_sample_records` records (and
# the batches its prefetch holds beyond them): a bounded sample, so the tuning step costs the same at any data size
# (a whole pass over 10M rows would be minutes).
PROFILED_SAMPLES = 16


def summary_line(spec) -> str:
    """One line of the decisions a user looks at first, e.g. 'cache=memory map_parallelism=2 prefetch=16'."""
    chosen = {d["what"]: d["value"] for d in spec.decisions}
    shown = " ".join(f"{knob}={chosen[knob]}" for knob in SUMMARY_KNOBS if knob in chosen)
    return f"tuned {shown}" if shown else "not tuned (tune_input_pipeline is off)"


def write_input_pipeline(file_pattern: str, schema, artifact_dir: str, params: Mapping[str, Any]) -> dict:
    """Tune (or not, as `tune_input_pipeline` says), write the spec and the breakdown; a summary."""
    fingerprint = input_pipeline.schema_fingerprint(schema)
    if not params["tune_input_pipeline"]:
        spec = input_pipeline.plain_spec(fingerprint, params["batch_size"])
    else:
        files = sorted(tf.io.gfile.glob(file_pattern))
        measurements = input_pipeline.measure_tfrecords(
            files, schema, compression="GZIP", batch_size=params["batch_size"],
            sample_records=params["profile_sample_records"])
        spec = input_pipeline.tune(
            measurements, schema_fingerprint=fingerprint, batch_size=params["batch_size"],
            deterministic=params["deterministic"], ram_fraction=params["ram_fraction"],
            on_corrupt_shard=params["on_corrupt_shard"])
    input_pipeline.write_spec(spec, artifact_dir)
    unprofiled = stages.unprofiled_reason()
    if unprofiled:
        breakdown = {"recommendation": f"No per-stage breakdown: {unprofiled}."}
    else:
        # get_model_proto reads tf.data's autotuning model, which exists only with autotune on. The shuffle window
        # is cut to the profiled records: the tuned one grows with the data (an eighth of it in the first epoch),
        # and filling it would read and hold that much before the first profiled batch.
        sample = PROFILED_SAMPLES * params["profile_sample_records"]
        window = min(spec.first_epoch_window or spec.shuffle_buffer, sample)
        profiled = dataclasses.replace(spec, autotune=True, shuffle_buffer=min(spec.shuffle_buffer, window),
                                       first_epoch_window=window)
        one_pass = input_pipeline.build_dataset(profiled, [file_pattern], schema, shuffle=True, num_epochs=1, seed=0)
        batches = -(-sample // params["batch_size"])
        breakdown = stages.write_breakdown(stages.profile_pipeline(one_pass, max_elements=batches), artifact_dir)
    for decision in spec.decisions:
        log.debug("input pipeline: %s = %s (%s)", decision["what"], decision["value"], decision["why"])
    log.debug("input pipeline: %s", breakdown["recommendation"])
    log.info("input pipeline: %s (the run report gives the reason for each choice)", summary_line(spec))
    return {"decisions": {d["what"]: d["value"] for d in spec.decisions if not isinstance(d["value"], dict)},
            "recommendation": breakdown["recommendation"]}
