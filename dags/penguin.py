"""The penguin pipeline as an Airflow DAG (daily, catchup off, validated trigger form)."""
from pipelines.airflow_dag import build_dag
from pipelines.penguin import PIPELINE

dag = build_dag(PIPELINE)
