"""The distillation pipeline on scikit-learn's 8x8 digits.

ExampleGen -> Transform -> k teachers -> SoftTargets (the teachers run once, in Beam) ->
a student distilled from them and the same student from scratch -> Evaluator, which scores
every model, the teachers' ensemble too, on the same raw eval split.
"""
from __future__ import annotations

import os
from pathlib import Path

from hpml.v1 import EVALUATOR, EXAMPLE_GEN, SOFT_TARGETS, TRAINER, TRANSFORM, Node, Pipeline, SpecError

MODULE = "hpml.examples.distillation.module"
NUM_TEACHERS = 3
LABEL = "digit"
PIXELS = tuple(f"pixel_{i}" for i in range(64))


def digits_csv() -> str:
    """Where scikit-learn's 8x8 digits live as a headed CSV (pixel_0..pixel_63, digit): HPML_HOME/data.

    Only a path: DAG files are parsed often, so nothing is written here. `ensure_digits_csv`
    writes the file when a run first reads it.
    """
    from hpml.v1 import hpml_home

    return str(hpml_home() / "data" / "digits.csv")


def ensure_digits_csv(path: str) -> str:
    """`path`, with the digits CSV written there first if `path` is `digits_csv()` and missing.

    The data ship inside scikit-learn (`pip install hpml[examples]`; nothing is downloaded); the file is
    written atomically, so concurrent or retried runs never see half of it. Any other path is returned untouched.
    """
    target = Path(digits_csv())
    if Path(path).resolve() != target.resolve() or target.is_file():
        return path
    try:
        import numpy as np
        from sklearn.datasets import load_digits
    except ImportError:
        raise SpecError("the distillation example needs scikit-learn, which is not installed",
                        hint="pip install 'hpml[examples]'") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    digits = load_digits()
    rows = np.column_stack([digits.data.astype(np.int64), digits.target.astype(np.int64)])
    header = ",".join([f"pixel_{i}" for i in range(digits.data.shape[1])] + ["digit"])
    tmp = target.with_suffix(f".tmp-{os.getpid()}")
    np.savetxt(tmp, rows, fmt="%d", delimiter=",", header=header, comments="")
    os.replace(tmp, target)
    return path


def params_schema(default_data_path: str) -> dict:
    """JSON schema (draft 7) of the distillation pipeline's parameters (the trigger form)."""
    def integer(default, low, high, title, description):
        return {"type": "integer", "minimum": low, "maximum": high, "default": default, "title": title,
                "description": description}

    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "data_path": {"type": "string", "format": "path", "minLength": 1, "default": default_data_path,
                          "title": "Data path",
                          "description": "Digits CSV (pixel_0..pixel_63, digit). Another path must lie under "
                                         "HPML_DATA_ROOTS."},
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
                "input_path": ensure_digits_csv(p["data_path"]), "required_columns": [LABEL],
                "numeric_columns": [LABEL, *PIXELS]}),
            Node("Transform", TRANSFORM,
                 inputs={"examples": ("ExampleGen", "examples"), "schema": ("ExampleGen", "schema")},
                 params=lambda p: {"module": MODULE, "batch_size": p["batch_size"],
                                   "required_features": [LABEL, *PIXELS]}),
            *teacher_nodes,
            Node("SoftTargets", SOFT_TARGETS,
                 inputs={"examples": ("Transform", "transformed_examples"),
                         "transform_graph": ("Transform", "transform_graph"),
                         "teachers": [(t, "model") for t in teachers]},
                 params=lambda p: {"label_key": LABEL, "temperature": p["temperature"]}),
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
                     "label_key": LABEL,
                     "model_names": [t.lower() for t in teachers] + ["student_scratch", "student_distilled"],
                     "ensembles": {"ensemble": [t.lower() for t in teachers]} if num_teachers > 1 else {},
                     "distillation": {"teacher": "ensemble" if num_teachers > 1 else "teacher_0",
                                      "scratch": "student_scratch", "distilled": "student_distilled"}}),
        ),
    )


PIPELINE = build()
