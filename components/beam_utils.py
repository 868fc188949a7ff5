"""Running Beam pipelines: pipeline args pass through unchanged, errors come back clean."""
from __future__ import annotations

import logging
import os
import re
import shlex
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from hpml.components import staging
from hpml.components.errors import HpmlError, SpecError

log = logging.getLogger(__name__)

# Beam args for every component whose pipeline gives it none, e.g. "--runner=DataflowRunner --project=p ...".
BEAM_ARGS_ENV = "HPML_BEAM_PIPELINE_ARGS"

# Input at least this large runs on one Beam worker process per core where no Beam args are given. Starting two
# workers costs about 7 s here (ExampleGen on 100k rows: 9.2 s against 2.6 s in one process), and one core does
# about 1M rows (170 MB of CSV) in 11 s, so two pay from roughly 1-2M rows; 512 MB (about 3M rows) is well past
# that. benchmarks/results/scale.md has both variants at each size.
LOCAL_PARALLEL_BYTES = 512 << 20
# The same for Transform, whose input is GZIP tf.Examples (about 110 bytes a row of the benchmark's 21 columns):
# two workers took 0.96x the time of one on 1M rows (109 MB), 0.63x on 10M rows (1.1 GB), so from 256 MB.
TRANSFORM_PARALLEL_BYTES = 256 << 20

_BEAM_CONTEXT = re.compile(r"\s*\[while running '[^']*'\]")


# Beam's in-process runner, named directly. Beam 2.77's DirectRunner first tries Prism, which it downloads from
# GitHub at run time (and starts as a separate process), and falls back to this runner only when that fails.
IN_PROCESS_RUNNER = "FnApiRunner"
# Runners whose workers are this machine's processes: they read what the component staged on local disk.
_THIS_MACHINE_RUNNERS = (IN_PROCESS_RUNNER, "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


def deployment_args() -> list[str]:
    """`HPML_BEAM_PIPELINE_ARGS`, split as a shell would: the deployment's Beam runner and its settings."""
    text = os.environ.get(BEAM_ARGS_ENV, "")
    try:
        return shlex.split(text)
    except ValueError as err:
        raise SpecError(f"{BEAM_ARGS_ENV}: {err} in {text!r}",
                        hint="write the args as on a command line, quoting values with spaces") from None


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def make_pipeline(beam_pipeline_args: Sequence[str] | None, input_bytes: int = 0,
                  parallel_from: int | None = None) -> beam.Pipeline:
    """A Beam pipeline on the in-process runner unless the args name another runner (which they do unchanged).
    A component given no args takes the deployment's (`HPML_BEAM_PIPELINE_ARGS`); given none either, an input of
    `input_bytes` >= `parallel_from` (default LOCAL_PARALLEL_BYTES) runs on one worker process per core."""
    args = list(beam_pipeline_args or deployment_args())
    parallel_from = LOCAL_PARALLEL_BYTES if parallel_from is None else parallel_from
    if not args and input_bytes >= parallel_from and _cores() > 1:
        args = ["--direct_running_mode=multi_processing", f"--direct_num_workers={_cores()}"]
        log.info("Beam: %.0f MB of input, so one worker process per core (%d); give beam_pipeline_args or %s to "
                 "choose otherwise", input_bytes / 1e6, _cores(), BEAM_ARGS_ENV)
    if not any(a.startswith("--runner") for a in args):
        args.append(f"--runner={IN_PROCESS_RUNNER}")
    runner = next(a.split("=", 1)[1] for a in args if a.startswith("--runner="))
    if staging.active() and runner not in _THIS_MACHINE_RUNNERS:
        raise SpecError(f"Beam runner {runner} runs workers on other machines, which cannot read this machine's "
                        "local copies of the s3:// artifacts (TensorFlow has no S3 file system)",
                        hint=f"leave the runner out ({BEAM_ARGS_ENV} too) where the artifact root is on s3://, or "
                             "put it on gs:// or a mount every worker has")
    return beam.Pipeline(options=PipelineOptions(args))


def ship_by_value(fn) -> None:
    """Has Beam pickle the module that defines `fn` by value when that module was loaded from a file (a
    module_file): Beam's worker processes could not import it by the name it was loaded under."""
    import sys

    from apache_beam.internal.cloudpickle import cloudpickle

    from hpml.components.user_module import FILE_MODULE_PREFIX

    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is not None and getattr(module, "__file__", None) and module.__name__.startswith(FILE_MODULE_PREFIX):
        cloudpickle.register_pickle_by_value(module)


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
