"""The penguin pipeline: palmerpenguins CSV -> ExampleGen -> Transform -> Trainer -> Gate -> Pusher.

The data ship inside the palmerpenguins package (`pip install hpml[examples]`); nothing is downloaded.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from hpml.v1 import (EXAMPLE_GEN, TRAINER, TRAINING_CHECKS, TRANSFORM, Node, Pipeline, SpecError, shipping_nodes,
                     step_hyperparameters, training_params_schema, with_shipping_params)

MODULE = "hpml.examples.penguin.module"  # or the path of module.py, as TFX takes a module_file
LABEL = "species"
NUMERIC = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g")
CATEGORICAL = ("island", "sex")


def penguins_csv() -> str:
    """The palmerpenguins package's CSV, found without importing the package (it imports pandas)."""
    package = importlib.util.find_spec("palmerpenguins")
    if package is None or package.origin is None:
        raise SpecError("the penguin example needs the palmerpenguins package, which is not installed",
                        hint="pip install 'hpml[examples]'")
    return str(Path(package.origin).parent / "data" / "penguins.csv")


PIPELINE = Pipeline(
    name="penguin",
    description="Classify palmerpenguins species from bill, flipper, mass, island and sex.",
    params_schema=with_shipping_params(training_params_schema(penguins_csv())),
    param_checks=TRAINING_CHECKS,
    nodes=(
        Node(
            "ExampleGen", EXAMPLE_GEN,
            params=lambda p: {
                "input_path": p["data_path"],
                "required_columns": [LABEL],
                "numeric_columns": list(NUMERIC),
                "skip_bad_rows": p["skip_bad_rows"],
                "encoding": p["encoding"],
            },
        ),
        Node(
            "Transform", TRANSFORM,
            inputs={"examples": ("ExampleGen", "examples"), "schema": ("ExampleGen", "schema")},
            params=lambda p: {
                "module": MODULE,
                "required_features": [LABEL, *NUMERIC, *CATEGORICAL],
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
                    "seed": p["seed"], **step_hyperparameters(p),
                },
                "launcher": p["launcher"],
                "cluster": p.get("cluster", {}),
                "strategy": p["strategy"],
                "num_workers": p["num_workers"],
                "num_ps": p["num_ps"],
            },
        ),
        *shipping_nodes("penguin", LABEL),
    ),
)
