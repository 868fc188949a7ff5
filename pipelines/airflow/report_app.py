"""The web app behind hpml's Report view in the Airflow UI: a run's progress while it trains, then its report.

Mounted by the hpml Airflow plugin at /hpml on Airflow's api-server. Airflow does not protect a plugin's
endpoints, so every one here requires an Airflow user (the UI's session cookie or a bearer token) whom Airflow's
auth manager lets read the DAG's runs, serves only the run that the DAG's record names, and serves only files
inside that run's report.

    GET /hpml/runs/{dag_id}/{run_id}/             the page (redraws itself from status.json)
    GET /hpml/runs/{dag_id}/{run_id}/status.json  components, live training, links (pipelines/run_status.py)
    GET /hpml/runs/{dag_id}/{run_id}/report/{file} a file of the run's report (report.html, its plots)
"""
from __future__ import annotations

import html
import json
import os
import secrets
from importlib import resources

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from hpml.components import files
from hpml.pipelines import run_status
from hpml.pipelines.report import report_dir
from hpml.pipelines.templates import fill

VIEW_TEMPLATE = "report_view.html"  # in hpml.pipelines.templates

_TYPES = {".html": "text/html; charset=utf-8", ".png": "image/png", ".json": "application/json",
          ".svg": "image/svg+xml", ".txt": "text/plain; charset=utf-8"}
# A run's report is static: HTML with inline styles and images. Served on Airflow's origin, where the UI's token
# lives, a file in a report folder must never run script: `sandbox` gives it an origin of its own and no scripts,
# and nothing but styles and images may load. This holds for HTML and SVG alike, whoever wrote the file.
REPORT_FILE_POLICY = ("sandbox; default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; "
                      "frame-ancestors 'self'")
_NOT_FOUND = "no such file in this run's report"


def _view_policy(nonce: str) -> str:
    """The view page's own policy: its one inline script (by nonce), status.json and the report's frame."""
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'")


def _user_who_may_read_runs(request: Request, dag_id: str):
    """The request's Airflow user, where Airflow's auth manager lets them read the runs of `dag_id`: 401 without
    a user, 403 without that permission."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.models.dag import DagModel

    if "\0" in dag_id or "\0" in request.path_params.get("run_id", ""):  # no DAG or run has one
        raise HTTPException(status_code=404, detail="no such DAG run")
    user = request.state.hpml_user
    details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id))
    if not get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, details=details,
                                                user=user):
        raise HTTPException(status_code=403, detail=f"you may not read the runs of DAG {dag_id!r}")
    return user


async def _authenticated(request: Request):
    """Airflow's own check of the session cookie or bearer token; 401 where there is neither, or it is invalid."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.security import HTTPAuthorizationCredentials

    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=token) if token else None
    request.state.hpml_user = await get_user(request, None, credentials)


def _record(dag_id: str, run_id: str) -> str:
    found = run_status.find_run(dag_id, run_id)
    if found is None:
        raise HTTPException(status_code=404, detail=f"no hpml run record for run {run_id!r} of DAG {dag_id!r}")
    return found


def report_file(directory: str, path: str) -> str:
    """The path of a file inside the report directory; a path that is absolute, climbs out (`..`), or is a
    symlink resolving outside it is refused."""
    parts = path.split("/")
    if (not path or path.startswith("/") or "\\" in path or "\0" in path
            or any(part in ("", ".", "..") for part in parts)):
        raise HTTPException(status_code=404, detail=_NOT_FOUND)
    full = os.path.join(directory, *parts)
    if not files.is_url(full):
        root = os.path.realpath(directory)
        if os.path.commonpath([root, os.path.realpath(full)]) != root:
            raise HTTPException(status_code=404, detail=_NOT_FOUND)
    if not files.exists(full) or files.isdir(full):
        raise HTTPException(status_code=404, detail=_NOT_FOUND)
    return full


def create_app() -> FastAPI:
    app = FastAPI(title="hpml", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(_authenticated)])
    page = resources.files("hpml.pipelines.templates").joinpath(VIEW_TEMPLATE).read_text(encoding="utf-8")

    @app.get("/runs/{dag_id}/{run_id}", include_in_schema=False)
    def without_slash(request: Request, dag_id: str, run_id: str, _=Depends(_user_who_may_read_runs)):
        return RedirectResponse(url=f"{request.url.path}/", status_code=307)

    @app.get("/runs/{dag_id}/{run_id}/", response_class=HTMLResponse)
    def view(dag_id: str, run_id: str, _=Depends(_user_who_may_read_runs)):
        found = run_status.find_run(dag_id, run_id)
        body = "" if found is not None else (
            f"<p>Run <code>{html.escape(run_id)}</code> of DAG <code>{html.escape(dag_id)}</code> has no hpml run "
            "record. This view shows the runs of hpml pipelines; an hpml run's record opens when its "
            "<code>start_run</code> task runs.</p>")
        nonce = secrets.token_urlsafe(16)
        return HTMLResponse(fill(page, {"TITLE": html.escape(f"{dag_id} · {run_id}"), "BODY": body,
                                        "LIVE": "false" if found is None else "true", "NONCE": nonce}),
                            headers={"Content-Security-Policy": _view_policy(nonce),
                                     "X-Content-Type-Options": "nosniff"})

    @app.get("/runs/{dag_id}/{run_id}/status.json")
    def status(dag_id: str, run_id: str, _=Depends(_user_who_may_read_runs)):
        return JSONResponse(json.loads(json.dumps(run_status.status(_record(dag_id, run_id)), default=str)),
                            headers={"Cache-Control": "no-store"})

    @app.get("/runs/{dag_id}/{run_id}/report/{path:path}")
    def report(dag_id: str, run_id: str, path: str, _=Depends(_user_who_may_read_runs)):
        tags = _tags(_record(dag_id, run_id))
        full = report_file(report_dir(tags.get("hpml.run_dir", "")), path)
        with files.open_file(full, "rb") as handle:
            body = handle.read()
        media = _TYPES.get(os.path.splitext(full)[1].lower(), "application/octet-stream")
        return Response(body, media_type=media, headers={"Cache-Control": "no-store",
                                                         "Content-Security-Policy": REPORT_FILE_POLICY,
                                                         "X-Content-Type-Options": "nosniff"})

    return app


def _tags(mlflow_run_id: str) -> dict:
    from hpml.pipelines import records

    return records.client().get_run(mlflow_run_id).data.tags
