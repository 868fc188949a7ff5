"""Small helpers the test modules share. They live here, not in conftest.py: pytest imports conftest as
`conftest`, so `from tests.conftest import ...` would run it a second time, and a second run starts a new
session HPML_HOME in the middle of the session."""

TINY_EPOCHS = 3  # epochs of the shared penguin DAG run


def write_csv(path, header: str, rows: list[str]) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(header + "\n" + "".join(r + "\n" for r in rows))
    return str(path)


def trainer_inputs(pipeline_outputs) -> dict:
    """The Trainer's inputs from a pipeline run's outputs: transformed examples, transform graph, schema."""
    return {"examples": pipeline_outputs["Transform"]["transformed_examples"],
            "transform_graph": pipeline_outputs["Transform"]["transform_graph"],
            "schema": pipeline_outputs["ExampleGen"]["schema"]}


def trainer_outputs(tmp_path, name: str) -> dict:
    """Fresh Model and ModelRun URIs under tmp_path/name."""
    return {"model": str(tmp_path / name / "model"), "model_run": str(tmp_path / name / "model_run")}
