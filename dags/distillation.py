"""The digits distillation pipeline as an Airflow DAG (manual runs; validated trigger form)."""
from pipelines.airflow_dag import build_dag
from pipelines.distillation import PIPELINE

dag = build_dag(PIPELINE, schedule=None)
