"""`hpml init` on CSVs of other shapes: the files it writes, the task it picks, and real runs of what it wrote."""
import csv
import dataclasses
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from hpml.components.errors import InputDataError, SpecError
from hpml.pipelines import scaffold

HPML = [sys.executable, "-m", "hpml.pipelines.cli"]
REPO = Path(__file__).resolve().parents[1]


def _write(path: Path, header: list[str], rows: list[list]) -> str:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def _hpml(*args, cwd, **env):
    return subprocess.run([*HPML, *args], capture_output=True, text=True, timeout=900, cwd=cwd,
                          env=dict(os.environ, COLUMNS="200", **env))


def _species_csv(path: Path, rows: int = 240, header=("size", "colour", "kind")) -> str:
    """Two features only, a text label, and missing values in both features."""
    rng = random.Random(7)
    data = []
    for i in range(rows):
        kind = rng.choice(["small", "large"])
        size = rng.gauss(1.0 if kind == "small" else 3.0, 0.3)
        colour = rng.choice(["red", "blue"]) if kind == "small" else rng.choice(["blue", "green"])
        data.append(["" if i % 11 == 0 else round(size, 3), "NA" if i % 13 == 0 else colour, kind])
    return _write(path, list(header), data)


def _prices_csv(path: Path, rows: int = 300) -> str:
    """Many columns (ten numbers, two texts, one always empty) and a real-valued label: a regression."""
    rng = random.Random(3)
    header = [f"x{i}" for i in range(10)] + ["city", "kind", "notes", "price"]
    data = []
    for i in range(rows):
        xs = [round(rng.uniform(0, 10), 2) for _ in range(10)]
        city = rng.choice(["Oslo", "Bergen", "Tromso"])
        price = 1000 * xs[0] + 500 * xs[1] + (8000 if city == "Oslo" else 0) + 20000 + rng.gauss(0, 300)
        data.append([*xs, city if i % 9 else "", rng.choice(["flat", "house"]), "", round(price, 2)])
    return _write(path, header, data)


def test_the_column_kinds_and_the_task_come_from_the_csv(tmp_path):
    species = scaffold.profile_csv(_species_csv(tmp_path / "species.csv"), "kind")
    assert (species.task, species.numeric, species.categorical, species.classes) == \
        ("classification", ("size",), ("colour",), ("large", "small"))
    prices = scaffold.profile_csv(_prices_csv(tmp_path / "prices.csv"), "price")
    assert prices.task == "regression" and prices.numeric == tuple(f"x{i}" for i in range(10))
    assert prices.categorical == ("city", "kind") and prices.empty == ("notes",) and prices.rows == 300
    # Whole numbers with few values are classes; with many, or with --task, a regression.
    few = _write(tmp_path / "few.csv", ["a", "grade"], [[i * 0.5, i % 3] for i in range(30)])
    assert scaffold.profile_csv(few, "grade").task == "classification"
    assert scaffold.profile_csv(few, "grade").classes == ("0", "1", "2")
    assert scaffold.profile_csv(few, "grade", task="regression").task == "regression"
    many = _write(tmp_path / "many.csv", ["a", "count"], [[i, i * 7] for i in range(60)])
    assert scaffold.profile_csv(many, "count").task == "regression"


@pytest.mark.parametrize("header, rows, label, task, error, message", [
    (["a", "b"], [[1, 2]], "c", None, SpecError, "--label 'c' is not a column of"),
    (["a", "label"], [[1, "x"], [2, "x"]], "label", None, InputDataError, "label 'label' has one value ('x')"),
    (["a", "label"], [[1, "x"], [2, "y"]], "label", "regression", InputDataError, "holds text (e.g. 'x')"),
    (["a", "label"], [[1, ""], [2, "NA"]], "label", None, InputDataError, "label 'label' has no value in any row"),
    (["a", "a", "label"], [[1, 1, "x"]], "label", None, InputDataError, "column(s) 'a' appear more than once"),
    (["a", "label"], [], "label", None, InputDataError, "has a header but no data rows"),
])
def test_a_csv_hpml_init_cannot_use_is_refused_with_the_reason(tmp_path, header, rows, label, task, error,
                                                                message):
    path = _write(tmp_path / "data.csv", header, rows)
    with pytest.raises(error) as err:
        scaffold.init_project("mine", path, label, directory=str(tmp_path), task=task)
    assert message in str(err.value)
    assert not (tmp_path / "mine").exists(), "nothing is written for a CSV that is refused"


def test_a_ragged_row_is_named_by_its_line(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text('a,b,label\n1,"two\nlines",x\n3,4\n', encoding="utf-8")
    with pytest.raises(InputDataError, match=r"ragged\.csv:4: expected 3 fields, got 2"):
        scaffold.profile_csv(str(path), "label")


@pytest.mark.parametrize("text, message", [
    ('a,b,label\n1,2,x\n3,"4,y\n5,6,x\n7,8,y\n', ':3: a quoted value opened on this line is never closed'),
    ('a,b,label\n1,2,x\n3,4\x005,y\n', ':3: the row holds a NUL byte'),
])
def test_an_unclosed_quote_and_a_nul_byte_are_named_where_they_are(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputDataError, match=message):
        scaffold.profile_csv(str(path), "label")


def test_column_names_that_cannot_name_features_are_mapped_and_the_mapping_is_written(tmp_path):
    path = _write(tmp_path / "data.csv", ["Body size (cm)", "colour", "Größe", "colour!", "Kind?"],
                  [[1.5, "red", 2, "x", "a"], [2.5, "blue", 3, "y", "b"]])
    profile, written = scaffold.init_project("mine", path, "Kind?", directory=str(tmp_path))
    assert profile.renamed == (("Body size (cm)", "Body_size_cm"), ("Größe", "Gro_e"), ("colour!", "colour_2"),
                               ("Kind?", "Kind"))
    assert (profile.label, profile.numeric, profile.categorical) == ("Kind", ("Body_size_cm", "Gro_e"),
                                                                     ("colour", "colour_2"))
    module = Path(written["module"]).read_text(encoding="utf-8")
    assert "CSV_COLUMN_NAMES = {\n    'Body size (cm)': 'Body_size_cm',\n" in module
    from hpml.v1 import load_pipeline

    pipeline = load_pipeline(written["pipeline"])
    example_gen = next(node for node in pipeline.nodes if node.id == "ExampleGen")
    params = example_gen.params({"data_path": path, "skip_bad_rows": False, "encoding": "utf-8"})
    assert params["rename_columns"] == dict(profile.renamed) and params["required_columns"] == ["Kind"]


def test_init_refuses_to_overwrite_and_a_bad_name(tmp_path):
    path = _species_csv(tmp_path / "species.csv")
    _, written = scaffold.init_project("species", path, "kind", directory=str(tmp_path))
    assert sorted(written) == ["dag", "module", "pipeline"] and all(os.path.isfile(p) for p in written.values())
    with pytest.raises(SpecError, match="already exist") as err:
        scaffold.init_project("species", path, "kind", directory=str(tmp_path))
    assert "--force" in err.value.hint
    scaffold.init_project("species", path, "kind", directory=str(tmp_path), force=True)
    for bad in ("1st", "my pipeline", "a/b", ""):
        with pytest.raises(SpecError, match="pipeline name"):
            scaffold.init_project(bad, path, "kind", directory=str(tmp_path))


def test_the_penguin_example_module_is_what_hpml_init_writes_for_penguins_csv():
    """The bundled example is the template rendered for penguins.csv (its `year` column left out)."""
    from hpml.examples.penguin.pipeline import penguins_csv

    profile = scaffold.profile_csv(penguins_csv(), "species")
    profile = dataclasses.replace(profile, numeric=tuple(n for n in profile.numeric if n != "year"))
    expected = scaffold.render_module(profile, "penguin", "penguins.csv")
    assert (REPO / "examples" / "penguin" / "module.py").read_text(encoding="utf-8") == expected


def test_the_penguin_example_pipeline_is_the_one_hpml_init_writes_for_penguins_csv(tmp_path):
    """The bundled pipeline differs from the template only in where its module and data come from (a package, not
    files beside it) and its wording: the same nodes, wired alike, given the same parameters for the same run."""
    from hpml.examples.penguin import pipeline as penguin
    from hpml.pipelines import discovery

    profile = scaffold.profile_csv(penguin.penguins_csv(), "species")
    profile = dataclasses.replace(profile, numeric=tuple(n for n in profile.numeric if n != "year"))
    (tmp_path / "penguin").mkdir()
    (tmp_path / "penguin" / "pipeline.py").write_text(scaffold.render_pipeline(profile, "penguin"))
    written = discovery.load(str(tmp_path / "penguin" / "pipeline.py") + ":PIPELINE")
    bundled = penguin.PIPELINE
    assert [(n.id, n.component.name, dict(n.inputs)) for n in written.nodes] == \
        [(n.id, n.component.name, dict(n.inputs)) for n in bundled.nodes]
    assert written.params_schema == bundled.params_schema and written.param_checks == bundled.param_checks
    run = bundled.validate({"epochs": 3, "strategy": "one_device", "steps_per_execution": 4})
    same_module = {str(tmp_path / "penguin" / "module.py"): penguin.MODULE}
    for mine, theirs in zip(written.nodes, bundled.nodes):
        params = {key: same_module.get(value, value) if isinstance(value, str) else value
                  for key, value in mine.params(run).items()}
        if "required_features" in params:  # the same columns, listed in another order
            params["required_features"] = sorted(params["required_features"])
            assert sorted(theirs.params(run)["required_features"]) == params["required_features"]
            params["required_features"] = theirs.params(run)["required_features"]
        assert params == dict(theirs.params(run)), mine.id


def test_hpml_init_then_hpml_run_trains_a_classifier_that_serves(tmp_path):
    """A user's flow, by the command line: init in a folder, run from it, serve raw tf.Examples."""
    import tensorflow as tf

    work = tmp_path / "work"
    work.mkdir()
    data = _species_csv(work / "species.csv", header=("Body size (cm)", "colour", "Kind?"))
    done = _hpml("init", "species", "--csv", data, "--label", "Kind?", cwd=work)
    assert done.returncode == 0, done.stderr
    assert "species: classification of 'Kind' (2 classes) from 1 numeric and 1 text column(s), 240 rows" in done.stdout
    assert "features renamed (their column names cannot name a feature): 'Body size (cm)' -> Body_size_cm, " \
        "'Kind?' -> Kind" in done.stdout
    assert "next: hpml run species" in done.stdout
    run = _hpml("run", "species", "--param", "epochs=8", "--param", "learning_rate=0.05", cwd=work,
                HPML_DATA_ROOTS=str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    accuracy = float(next(line for line in run.stdout.splitlines() if line.startswith("eval: "))
                     .split("accuracy=")[1].split()[0])
    assert accuracy > 0.85, run.stdout
    model_dir = next(line.split("artifacts: ")[1] for line in run.stdout.splitlines() if line.startswith("artifacts: "))
    served = tf.saved_model.load(os.path.join(model_dir, "Trainer", "model", "Format-Serving"))
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "Body_size_cm": tf.train.Feature(float_list=tf.train.FloatList(value=[size])),
        "colour": tf.train.Feature(bytes_list=tf.train.BytesList(value=[colour.encode()]))})).SerializeToString()
        for size, colour in ((1.0, "red"), (3.1, "green"))]
    out = served.signatures["serving_default"](examples=tf.constant(examples))
    assert [c.decode() for c in out["classes"].numpy()] == ["small", "large"]


def test_a_generated_regression_pipeline_runs_locally_and_its_dag_file_loads(tmp_path, monkeypatch, airflow_db):
    """More columns, an empty column and a real-valued label; the run goes through hpml.v1 as a notebook would,
    and Airflow's DagBag imports the DAG file that init wrote into a dags_folder."""
    import tensorflow as tf

    from hpml.pipelines import records, shipping
    from hpml.v1 import load_pipeline, run_local

    monkeypatch.setenv("HPML_DATA_ROOTS", str(tmp_path))
    data = _prices_csv(tmp_path / "prices.csv")
    dags = tmp_path / "dags"
    profile, written = scaffold.init_project("prices", data, "price", directory=str(tmp_path),
                                             dags_folder=str(dags))
    assert profile.task == "regression" and profile.empty == ("notes",)
    assert written["dag"] == str(dags / "prices.py")
    pipeline = load_pipeline(written["pipeline"])
    context = run_local(pipeline, {"epochs": 25, "learning_rate": 0.05, "batch_size": 16})
    summary = records.load(context.mlflow_run_id)
    assert list(summary.durations) == ["ExampleGen", "Transform", "Trainer", "Gate", "Pusher"]
    labels = [float(row["price"]) for row in csv.DictReader(open(data, encoding="utf-8"))]
    spread = (sum((v - sum(labels) / len(labels)) ** 2 for v in labels) / len(labels)) ** 0.5
    assert summary.eval_metrics["mae"] < 0.25 * spread, (summary.eval_metrics, spread)
    # The gate scores the regressor through its serving signature on the raw eval split: the Trainer's own eval
    # numbers, and an R^2 well above the threshold of predicting the mean; the model is pushed as version 1.
    shipped = shipping.outcome(summary.outputs)
    (check,) = shipped["gate"]["checks"]
    scores = shipped["gate"]["scores"]["candidate"]
    assert check["metric"] == "r2" and check["threshold"] == 0.0 and shipped["gate"]["blessed"], shipped
    assert scores["loss"] == pytest.approx(summary.eval_metrics["loss"], rel=1e-3)
    assert scores["mae"] == pytest.approx(summary.eval_metrics["mae"], rel=1e-3)
    assert 0.5 < scores["r2"] < 1, scores
    assert shipped["push"]["pushed"] and shipped["push"]["version"] == 1
    # One epoch at a learning rate that leaves the network untrained predicts about the mean: not blessed.
    worse = records.load(run_local(pipeline, {"epochs": 1, "learning_rate": 1e-6, "batch_size": 16}).mlflow_run_id)
    held = shipping.outcome(worse.outputs)
    assert not held["gate"]["blessed"] and held["gate"]["champion"]["version"] == 1, held
    assert held["gate"]["scores"]["candidate"]["r2"] < scores["r2"] - 0.01
    assert held["gate"]["scores"]["champion"] == pytest.approx(scores, rel=1e-6)
    assert not held["push"]["pushed"] and "r2" in shipping.describe(held)
    served = tf.saved_model.load(os.path.join(summary.outputs["Trainer"]["model"], "Format-Serving"))
    feature = {f"x{i}": tf.train.Feature(float_list=tf.train.FloatList(value=[5.0])) for i in range(10)}
    feature["city"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"Oslo"]))
    feature["kind"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"flat"]))
    example = tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
    predicted = float(served.signatures["serving_default"](examples=tf.constant([example]))["predictions"][0])
    assert abs(predicted - (1000 * 5 + 500 * 5 + 8000 + 20000)) < spread, predicted

    from hpml.pipelines.airflow import local as airflow_local

    airflow_local.configure()
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dags))
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag("prices")
    assert [t.task_id for t in dag.tasks] == ["start_run", "ExampleGen", "Transform", "Trainer", "Gate", "Pusher",
                                                "finish_run"]
    assert dag.params["data_path"] == str(Path(data).resolve()) and dag.params["gate_min_r2"] == 0.0


def test_a_project_folder_is_found_by_its_path_from_anywhere(tmp_path, monkeypatch):
    """`hpml init --dir` writes the folder elsewhere; `hpml run path/to/NAME` then finds it, as the help says."""
    from hpml.pipelines import discovery

    data = _species_csv(tmp_path / "species.csv")
    done = _hpml("init", "species", "--csv", data, "--label", "kind", "--dir", str(tmp_path / "projects"),
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    absolute, reference = discovery.resolve(str(tmp_path / "projects" / "species"))
    relative, _ = discovery.resolve(os.path.join("..", "projects", "species") + ":PIPELINE")
    assert absolute.name == relative.name == "species"
    assert reference == f"{tmp_path / 'projects' / 'species' / 'pipeline.py'}:PIPELINE"  # what its DAG file names
    with pytest.raises(SpecError, match="unknown pipeline"):
        discovery.resolve(str(elsewhere))  # a folder without pipeline.py


def test_an_unknown_pipeline_names_the_ways_to_find_one(tmp_path):
    done = _hpml("run", "nosuch", cwd=tmp_path)
    assert done.returncode == 2
    assert "error: unknown pipeline 'nosuch'" in done.stderr and "hpml init nosuch --csv FILE" in done.stderr
