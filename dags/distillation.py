"""The digits distillation example as an Airflow DAG (manual runs; validated trigger form).

Copy this file into your Airflow's dags_folder; `python distillation.py` runs it once, as `airflow dags test` would.
"""
from hpml.v1 import load_pipeline
from hpml.v1.airflow import build_dag

dag = build_dag(load_pipeline("distillation"), schedule=None)

if __name__ == "__main__":
    dag.test()
