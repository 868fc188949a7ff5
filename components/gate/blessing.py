"""Read a ModelBlessing: hpml's Gate leaves its verdict beside TFX's marker file; TFX's Evaluator leaves the
marker only."""
from __future__ import annotations

import json
import os

from hpml.components import artifacts, files
from hpml.components.errors import SpecError


def read_blessing(blessing_uri: str) -> dict:
    """{"blessed": bool, "checks": [...]} (checks empty for a blessing without hpml's verdict)."""
    verdict_path = os.path.join(blessing_uri, artifacts.GATE_FILE)
    if files.isfile(verdict_path):
        return json.loads(files.read_text(verdict_path))
    blessed = files.exists(os.path.join(blessing_uri, artifacts.BLESSED_FILE))
    if not blessed and not files.exists(os.path.join(blessing_uri, artifacts.NOT_BLESSED_FILE)):
        raise SpecError(f"{blessing_uri} holds neither {artifacts.BLESSED_FILE} nor {artifacts.NOT_BLESSED_FILE}",
                        hint="is it a ModelBlessing written by hpml's Gate or TFX's Evaluator?")
    return {"blessed": blessed, "checks": []}
