"""Small helpers the test modules share. They live here, not in conftest.py: pytest imports conftest as
`conftest`, so `from tests.conftest import ...` would run it a second time, and a second run starts a new
session HPML_HOME in the middle of the session."""

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
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


def doc_blocks(path: Path, language: str) -> list[str]:
    """The fenced code blocks of a doc in `language` ("" for plain blocks)."""
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def quickstart_csv(folder: Path) -> Path:
    """Runs the quickstart's own CSV generator (the heredoc in its step 2) in `folder`."""
    step = next(block for block in doc_blocks(REPO / "docs" / "quickstart.md", "") if "customers.csv" in block
                and "<<'EOF'" in block)
    script = step.split("<<'EOF'\n", 1)[1].rsplit("EOF", 1)[0]
    subprocess.run([sys.executable, "-c", script], cwd=folder, check=True)
    return folder / "customers.csv"


@contextlib.contextmanager
def store_env(env: dict):
    """This process's environment with `env` on top (an object store's settings), put back afterwards."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def served_weights(model: str) -> dict:
    """{variable: value} of a Model artifact's serving SavedModel (local, gs://, or s3:// through a local copy)."""
    import tensorflow as tf

    from hpml.components import files

    reader = tf.train.load_checkpoint(f"{files.tf_readable(model)}/Format-Serving/variables/variables")
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if key.endswith("VARIABLE_VALUE") and "save_counter" not in key}


def assert_same_weights(resumed: dict, uninterrupted: dict) -> None:
    """Every variable equal, bit for bit; and there are trained kernels among them."""
    import numpy as np

    assert sorted(resumed) == sorted(uninterrupted)
    assert [key for key in uninterrupted if "kernel" in key], sorted(uninterrupted)
    for key, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)
