"""hpml's Airflow plugin: a Report view on every DAG run, showing an hpml run's live training and its report.

Installed with `hpml[airflow]`; Airflow finds it through the `airflow.plugins` entry point. The view is an
external view of the `dag_run` destination that loads the app of `report_app` (mounted at /hpml), so it needs
Airflow 3.1 or later. On a run of a DAG that is not an hpml pipeline the view says so and shows nothing else.
"""
from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from hpml.pipelines.airflow.report_app import create_app

URL_PREFIX = "/hpml"


class HpmlPlugin(AirflowPlugin):
    name = "hpml"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "hpml"}]
    external_views = [{
        "name": "Report",
        "href": f"{URL_PREFIX.lstrip('/')}/runs/{{DAG_ID}}/{{RUN_ID}}/",
        "destination": "dag_run",
        "url_route": "hpml-report",
    }]
