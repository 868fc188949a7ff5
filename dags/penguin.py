"""The penguin example as an Airflow DAG (daily, catchup off, validated trigger form).

Copy this file into your Airflow's dags_folder; `python penguin.py` runs it once, as `airflow dags test` would.
"""
from hpml.v1 import load_pipeline
from hpml.v1.airflow import build_dag

dag = build_dag(load_pipeline("penguin"))

if __name__ == "__main__":
    dag.test()
