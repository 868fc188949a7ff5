"""The Trainer's live state, where a launcher and the Airflow UI read it while training runs.

The chief rewrites `progress.json` (steps, epochs, ETA, the loss so far, each finished epoch's metrics) under the
model's run-scoped working directory, `<model>.work/progress/`; a launcher that restarts a process appends to
`restarts.json` beside it. Nothing here imports TensorFlow: the Airflow api-server reads these files.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from hpml.components import files

PROGRESS_DIR = "progress"
PROGRESS_FILE = "progress.json"
RESTARTS_FILE = "restarts.json"


def working_dir_for(model_uri: str) -> str:
    """A stable, run-scoped working dir: BackupAndRestore's backups survive task retries here."""
    return files.absolute(model_uri) + ".work"


def progress_dir(working_dir: str) -> str:
    return os.path.join(working_dir, PROGRESS_DIR)


def write_json(path: str, state) -> None:
    """Replaces the file whole: a reader never sees half of it."""
    files.write_text(path, json.dumps(state))


def read_json(path: str):
    try:
        return json.loads(files.read_text(path))
    except (OSError, ValueError):
        return None


def read_progress(directory: str) -> dict | None:
    return read_json(os.path.join(directory, PROGRESS_FILE))


def read_step_progress(directory: str) -> dict | None:
    """The progress file if it reports every step, else None: one written at epochs' ends (parameter servers) names
    no resume step, so a launcher cannot tell from it what a restart cost or when training moved again."""
    progress = read_progress(directory)
    return progress if progress and progress.get("grain", "step") == "step" else None


def without_unmeasured_recovery(launch: Mapping[str, Any]) -> dict[str, Any]:
    """A launcher's report without `steps_lost` and `recovery_seconds` where they were not measured. They come from
    step progress, which a parameter-server job does not write, so a restart of its whole job leaves them unknown,
    which a 0 would misstate; a worker restarted alone in place needs no recovery."""
    whole = launch.get("restarts", 0) - len(launch.get("restarted_in_place") or [])
    if len(launch.get("recovery_seconds") or []) >= whole:
        return dict(launch)
    return {name: value for name, value in launch.items() if name not in ("steps_lost", "recovery_seconds")}


def read_restarts(directory: str) -> list[dict]:
    return read_json(os.path.join(directory, RESTARTS_FILE)) or []


def record_restart(directory: str, restarts: int, reason: str, alone: str | None = None) -> None:
    """One more restart of the cluster (or of the process `alone`), with the failure that caused it."""
    files.makedirs(directory)
    entry = {"time": time.time(), "restarts": restarts, "reason": reason[:500], "process": alone}
    write_json(os.path.join(directory, RESTARTS_FILE), [*read_restarts(directory), entry])
