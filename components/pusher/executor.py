"""Pusher executor: publish a blessed model as the destination's next version; a model that is not blessed is
left where it is, and the PushedModel says why."""
from __future__ import annotations

import json
import logging
import os
from typing import Any
from collections.abc import Callable, Mapping

from hpml.components import artifacts, files, publishing, staging
from hpml.components.gate.blessing import read_blessing
from hpml.components.pusher import registry, serving_dir
from hpml.components.results import RECORD_KEY, RunRecord

log = logging.getLogger(__name__)


def run(inputs: Mapping[str, Any], outputs: Mapping[str, str], params: Mapping[str, Any]) -> dict:
    blessing = read_blessing(inputs["model_blessing"])
    destination = files.absolute(params["destination"])
    # Signed as the PushedModel's writer before it pushes: an attempt cut off mid-push, whose retry began meanwhile,
    # makes no version and no registry version when it comes back (`taken_over` raises).
    with publishing.publish(outputs["pushed_model"]) as out_dir:
        taken_over = publishing.superseded_check(staging.published_uri(outputs["pushed_model"]))
        if blessing["blessed"]:
            result = _push(artifacts.serving_model_path(inputs["model"]), destination, params, taken_over)
        else:
            failed = [check["reason"] for check in blessing.get("checks", []) if not check["passed"]]
            result = {"pushed": False, "destination": destination, "version": None,
                      "reason": "not blessed" + (f": {'; '.join(failed)}" if failed else ""),
                      "champion": serving_dir.champion(destination)}
            log.info("Pusher: nothing pushed (%s); the champion stays version %s", result["reason"],
                     result["champion"])
        files.write_text(os.path.join(out_dir, artifacts.PUSH_FILE), json.dumps(result, indent=2))
    tags = {"hpml.pushed": str(result["pushed"]).lower(), "hpml.push_destination": destination}
    if result["pushed"]:
        tags["hpml.pushed_version"] = str(result["version"])
    if result.get("registry_version"):
        tags["hpml.registered_model"] = f"{result['registered_model']}/{result['registry_version']}"
    record = RunRecord(metrics={"pushed": int(result["pushed"])}, tags=tags,
                       files={"pushed_model": (artifacts.PUSH_FILE,)})
    return {"push": result, RECORD_KEY: record.to_json()}


def _push(model: str, destination: str, params: Mapping[str, Any], taken_over: Callable[[], None]) -> dict:
    """Publish the SavedModel at `model` as the destination's next version (unless it is one already) and register
    it; what the PushedModel says of it."""
    held = serving_dir.holding(model, destination)
    if held is not None:  # an earlier attempt of this push published it
        log.info("Pusher: this model is already version %d at %s; it is not pushed again", held, destination)
    version = held if held is not None else serving_dir.publish(model, destination, taken_over)
    result: dict[str, Any] = {"pushed": True, "destination": destination, "version": version,
                              "already_pushed": held is not None,
                              "path": serving_dir.version_path(destination, version)}
    if held is None:
        log.info("Pusher: published as version %d at %s", version, result["path"])
    if params["registered_model"]:
        taken_over()
        result["registered_model"] = params["registered_model"]
        result["registry_version"] = _register(params, destination, version)
    return result


def _register(params: Mapping[str, Any], destination: str, version: int) -> int:
    """The registry version of serving version `version`, registered now unless an earlier attempt did."""
    name, tracking_uri = params["registered_model"], params["tracking_uri"]
    registered = registry.registry_versions(tracking_uri, name, destination).get(version)
    if registered is not None:
        registry.sync_champion(tracking_uri, name, destination)
        log.info("Pusher: already version %d of MLflow model %r", registered, name)
        return registered
    # MLFLOW_RUN_ID: MLflow's variable for the active run; hpml's runner sets it to the pipeline run's.
    registered = registry.register(tracking_uri, name, destination, version, os.environ.get("MLFLOW_RUN_ID"))
    log.info("Pusher: registered as version %d of MLflow model %r, alias %r follows the served version",
             registered, name, registry.CHAMPION_ALIAS)
    return registered
