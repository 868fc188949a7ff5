"""`hpml models`: a pipeline's pushed versions and its champion, and a rollback that moves the serving folder
and the MLflow registry's `champion` alias together."""
from __future__ import annotations

import datetime
import os

from hpml.components.errors import HpmlError


def add_parser(sub) -> None:
    models = sub.add_parser("models", help="list a pipeline's pushed model versions and its champion, or roll back")
    models.add_argument("pipeline", help="the pipeline's name, as its runs record it (e.g. penguin)")
    models.add_argument("--serving-dir", default=None, metavar="DIR",
                        help="the serving folder its runs push to (default: HPML_HOME/serving/PIPELINE)")
    models.add_argument("--rollback", type=int, default=None, metavar="VERSION",
                        help="make VERSION the champion: the versions above it leave service (kept in _retired/)")
    models.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from hpml.components import files
    from hpml.components.pusher import registry, serving_dir
    from hpml.pipelines import records, shipping

    destination = files.absolute(args.serving_dir or shipping.serving_dir(args.pipeline, {}))
    if not files.isdir(destination):
        raise HpmlError(f"nothing of {args.pipeline} was pushed to {destination}",
                        hint="a run whose Gate blesses its model pushes it there; pass --serving-dir for another "
                             "folder")
    uri, console = records.tracking_uri(), Console()
    if args.rollback is not None:
        moved = serving_dir.retire_above(destination, args.rollback)
        registry.sync_champion(uri, args.pipeline, destination)
        console.print(f"champion: version {args.rollback}"
                      + (f"; retired {', '.join(map(str, sorted(moved)))}" if moved else "; nothing above it"),
                      highlight=False)
    in_service, retired = serving_dir.versions(destination), serving_dir.retired(destination)
    registered = registry.registry_versions(uri, args.pipeline, destination)
    champion = registry.champion(uri, args.pipeline)
    table = Table(title=f"{args.pipeline} models in {destination}", box=box.SIMPLE_HEAD)
    for column in ("version", "state", "pushed (UTC)", "MLflow version"):
        table.add_column(column, no_wrap=True)
    for version in sorted(in_service + retired, reverse=True):
        folder = serving_dir.version_path(destination, version) if version in in_service else \
            os.path.join(destination, serving_dir.RETIRED_DIR, str(version))
        state = "champion" if version == serving_dir.champion(destination) else \
            "in service" if version in in_service else "retired"
        mlflow_version = registered.get(version)
        mark = f"{mlflow_version} (alias champion)" if mlflow_version and mlflow_version == champion else \
            str(mlflow_version or "-")
        pushed = datetime.datetime.fromtimestamp(files.mtime(os.path.join(folder, serving_dir.SAVED_MODEL_FILE)),
                                                 datetime.UTC)
        table.add_row(str(version), state, f"{pushed:%Y-%m-%d %H:%M:%S}", mark)
    console.print(table)
    return 0
