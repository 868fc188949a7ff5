"""hpml: high-performance ML training pipelines for Apache Airflow, built from TFX-compatible components.

Import the public API from `hpml.v1`.
"""
__version__ = "0.2.0"
