"""The distillation pipeline on scikit-learn's 8x8 digits.

ExampleGen -> Transform -> k teachers -> SoftTargets (the teachers run once, in Beam) ->
a student distilled from them and the same student from scratch -> Evaluator, which scores
every model, the teachers' ensemble too, on the same raw eval split.
"""
from __future__ import annotations

from components.evaluator import EVALUATOR
from components.example_gen import EXAMPLE_GEN
from components.soft_targets import SOFT_TARGETS
from components.trainer import TRAINER
from components.transform import TRANSFORM
from pipelines import columns
from pipelines.definition import Node, Pipeline
from pipelines.paths import digits_csv, ensure_digits_csv

MODULE = "pipelines.digits_module"
NUM_TEACHERS = 3


def params_schema(default_data_path: str) -> dict:
    """JSON schema (draft 7) of the distillation pipeline's parameters (the trigger form)."""
    def integer(default, low, high, title, description):
        return {"type": "integer", "minimum": low, "maximum": high, "default": default, "title": title,
                "description": description}

    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "data_path": {"type": "string", "minLength": 1, "default": default_data_path, "title": "Data path",
                          "description": "Digits CSV (pixel_0..pixel_63, digit). Must lie under HPML_DATA_ROOTS."},
            "teacher_epochs": integer(30, 1, 1000, "Teacher epochs", "Full passes over the train split per teacher."),
            "student_epochs": integer(60, 1, 1000, "Student epochs",
                                      "Full passes for the distilled student and the one from scratch."),
            "teacher_hidden": integer(512, 1, 4096, "Teacher width", "Units in each of the teacher's two layers."),
            "student_hidden": integer(32, 1, 4096, "Student width", "Units in the student's one hidden layer."),
            "batch_size": integer(64, 1, 65536, "Batch size", "Global batch size, summed over replicas."),
            "learning_rate": {"type": "number", "exclusiveMinimum": 0, "maximum": 10, "default": 0.01,
                              "title": "Student learning rate", "description": "Adam learning rate of the students."},
            "temperature": {"type": "number", "exclusiveMinimum": 0, "maximum": 100, "default": 4.0,
                            "title": "Temperature T", "description": "Softens teacher and student outputs."},
            "alpha": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5, "title": "Soft-target weight a",
                      "description": "L = (1 - a) CE(y, student) + a T^2 KL(teachers_T || student_T)."},
            "strategy": {"type": "string", "enum": ["auto", "one_device", "mirrored"], "default": "auto",
                         "title": "Distribution strategy", "description": "tf.distribute strategy of every Trainer."},
            "seed": integer(0, 0, 2 ** 31 - 1, "Seed", "Seeds every model; teacher i uses seed + i."),
        },
    }


def _trainer(p, hidden, epochs, seed, learning_rate, teacher=False, **extra) -> dict:
    """Trainer parameters: teachers train with dropout on one-pixel-shifted digits (Hinton et al.'s
    recipe), students without either; everything is a ReLU MLP."""
    return {"module": MODULE, "strategy": p["strategy"],
            "hyperparameters": {"hidden": hidden, "epochs": epochs, "batch_size": p["batch_size"], "seed": seed,
                                "dropout": 0.3 if teacher else 0.0, "shift_augment": teacher,
                                "learning_rate": learning_rate, "activation": "relu"},
            **extra}


def build(num_teachers: int = NUM_TEACHERS, name: str = "distillation") -> Pipeline:
    """The pipeline with `num_teachers` teachers (more than one adds an ensemble row)."""
    teachers = [f"Teacher_{i}" for i in range(num_teachers)]
    transformed = {"examples": ("Transform", "transformed_examples"),
                   "transform_graph": ("Transform", "transform_graph"),
                   "input_pipeline": ("Transform", "input_pipeline")}
    students = {k: v for k, v in transformed.items() if k != "input_pipeline"}
    teacher_nodes = tuple(
        Node(node_id, TRAINER, inputs=transformed,
             params=lambda p, i=i: _trainer(p, [p["teacher_hidden"]] * 2, p["teacher_epochs"], p["seed"] + i,
                                            1e-3, teacher=True))
        for i, node_id in enumerate(teachers))
    return Pipeline(
        name=name,
        description="Distil an MLP teacher (or an ensemble) on scikit-learn's 8x8 digits into a small student, "
                    "and compare it with the same student trained from scratch.",
        params_schema=params_schema(digits_csv()),
        nodes=(
            Node("ExampleGen", EXAMPLE_GEN, params=lambda p: {
                "input_path": ensure_digits_csv(p["data_path"]), "required_columns": [columns.DIGITS_LABEL],
                "numeric_columns": [columns.DIGITS_LABEL, *columns.DIGITS_PIXELS]}),
            Node("Transform", TRANSFORM,
                 inputs={"examples": ("ExampleGen", "examples"), "schema": ("ExampleGen", "schema")},
                 params=lambda p: {"module": MODULE, "batch_size": p["batch_size"],
                                   "required_features": [columns.DIGITS_LABEL, *columns.DIGITS_PIXELS]}),
            *teacher_nodes,
            Node("SoftTargets", SOFT_TARGETS,
                 inputs={"examples": ("Transform", "transformed_examples"),
                         "transform_graph": ("Transform", "transform_graph"),
                         "teachers": [(t, "model") for t in teachers]},
                 params=lambda p: {"label_key": columns.DIGITS_LABEL, "temperature": p["temperature"]}),
            # Both students read through TFXIO in the same order, so they differ only in the loss: the tuned
            # InputPipeline spec is fingerprinted to the transformed schema, which soft targets extend.
            Node("Student_scratch", TRAINER, inputs=students,
                 params=lambda p: _trainer(p, [p["student_hidden"]], p["student_epochs"], p["seed"],
                                           p["learning_rate"])),
            Node("Student_distilled", TRAINER,
                 inputs={**students, "examples": ("SoftTargets", "examples"),
                         "teachers": [(t, "model") for t in teachers]},
                 params=lambda p: _trainer(p, [p["student_hidden"]], p["student_epochs"], p["seed"],
                                           p["learning_rate"], mode="distill", temperature=p["temperature"],
                                           alpha=p["alpha"], soft_targets="precomputed")),
            Node("Evaluator", EVALUATOR,
                 inputs={"examples": ("ExampleGen", "examples"),
                         "models": [(n, "model") for n in teachers + ["Student_scratch", "Student_distilled"]]},
                 params=lambda p: {
                     "label_key": columns.DIGITS_LABEL,
                     "model_names": [t.lower() for t in teachers] + ["student_scratch", "student_distilled"],
                     "ensembles": {"ensemble": [t.lower() for t in teachers]} if num_teachers > 1 else {},
                     "distillation": {"teacher": "ensemble" if num_teachers > 1 else "teacher_0",
                                      "scratch": "student_scratch", "distilled": "student_distilled"}}),
        ),
    )


PIPELINE = build()
