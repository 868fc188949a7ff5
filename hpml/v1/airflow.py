"""hpml's Airflow API, version 1 (needs the `airflow` extra): build a DAG from a pipeline.

    # in your dags_folder, e.g. dags/penguin.py
    from hpml.v1 import load_pipeline
    from hpml.v1.airflow import build_dag

    dag = build_dag(load_pipeline("penguin"))
"""
from hpml.pipelines.airflow.dag import build_dag

__all__ = ["build_dag"]
