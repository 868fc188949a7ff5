"""Gate executor: score the candidate and the champion on the same split in one pass, decide, and write the
ModelBlessing: TFX's empty `BLESSED` or `NOT_BLESSED` file, and `gate.json` with the verdict metric by metric."""
from __future__ import annotations

import json
import logging
import os
from typing import Any
from collections.abc import Mapping

from hpml.components import artifacts, files, publishing
from hpml.components.gate import scoring
from hpml.components.gate.verdict import verdict
from hpml.components.pusher import serving_dir
from hpml.components.results import RECORD_KEY, RunRecord

log = logging.getLogger(__name__)


def _champion(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> tuple[str, dict] | None:
    """(the champion's SavedModel folder, what to say about it), or None when there is none yet."""
    if inputs.get("baseline_model"):
        return artifacts.serving_model_path(inputs["baseline_model"]), {"model": inputs["baseline_model"]}
    destination = params["champion_from"]
    version = serving_dir.champion(destination) if destination else None
    if version is None:
        return None
    return serving_dir.version_path(destination, version), {"destination": destination, "version": version}


def run(inputs: Mapping[str, Any], outputs: Mapping[str, str], params: Mapping[str, Any]) -> dict:
    champion = _champion(inputs, params)
    models = {"candidate": artifacts.serving_model_path(inputs["model"])}
    if champion:
        models["champion"] = champion[0]
    count, scored = scoring.score(inputs["examples"], inputs["schema"], params["split"], params["label_key"],
                                  models, params["batch_size"], {*params["thresholds"], *params["margins"]})
    checks = verdict(scored["candidate"], scored.get("champion"), params["thresholds"], params["margins"])
    blessed = all(check["passed"] for check in checks)
    result = {"blessed": blessed, "split": params["split"], "examples": count,
              "champion": champion[1] if champion else None, "scores": scored, "checks": checks}
    for check in checks:
        log.info("Gate: %s: %s", "pass" if check["passed"] else "FAIL", check["reason"])
    log.info("Gate: the candidate is %s", "blessed" if blessed else "NOT blessed")
    with publishing.publish(outputs["blessing"]) as out_dir:
        marker = artifacts.BLESSED_FILE if blessed else artifacts.NOT_BLESSED_FILE
        files.write_text(os.path.join(out_dir, marker), "")
        files.write_text(os.path.join(out_dir, artifacts.GATE_FILE), json.dumps(result, indent=2))
    record = RunRecord(
        metrics={"gate.blessed": int(blessed),
                 **{f"gate.{name}.{metric}": value for name, values in scored.items() for metric, value in
                    values.items()}},
        tags={"hpml.blessed": str(blessed).lower(), "hpml.gate": "; ".join(check["reason"] for check in checks)},
        files={"blessing": (artifacts.GATE_FILE,)})
    return {"blessing": result, RECORD_KEY: record.to_json()}

