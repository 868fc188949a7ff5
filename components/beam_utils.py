"""Running Beam pipelines: pipeline args pass through unchanged, errors come back clean."""
from __future__ import annotations

import os
import re
import shlex
from typing import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from hpml.components.errors import HpmlError, SpecError

# Beam args for every component whose pipeline gives it none, e.g. "--runner=DataflowRunner --project=p ...".
BEAM_ARGS_ENV = "HPML_BEAM_PIPELINE_ARGS"

_BEAM_CONTEXT = re.compile(r"\s*\[while running '[^']*'\]")


# Beam's in-process runner, named directly. Beam 2.77's DirectRunner first tries Prism, which it downloads from
# GitHub at run time (and starts as a separate process), and falls back to this runner only when that fails.
IN_PROCESS_RUNNER = "FnApiRunner"


def deployment_args() -> list[str]:
    """`HPML_BEAM_PIPELINE_ARGS`, split as a shell would: the deployment's Beam runner and its settings."""
    text = os.environ.get(BEAM_ARGS_ENV, "")
    try:
        return shlex.split(text)
    except ValueError as err:
        raise SpecError(f"{BEAM_ARGS_ENV}: {err} in {text!r}",
                        hint="write the args as on a command line, quoting values with spaces") from None


def make_pipeline(beam_pipeline_args: Sequence[str] | None) -> beam.Pipeline:
    """A Beam pipeline on the in-process runner unless the args name another runner (which they do unchanged).
    A component given no args takes the deployment's (`HPML_BEAM_PIPELINE_ARGS`)."""
    args = list(beam_pipeline_args or deployment_args())
    if not any(a.startswith("--runner") for a in args):
        args.append(f"--runner={IN_PROCESS_RUNNER}")
    return beam.Pipeline(options=PipelineOptions(args))


def run_pipeline(pipeline: beam.Pipeline):
    """Run to completion; an HpmlError raised inside a DoFn keeps its own clean message."""
    try:
        result = pipeline.run()
        result.wait_until_finish()
        return result
    except HpmlError as err:
        message = _BEAM_CONTEXT.sub("", str(err))
        raise type(err)(message, getattr(err, "hint", None)) from None


def counter_value(result, namespace: str, name: str) -> int:
    """The committed value of a Beam metrics counter (0 when it never fired)."""
    from apache_beam.metrics.metric import MetricsFilter

    found = result.metrics().query(MetricsFilter().with_namespace(namespace).with_name(name))
    return int(sum(c.committed or 0 for c in found["counters"]))
