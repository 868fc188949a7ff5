"""Airflow's SimpleAuthManager with one per-DAG restriction, for the stack's access-control tests.

SimpleAuthManager lets every role read every DAG; per-DAG permissions come from auth managers such as FAB's or
Keycloak's, which this environment does not install. This one denies the user `outsider` (a viewer) every access
to the `penguin` DAG and otherwise decides as SimpleAuthManager does, so the UI and the API refuse that user the
DAG exactly as such a deployment would, and hpml's plugin must refuse it too.
"""
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

OUTSIDER, HIDDEN_DAG = "outsider", "penguin"


class RestrictedAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        if user.username == OUTSIDER and details is not None and details.id == HIDDEN_DAG:
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)

    def filter_authorized_dag_ids(self, *, dag_ids, user, method="GET", team_name=None):
        allowed = super().filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method=method, team_name=team_name)
        return {dag_id for dag_id in allowed if not (user.username == OUTSIDER and dag_id == HIDDEN_DAG)}
