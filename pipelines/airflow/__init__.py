"""The Airflow adapter: DAGs built from pipeline definitions (dag.py), and a project-local Airflow that runs one
DAG run in this process (local.py). Needs the `airflow` extra."""
