"""The bundled data sets' column names, shared by each pipeline and its user module.

Kept apart from the user modules, which import TensorFlow, so that the pipeline definitions
(and the Airflow DAG files built from them) load without it.
"""
PENGUIN_LABEL = "species"
PENGUIN_NUMERIC = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g")
PENGUIN_CATEGORICAL = ("island", "sex")

DIGITS_LABEL = "digit"
DIGITS_PIXELS = tuple(f"pixel_{i}" for i in range(64))
