"""The executed timeline of one pipelined training step, read from the TF profiler's trace.

Every op of micro-step F(s, m) or B(s, m) runs under the name scope `stage{s}_{F|B}{m}`; the
gradient ops of a micro-batch that was not rematerialised are named after their forward ops
(`gradient_tape/stage{s}_F{m}/...`) and belong to B(s, m). From the op events' timestamps this
module gives each micro-step's ops, the order in which each stage actually ran them, and the
bubble of the executed step: measured, where schedule.simulate only predicts.
"""
from __future__ import annotations

import glob
import os
import re
import tempfile
from dataclasses import dataclass

_SCOPE = re.compile(r"^(gradient_tape/)?stage(\d+)_([FB])(\d+)/")


@dataclass(frozen=True)
class OpEvent:
    """One executed op of a micro-step; times in milliseconds from the start of the step."""

    stage: int
    kind: str  # "F" or "B"
    micro: int
    start_ms: float
    end_ms: float
    name: str


def micro_step_of(op_name: str) -> tuple[int, str, int] | None:
    """(stage, kind, micro-batch) of an op name, or None for ops outside the micro-steps."""
    match = _SCOPE.match(op_name)
    if not match:
        return None
    gradient, stage, kind, micro = match.groups()
    return int(stage), "B" if gradient else kind, int(micro)


def trace_train_step(model, x, y, logdir: str | None = None) -> list[OpEvent]:
    """Profile one `train_on_batch` (after a warm-up call that traces it) and return its op events.
    The model's weights and optimizer state are left as they were."""
    from hpml.components.trainer.model_state import restored_afterwards

    with restored_afterwards(model):
        return _profile(model, x, y, logdir)


def _profile(model, x, y, logdir: str | None) -> list[OpEvent]:
    import tensorflow as tf

    # A fresh train function: one made elsewhere (e.g. around a dataset iterator, as the input-stall
    # measurement does) shows up in the trace as a few call ops instead of the step's ops.
    model.make_train_function(force=True)
    model.train_on_batch(x, y)  # trace and warm up outside the profile
    with tempfile.TemporaryDirectory() as scratch:
        target = logdir or scratch
        # Level 3 traces every op, including the cheap ones the executor runs inline.
        tf.profiler.experimental.start(target, options=tf.profiler.experimental.ProfilerOptions(host_tracer_level=3))
        try:
            model.train_on_batch(x, y)
        finally:
            tf.profiler.experimental.stop()
        files = glob.glob(os.path.join(target, "plugins", "profile", "*", "*.xplane.pb"))
        if not files:
            raise RuntimeError(f"the TF profiler wrote no trace under {target}")
        return read_events(max(files, key=os.path.getmtime))


def read_events(xplane_path: str) -> list[OpEvent]:
    """The micro-step op events of an XSpace trace file, sorted by start."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as handle:
        space.ParseFromString(handle.read())
    raw = []
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                step = micro_step_of(name)
                if step is not None:
                    start_ps = line.timestamp_ns * 1000 + event.offset_ps
                    raw.append((step, start_ps, start_ps + event.duration_ps, name))
    if not raw:
        return []
    origin = min(start for _, start, _, _ in raw)
    return sorted((OpEvent(s, k, m, (start - origin) / 1e9, (end - origin) / 1e9, name)
                   for (s, k, m), start, end, name in raw), key=lambda e: (e.start_ms, e.stage))


def _anchor(events: list[OpEvent]) -> float:
    """When a micro-step really ran: the start of its first matrix multiply, which waits on the
    micro-step's control dependencies. Variable reads may run early and loss or metric
    bookkeeping late, so neither the first nor the last op will do."""
    matmuls = [e.start_ms for e in events if "MatMul" in e.name]
    return min(matmuls) if matmuls else max(events, key=lambda e: e.end_ms - e.start_ms).start_ms


def executed_order(events: list[OpEvent], num_stages: int) -> list[list[tuple[str, int]]]:
    """Per stage, the micro-steps in the order they executed, in schedule.build's format."""
    steps: dict[tuple[int, str, int], list[OpEvent]] = {}
    for event in events:
        steps.setdefault((event.stage, event.kind, event.micro), []).append(event)
    order: list[list[tuple[str, int]]] = [[] for _ in range(num_stages)]
    for (stage, kind, micro), _ in sorted(steps.items(), key=lambda item: _anchor(item[1])):
        order[stage].append((kind, micro))
    return order


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def measured_bubble(events: list[OpEvent], num_stages: int) -> float:
    """1 - (time each stage had an op running, summed) / (stages x the step's span)."""
    if not events:
        return float("nan")
    span = max(e.end_ms for e in events) - min(e.start_ms for e in events)
    busy = sum(_union_ms([(e.start_ms, e.end_ms) for e in events if e.stage == s]) for s in range(num_stages))
    return 1.0 - busy / (num_stages * span) if span > 0 else float("nan")
