"""The MLflow Model Registry side of a push: each pushed version becomes a version of the registered model, and
the alias `champion` names the one the serving folder serves.

Registry versions are numbered by MLflow and serving versions by the serving folder; each registry version carries
its serving version as the tag `serving_version`, and the alias always follows the serving folder's champion,
so two pushers finishing in either order, or a rollback, leave the two in agreement.
"""
from __future__ import annotations

import os
import tempfile
import time

from hpml.components import files
from hpml.components.pusher import serving_dir

CHAMPION_ALIAS = "champion"
SERVING_VERSION_TAG = "serving_version"
SERVING_DIR_TAG = "serving_dir"


def _client(tracking_uri: str):
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri or None, registry_uri=tracking_uri or None)


def register(tracking_uri: str, name: str, destination: str, version: int, run_id: str | None) -> int:
    """Add serving version `version` of `destination` to the registered model `name`; its registry version.

    The model's files are logged to the MLflow run `run_id` (the pipeline run's; a run of its own where there is
    none), and the registry version points there: a tracking server accepts no local path as a source, and any
    MLflow client can then fetch `models:/<name>@champion`.
    """
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    try:
        client.create_registered_model(name, description="Models hpml's Pusher published; the alias "
                                                         f"{CHAMPION_ALIAS!r} is the one in service.")
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    own_run = not run_id
    if not run_id:
        experiment = client.get_experiment_by_name(name)
        run_id = client.create_run(experiment.experiment_id if experiment else client.create_experiment(name),
                                   run_name=f"push {version}").info.run_id
    artifact_path = f"pushed_model/{version}"
    _log_version(client, run_id, serving_dir.version_path(destination, version), artifact_path)
    if own_run:
        client.set_terminated(run_id)
    created = client.create_model_version(
        name, source=f"runs:/{run_id}/{artifact_path}", run_id=run_id,
        tags={SERVING_VERSION_TAG: str(version), SERVING_DIR_TAG: destination})
    sync_champion(tracking_uri, name, destination)
    return int(created.version)


def _log_version(client, run_id: str, folder: str, artifact_path: str) -> None:
    """Log a served version's files to the run; MLflow logs local files only, so a gs:// version goes through a
    temporary local copy."""
    if not files.is_url(folder):
        client.log_artifacts(run_id, folder, artifact_path)
        return
    with tempfile.TemporaryDirectory(prefix="hpml-push-") as local:
        files.copy_tree(folder, local)
        client.log_artifacts(run_id, local, artifact_path)


def registry_versions(tracking_uri: str, name: str, destination: str) -> dict[int, int]:
    """{serving version: registry version} of the registered model's versions pushed to `destination` (empty when
    the model does not exist)."""
    client = _client(tracking_uri)
    found = {}
    for version in client.search_model_versions(f"name='{name}'"):
        serving = version.tags.get(SERVING_VERSION_TAG)
        if serving and serving.isdigit() and version.tags.get(SERVING_DIR_TAG) == destination:
            found[int(serving)] = int(version.version)
    return found


def champion(tracking_uri: str, name: str) -> int | None:
    """The registry version the alias names, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return int(_client(tracking_uri).get_model_version_by_alias(name, CHAMPION_ALIAS).version)
    except MlflowException:
        return None


def sync_champion(tracking_uri: str, name: str, destination: str, attempts: int = 10) -> int | None:
    """Point the alias at the registry version of the serving folder's champion; the registry version, or None
    while that version is not registered yet (its pusher moves the alias when it registers it).

    Two pushers may move the alias at once: the first alias of a model is an insert that only one of them wins,
    and the slower one may set an older champion after the other set the newer. So each pusher sets the alias,
    then reads the champion again and repeats until the alias names it (at most `attempts` times).
    """
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    target = None
    for attempt in range(attempts):
        serving = serving_dir.champion(destination)
        target = registry_versions(tracking_uri, name, destination).get(serving) if serving else None
        if target is None or champion(tracking_uri, name) == target and attempt:
            return target
        try:
            client.set_registered_model_alias(name, CHAMPION_ALIAS, str(target))
        except MlflowException:  # the other pusher inserted the alias first; it exists now
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    return target
