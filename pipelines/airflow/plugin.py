"""hpml's Airflow plugin: a Report view on every DAG run, showing an hpml run's live training and its report.

Installed with `hpml[airflow]`; Airflow finds it through the `airflow.plugins` entry point. The view is an
external view of the `dag_run` destination that loads the app of `report_app` (mounted at /hpml), so it needs
Airflow 3.1 or later. On a run of a DAG that is not an hpml pipeline the view says so and shows nothing else.
"""
from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/hpml"


class ReportApp:
    """The report app, built on its first request. Every Airflow process loads plugins (scheduler, dag-processor,
    workers, each task); only the api-server serves this app, so only it pays for building it."""

    def __init__(self):
        self.app = None

    async def __call__(self, scope, receive, send):
        if self.app is None:
            from hpml.pipelines.airflow.report_app import create_app

            self.app = create_app()
        await self.app(scope, receive, send)


class HpmlPlugin(AirflowPlugin):
    name = "hpml"
    fastapi_apps = [{"app": ReportApp(), "url_prefix": URL_PREFIX, "name": "hpml"}]
    external_views = [{
        "name": "Report",
        "href": f"{URL_PREFIX.lstrip('/')}/runs/{{DAG_ID}}/{{RUN_ID}}/",
        "destination": "dag_run",
        "url_route": "hpml-report",
    }]
