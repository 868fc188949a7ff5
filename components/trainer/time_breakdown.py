"""Where the Trainer's time went: before fit (building the data and the model, tuning the step and tracing it for fit),
the epochs, the input-stall probe, and after fit (the eval metrics, the per-class report, the export)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# In the order they happen; each is seconds of the Trainer's wall time.
PARTS = ("preparing", "step_tuning", "step_trace", "epochs", "input_stall_probe", "other_in_fit", "after_training")
DESCRIPTIONS = {
    "preparing": "building the data and the model, before fit (the step tuning apart)",
    "step_tuning": "measuring the training step: the steps per call, XLA and precision",
    "step_trace": "tracing the training step, done while tuning it; fit reuses it, where plain fit pays it in its "
                  "first epoch",
    "epochs": "the epochs, validation included (and a ServingExport's staging, which runs alongside them)",
    "input_stall_probe": "measuring the share of a step that waits on input",
    "other_in_fit": "the rest of fit: callbacks between epochs (backups, progress)",
    "after_training": "after fit: eval metrics, the per-class report, the export (with ServingExport, its "
                      "trained weights)",
}


def breakdown(started_at: float, ended_at: float, window: Mapping[str, float] | None,
              history: Sequence[Mapping[str, Any]], tuned_step: Mapping[str, Any] | None,
              stall: Mapping[str, Any] | None) -> dict[str, float] | None:
    """{part: seconds} for a Trainer that ran run_fn from `started_at` to `ended_at` (wall clock, this machine's),
    from fit's window (`FitWindow`), each epoch's seconds, the tuned step's and the stall probe's own seconds (the tuned
    step's with the trace fit reuses, `trace_s`, apart).
    None where fit's window is missing (a run_fn without `standard_callbacks`) or was not of this attempt."""
    if not window or not started_at <= window["started_at"] <= window["ended_at"] <= ended_at:
        return None
    tuning = float((tuned_step or {}).get("seconds") or 0.0)
    probe = float((stall or {}).get("seconds") or 0.0)
    before, fit = window["started_at"] - started_at, window["ended_at"] - window["started_at"]
    epochs = min(sum(float(epoch.get("seconds", 0.0)) for epoch in history), fit)
    probe = min(probe, fit - epochs)
    tuning = min(tuning, before)
    trace = min(float((tuned_step or {}).get("trace_s") or 0.0), tuning)
    return {"preparing": before - tuning, "step_tuning": tuning - trace, "step_trace": trace, "epochs": epochs,
            "input_stall_probe": probe, "other_in_fit": fit - epochs - probe,
            "after_training": ended_at - window["ended_at"]}
