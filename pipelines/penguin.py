"""The penguin pipeline: palmerpenguins CSV -> ExampleGen -> Transform -> Trainer."""
from __future__ import annotations

from components.example_gen import EXAMPLE_GEN
from components.trainer import TRAINER
from components.transform import TRANSFORM
from pipelines import columns
from pipelines.definition import Node, Pipeline
from pipelines.params import training_params_schema
from pipelines.paths import penguins_csv

MODULE = "pipelines.penguin_module"

PIPELINE = Pipeline(
    name="penguin",
    description="Classify palmerpenguins species from bill, flipper, mass, island and sex.",
    params_schema=training_params_schema(penguins_csv()),
    nodes=(
        Node(
            "ExampleGen", EXAMPLE_GEN,
            params=lambda p: {
                "input_path": p["data_path"],
                "required_columns": [columns.PENGUIN_LABEL],
                "numeric_columns": list(columns.PENGUIN_NUMERIC),
                "skip_bad_rows": p["skip_bad_rows"],
                "encoding": p["encoding"],
            },
        ),
        Node(
            "Transform", TRANSFORM,
            inputs={"examples": ("ExampleGen", "examples"), "schema": ("ExampleGen", "schema")},
            params=lambda p: {
                "module": MODULE,
                "required_features": [columns.PENGUIN_LABEL, *columns.PENGUIN_NUMERIC,
                                      *columns.PENGUIN_CATEGORICAL],
                "batch_size": p["batch_size"],
            },
        ),
        Node(
            "Trainer", TRAINER,
            inputs={
                "examples": ("Transform", "transformed_examples"),
                "transform_graph": ("Transform", "transform_graph"),
                "schema": ("ExampleGen", "schema"),
                "input_pipeline": ("Transform", "input_pipeline"),
            },
            params=lambda p: {
                "module": MODULE,
                "hyperparameters": {
                    "epochs": p["epochs"], "batch_size": p["batch_size"], "learning_rate": p["learning_rate"],
                    "gradient_accumulation_steps": p["gradient_accumulation_steps"], "remat": p["remat"],
                    "seed": p["seed"],
                },
                "launcher": p["launcher"],
                "cluster": p.get("cluster", {}),
                "strategy": p["strategy"],
                "num_workers": p["num_workers"],
                "num_ps": p["num_ps"],
            },
        ),
    ),
)
