"""hpml inside a real TFX 1.16 (Python 3.10, run by `make test-tfx`): hpml's user modules in TFX's own Transform
and Trainer, TFX's own example module in hpml's Trainer, hpml's components in a TFX pipeline on LocalDagRunner
with MLMD on SQLite, and the same components compiled for Kubeflow V2 / Vertex AI Pipelines.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import tensorflow as tf
import tensorflow_model_analysis as tfma
from ml_metadata.metadata_store import metadata_store
from tfx import v1 as tfx

from hpml.components.artifacts import EVAL_METRICS_FILE
from hpml.components.errors import SpecError
from hpml.components.input_pipeline.spec import SPEC_FILE as INPUT_PIPELINE_SPEC_FILE
from hpml.examples.penguin.pipeline import penguins_csv
from hpml.v1 import EXAMPLE_GEN, TRAINER, TRANSFORM
from hpml.v1 import tfx as hpml_tfx
from tests.helpers import REPO, doc_blocks, quickstart_csv

SPECIES = {"Adelie": 0, "Chinstrap": 1, "Gentoo": 2}


def _cleaned_penguins(folder: Path) -> Path:
    """penguins.csv as a TFX user feeds CsvExampleGen: "NA" written as an empty (missing) cell."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(penguins_csv(), newline="") as source, open(folder / "penguins.csv", "w", newline="") as target:
        writer = csv.writer(target)
        for row in csv.reader(source):
            writer.writerow(["" if value == "NA" else value for value in row])
    return folder / "penguins.csv"


def _raw_examples(path: Path, label: str, types: dict[str, str]) -> tuple[list[bytes], list[str]]:
    """Serialized raw tf.Examples of the CSV's complete rows (the label left out), and their labels."""
    examples, labels = [], []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if any(row[name] == "" for name in types) or row[label] == "":
                continue
            feature = {}
            for name, kind in types.items():
                if kind == "float":
                    feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(row[name])]))
                elif kind == "int":
                    feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(row[name])]))
                else:
                    feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[row[name].encode()]))
            examples.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            labels.append(row[label])
    return examples, labels


PENGUIN_RAW_TYPES = {"island": "str", "bill_length_mm": "float", "bill_depth_mm": "float",
                     "flipper_length_mm": "int", "body_mass_g": "int", "sex": "str", "year": "int"}


def _accuracy_of_served_classes(model_dir: str, examples: list[bytes], labels: list[str]) -> float:
    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    classes = serve(examples=tf.constant(examples))["classes"].numpy().astype(str)
    return sum(c == label for c, label in zip(classes, labels)) / len(labels)


def _evaluator_and_pusher(examples, model, serving_dir: Path):
    """TFX's Evaluator (TFMA, reading the transformed label) with a blessing threshold, and TFX's Pusher."""
    eval_config = tfma.EvalConfig(
        model_specs=[tfma.ModelSpec(signature_name="serving_default", label_key="species",
                                    preprocessing_function_names=["transform_features"],
                                    prediction_key="probabilities")],
        slicing_specs=[tfma.SlicingSpec()],
        metrics_specs=[tfma.MetricsSpec(metrics=[tfma.MetricConfig(
            class_name="SparseCategoricalAccuracy",
            threshold=tfma.MetricThreshold(value_threshold=tfma.GenericValueThreshold(lower_bound={"value": 0.8})))])])
    evaluator = tfx.components.Evaluator(examples=examples, model=model, eval_config=eval_config)
    pusher = tfx.components.Pusher(
        model=model, model_blessing=evaluator.outputs["blessing"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=str(serving_dir))))
    return evaluator, pusher


def _run(name: str, root: Path, components) -> str:
    """Run the components on LocalDagRunner with MLMD on SQLite; the MLMD database's path."""
    database = str(root / "mlmd.sqlite")
    pipeline = tfx.dsl.Pipeline(
        pipeline_name=name, pipeline_root=str(root / "pipeline"), components=components,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(database))
    tfx.orchestration.LocalDagRunner().run(pipeline)
    return database


def _store(database: str) -> metadata_store.MetadataStore:
    return metadata_store.MetadataStore(tfx.orchestration.metadata.sqlite_metadata_connection_config(database))


def _blessed(store) -> bool:
    (blessing,) = store.get_artifacts_by_type("ModelBlessing")
    return blessing.custom_properties["blessed"].int_value == 1


def _pushed_model_dir(store) -> str:
    (pushed,) = store.get_artifacts_by_type("PushedModel")
    assert pushed.custom_properties["pushed"].int_value == 1
    return pushed.custom_properties["pushed_destination"].string_value


def _upstream_executions(store, artifact_id: int) -> set[str]:
    """The type names of every execution in the artifact's lineage, walking MLMD's events back to the sources."""
    types = {t.id: t.name for t in store.get_execution_types()}
    seen_artifacts, seen_executions, found = set(), set(), set()
    frontier = [artifact_id]
    while frontier:
        artifact = frontier.pop()
        if artifact in seen_artifacts:
            continue
        seen_artifacts.add(artifact)
        for event in store.get_events_by_artifact_ids([artifact]):
            if event.type != event.OUTPUT or event.execution_id in seen_executions:
                continue
            seen_executions.add(event.execution_id)
            (execution,) = store.get_executions_by_id([event.execution_id])
            found.add(types[execution.type_id])
            frontier += [e.artifact_id for e in store.get_events_by_execution_ids([execution.id])
                         if e.type == e.INPUT]
    return found


def _tfx_transform_and_trainer(data: Path, module: str, **trainer_args) -> list:
    """TFX's own CsvExampleGen, StatisticsGen, SchemaGen, Transform and Trainer, with `module` as the module_file
    of the last two; TrainArgs and EvalArgs of 0 steps (a pass over the data)."""
    example_gen = tfx.components.CsvExampleGen(input_base=str(data.parent))
    statistics = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema = tfx.components.SchemaGen(statistics=statistics.outputs["statistics"])
    transform = tfx.components.Transform(examples=example_gen.outputs["examples"], schema=schema.outputs["schema"],
                                         module_file=module)
    trainer = tfx.components.Trainer(
        module_file=module, examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"], schema=schema.outputs["schema"],
        train_args=tfx.proto.TrainArgs(num_steps=0), eval_args=tfx.proto.EvalArgs(num_steps=0), **trainer_args)
    return [example_gen, statistics, schema, transform, trainer]


def test_a_module_hpml_init_writes_runs_in_tfx_s_own_transform_and_trainer_and_the_pushed_model_serves(tmp_path):
    """CsvExampleGen -> StatisticsGen -> SchemaGen -> TFX Transform and Trainer with the module `hpml init` writes
    for penguins.csv (TFX's FnArgs: working_dir None, train_steps None, custom_config) -> hpml's Gate -> TFX's
    Pusher."""
    from hpml.pipelines import scaffold

    data = _cleaned_penguins(tmp_path / "data")
    _, written = scaffold.init_project("penguins", str(data), "species", directory=str(tmp_path / "project"))
    components = _tfx_transform_and_trainer(data, written["module"], custom_config={"strategy": "mirrored"})
    example_gen, schema, trainer = components[0], components[2], components[-1]
    # hpml's Gate follows TFX's Trainer, and TFX's Pusher follows hpml's Gate.
    gate = hpml_tfx.Gate(examples=example_gen.outputs["examples"], schema=schema.outputs["schema"],
                         model=trainer.outputs["model"], label_key="species", thresholds={"accuracy": 0.8})
    pusher = tfx.components.Pusher(
        model=trainer.outputs["model"], model_blessing=gate.outputs["blessing"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=str(tmp_path / "serving"))))
    database = _run("hpml_module_in_tfx", tmp_path, [*components, gate, pusher])

    store = _store(database)
    assert _blessed(store)
    (blessing,) = store.get_artifacts_by_type("ModelBlessing")
    assert sorted(os.listdir(blessing.uri)) == ["BLESSED", "gate.json"]
    examples, labels = _raw_examples(data, "species", PENGUIN_RAW_TYPES)
    assert _accuracy_of_served_classes(_pushed_model_dir(store), examples, labels) > 0.9
    (model_run,) = store.get_artifacts_by_type("ModelRun")
    metrics = json.loads(Path(model_run.uri, EVAL_METRICS_FILE).read_text())  # hpml's kit wrote it under TFX
    assert metrics["accuracy"] > 0.9


def test_the_bundled_distillation_module_runs_in_tfx_s_own_transform_and_trainer(tmp_path):
    """The digits module (teacher or student, by its hyperparameters) as TFX's module_file; without teachers in
    its FnArgs it trains a plain model, and the pushed model serves raw tf.Examples."""
    import shutil

    from hpml.examples.distillation.pipeline import LABEL, PIXELS, digits_csv, ensure_digits_csv

    (tmp_path / "data").mkdir()
    data = Path(shutil.copy(ensure_digits_csv(digits_csv()), tmp_path / "data" / "digits.csv"))
    components = _tfx_transform_and_trainer(data, str(REPO / "examples" / "distillation" / "module.py"))
    pusher = tfx.components.Pusher(
        model=components[-1].outputs["model"], push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=str(tmp_path / "serving"))))
    store = _store(_run("digits_module_in_tfx", tmp_path, [*components, pusher]))

    examples, labels = _raw_examples(data, LABEL, {name: "int" for name in PIXELS})
    assert _accuracy_of_served_classes(_pushed_model_dir(store), examples, labels) > 0.9


def test_tfx_s_own_penguin_module_trains_in_hpml_s_trainer_and_serves(tmp_path):
    """tfx/examples/penguin/penguin_utils_keras.py, unchanged, as the module of hpml's Transform and Trainer, on
    TFX's penguin columns (culmen_*, an integer species)."""
    rows = []
    with open(penguins_csv(), newline="") as handle:
        for row in csv.DictReader(handle):
            values = [row["bill_length_mm"], row["bill_depth_mm"], row["flipper_length_mm"], row["body_mass_g"]]
            if "NA" not in values:
                rows.append([SPECIES[row["species"]], *values])
    data = tmp_path / "penguins_processed.csv"
    columns = ["species", "culmen_length_mm", "culmen_depth_mm", "flipper_length_mm", "body_mass_g"]
    with open(data, "w", newline="") as handle:
        csv.writer(handle).writerows([columns, *rows])
    module = "tfx.examples.penguin.penguin_utils_keras"
    uri = {name: str(tmp_path / name) for name in
           ("examples", "schema", "transform_graph", "transformed", "input_pipeline", "model", "model_run")}

    EXAMPLE_GEN.run({}, {"examples": uri["examples"], "schema": uri["schema"]}, {"input_path": str(data)})
    TRANSFORM.run({"examples": uri["examples"], "schema": uri["schema"]},
                  {"transform_graph": uri["transform_graph"], "transformed_examples": uri["transformed"],
                   "input_pipeline": uri["input_pipeline"]}, {"module": module})
    # TFX's module repeats its data and reads steps_per_epoch from train_steps, as TFX's TrainArgs give them.
    TRAINER.run({"examples": uri["transformed"], "transform_graph": uri["transform_graph"],
                 "schema": uri["schema"], "input_pipeline": uri["input_pipeline"]},
                {"model": uri["model"], "model_run": uri["model_run"]},
                {"module": module, "train_steps": 300, "eval_steps": 5, "strategy": "mirrored"})

    types = {name: "float" for name in columns[1:3]} | {name: "int" for name in columns[3:]}
    examples, labels = _raw_examples(data, "species", types)
    serve = tf.saved_model.load(os.path.join(uri["model"], "Format-Serving")).signatures["serving_default"]
    logits = serve(examples=tf.constant(examples))["outputs"].numpy()
    accuracy = sum(int(p) == int(label) for p, label in zip(logits.argmax(axis=1), labels)) / len(labels)
    assert accuracy > 0.9
    assert os.listdir(uri["model_run"]), "TFX's module writes its TensorBoard logs to model_run_dir"


def test_hpml_transform_and_trainer_run_as_tfx_components_between_tfx_s_own(tmp_path):
    """TFX's CsvExampleGen, StatisticsGen, SchemaGen -> hpml's Transform (with its tuned InputPipeline) -> hpml's
    Trainer (mirrored over the logical CPUs) -> TFX's Evaluator -> TFX's Pusher, lineage in MLMD throughout."""
    data = _cleaned_penguins(tmp_path / "data")
    module = str(REPO / "examples" / "penguin" / "module.py")
    example_gen = tfx.components.CsvExampleGen(input_base=str(data.parent))
    statistics = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema = tfx.components.SchemaGen(statistics=statistics.outputs["statistics"])
    transform = hpml_tfx.Transform(examples=example_gen.outputs["examples"], schema=schema.outputs["schema"],
                                   module=module)
    trainer = hpml_tfx.Trainer(examples=transform.outputs["transformed_examples"],
                               transform_graph=transform.outputs["transform_graph"],
                               input_pipeline=transform.outputs["input_pipeline"], module=module,
                               strategy="mirrored", hyperparameters={"epochs": 10, "batch_size": 32})
    evaluator, pusher = _evaluator_and_pusher(example_gen.outputs["examples"], trainer.outputs["model"],
                                              tmp_path / "serving")
    # The same Trainer as a GPipe schedule over two stages, and as two worker processes from the local launcher.
    transformed = {"examples": transform.outputs["transformed_examples"],
                   "transform_graph": transform.outputs["transform_graph"]}
    gpipe = hpml_tfx.Trainer(**transformed, module=module, strategy="gpipe",
                             hyperparameters={"epochs": 2, "pipeline_stages": 2, "micro_batches": 4}).with_id("GPipe")
    workers = hpml_tfx.Trainer(**transformed, module=module, strategy="multi_worker_mirrored", num_workers=2,
                               hyperparameters={"epochs": 2}).with_id("TwoWorkers")
    # hpml's Pusher follows TFX's Evaluator too.
    hpml_pusher = hpml_tfx.Pusher(model=trainer.outputs["model"], model_blessing=evaluator.outputs["blessing"],
                                  destination=str(tmp_path / "hpml-serving")).with_id("HpmlPusher")
    database = _run("mixed", tmp_path, [example_gen, statistics, schema, transform, trainer, evaluator, pusher,
                                        hpml_pusher, gpipe, workers])

    store = _store(database)
    assert _blessed(store)
    pushed_by = {Path(a.uri).parts[-3]: a for a in store.get_artifacts_by_type("PushedModel")}
    assert pushed_by["HpmlPusher"].custom_properties["pushed"].int_value == 1
    assert pushed_by["HpmlPusher"].custom_properties["pushed_version"].string_value == "1"
    assert os.listdir(tmp_path / "hpml-serving") == ["1"]
    pushed = pushed_by["Pusher"]
    assert _upstream_executions(store, pushed.id) >= {
        "tfx.components.example_gen.csv_example_gen.component.CsvExampleGen",
        "tfx.components.schema_gen.component.SchemaGen", "tfx.components.statistics_gen.component.StatisticsGen",
        "hpml.pipelines.tfx.components.Transform", "hpml.pipelines.tfx.components.Trainer",
        "tfx.components.evaluator.component.Evaluator", "tfx.components.pusher.component.Pusher"}
    (input_pipeline,) = store.get_artifacts_by_type("hpml.InputPipeline")
    assert Path(input_pipeline.uri, INPUT_PIPELINE_SPEC_FILE).is_file()
    (transformed,) = [a for a in store.get_artifacts_by_type("Examples") if "transformed" in a.uri]
    assert json.loads(transformed.properties["split_names"].string_value) == ["eval", "train"]
    properties = {}
    for model in store.get_artifacts_by_type("Model"):
        producer = Path(model.uri).parts[-3]  # <pipeline_root>/<component id>/model/<execution id>
        properties[producer] = json.loads(model.custom_properties[hpml_tfx.PROPERTIES_KEY].string_value)
    assert properties["Trainer"]["plan"]["strategy"] == "mirrored" and len(properties["Trainer"]["history"]) == 10
    assert properties["GPipe"]["gpipe"]["num_stages"] == 2 and len(properties["GPipe"]["history"]) == 2
    two_workers = properties["TwoWorkers"]
    assert two_workers["plan"]["strategy"] == "multi_worker_mirrored" and two_workers["plan"]["cluster"]["workers"] == 2
    assert two_workers["launch"]["restarts"] == 0 and len(two_workers["history"]) == 2
    examples, labels = _raw_examples(data, "species", PENGUIN_RAW_TYPES)
    assert _accuracy_of_served_classes(pushed.custom_properties["pushed_destination"].string_value, examples,
                                       labels) > 0.9
    assert _accuracy_of_served_classes(str(tmp_path / "hpml-serving" / "1"), examples, labels) > 0.9


def test_every_hpml_component_runs_in_a_tfx_pipeline_that_distils_two_teachers(tmp_path):
    """hpml's ExampleGen -> Transform -> two teacher Trainers -> SoftTargets -> a distilled student Trainer ->
    hpml's Evaluator, on LocalDagRunner; several Models reach one input through a channel union, in order."""
    from tfx.types.channel import union

    from hpml.examples.distillation.pipeline import LABEL, MODULE, PIXELS, digits_csv, ensure_digits_csv

    def hyperparameters(hidden, seed):
        return {"hidden": hidden, "epochs": 4, "batch_size": 64, "seed": seed, "dropout": 0.0,
                "shift_augment": False, "learning_rate": 0.01, "activation": "relu"}

    example_gen = hpml_tfx.ExampleGen(input_path=ensure_digits_csv(digits_csv()), required_columns=[LABEL],
                                      numeric_columns=[LABEL, *PIXELS])
    transform = hpml_tfx.Transform(examples=example_gen.outputs["examples"], schema=example_gen.outputs["schema"],
                                   module=MODULE)
    transformed = {"examples": transform.outputs["transformed_examples"],
                   "transform_graph": transform.outputs["transform_graph"]}
    teachers = [hpml_tfx.Trainer(**transformed, module=MODULE, hyperparameters=hyperparameters([128, 128], i))
                .with_id(f"Teacher_{i}") for i in range(2)]
    teacher_models = union([t.outputs["model"] for t in teachers])
    soft_targets = hpml_tfx.SoftTargets(**transformed, teachers=teacher_models, label_key=LABEL, temperature=4.0)
    student = hpml_tfx.Trainer(examples=soft_targets.outputs["soft_target_examples"],
                               transform_graph=transform.outputs["transform_graph"], teachers=teacher_models,
                               module=MODULE, hyperparameters=hyperparameters([16], 0), mode="distill",
                               temperature=4.0, alpha=0.5, soft_targets="precomputed").with_id("Student")
    evaluator = hpml_tfx.Evaluator(
        examples=example_gen.outputs["examples"],
        models=union([*[t.outputs["model"] for t in teachers], student.outputs["model"]]),
        label_key=LABEL, model_names=["teacher_0", "teacher_1", "student"],
        ensembles={"ensemble": ["teacher_0", "teacher_1"]}, latency_repeats=1)
    database = _run("distillation", tmp_path, [example_gen, transform, *teachers, soft_targets, student, evaluator])

    store = _store(database)
    (evaluation,) = store.get_artifacts_by_type("ModelEvaluation")
    rows = {row["name"]: row for row in json.loads(Path(evaluation.uri, "results.json").read_text())["rows"]}
    assert list(rows) == ["teacher_0", "teacher_1", "ensemble", "student"]
    # In the order given: the two wide teachers first, the narrow student last.
    assert rows["teacher_0"]["params"] == rows["teacher_1"]["params"] > 10 * rows["student"]["params"]
    assert all(row["accuracy"] > 0.8 for row in rows.values()), rows
    (student_model,) = [m for m in store.get_artifacts_by_type("Model") if "/Student/" in m.uri]
    distillation = json.loads(student_model.custom_properties[hpml_tfx.PROPERTIES_KEY].string_value)["distillation"]
    assert distillation["temperature"] == 4.0 and len(distillation["teachers"]) == 2
    (soft,) = [a for a in store.get_artifacts_by_type("Examples") if "/SoftTargets/" in a.uri]
    assert json.loads(soft.properties["split_names"].string_value) == ["eval", "train"]


def test_a_pipeline_of_hpml_components_compiles_for_vertex_ai_pipelines(tmp_path):
    """KubeflowV2DagRunner compiles it into a PipelineJob whose spec parses as Kubeflow's PipelineSpec; hpml's
    executors run there from the image named, with each parameter as the JSON it is checked from."""
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2
    from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner

    example_gen = hpml_tfx.ExampleGen(input_path="/mnt/shared/penguins.csv", required_columns=["species"])
    transform = hpml_tfx.Transform(examples=example_gen.outputs["examples"], schema=example_gen.outputs["schema"],
                                   module="hpml.examples.penguin.module")
    trainer = hpml_tfx.Trainer(examples=transform.outputs["transformed_examples"],
                               transform_graph=transform.outputs["transform_graph"],
                               input_pipeline=transform.outputs["input_pipeline"],
                               module="hpml.examples.penguin.module", strategy="mirrored")
    pipeline = tfx.dsl.Pipeline(pipeline_name="penguin-vertex", pipeline_root="/mnt/shared/root",
                                components=[example_gen, transform, trainer])
    runner = kubeflow_v2_dag_runner.KubeflowV2DagRunner(
        config=kubeflow_v2_dag_runner.KubeflowV2DagRunnerConfig(default_image="europe-docker.pkg.dev/p/hpml:0.2"),
        output_dir=str(tmp_path), output_filename="pipeline.json")
    runner.run(pipeline, write_out=True)

    job = json.loads((tmp_path / "pipeline.json").read_text())
    spec = json_format.ParseDict(job["pipelineSpec"], pipeline_spec_pb2.PipelineSpec())
    assert set(spec.root.dag.tasks) == {"ExampleGen", "Transform", "Trainer"}
    executors = json_format.MessageToDict(spec.deployment_spec)["executors"]
    for name in ("ExampleGen", "Transform", "Trainer"):
        container = executors[f"{name}_executor"]["container"]
        assert container["image"] == "europe-docker.pkg.dev/p/hpml:0.2"
        assert container["args"][:2] == ["--executor_class_path", f"hpml.pipelines.tfx.components.{name}Executor"]
    trainer_task = json_format.MessageToDict(spec.root.dag.tasks["Trainer"])
    assert {name: source["taskOutputArtifact"]["outputArtifactKey"]
            for name, source in trainer_task["inputs"]["artifacts"].items()} == {
        "examples": "transformed_examples", "transform_graph": "transform_graph", "input_pipeline": "input_pipeline"}
    parameters = {name: json.loads(value["runtimeValue"]["constantValue"]["stringValue"])
                  for name, value in trainer_task["inputs"]["parameters"].items()}
    assert parameters == {"module": "hpml.examples.penguin.module", "strategy": "mirrored"}


def test_the_tfx_guide_s_pipeline_runs_as_written_and_its_pushed_model_serves(tmp_path, monkeypatch):
    """docs/tfx.md's pipeline, run as a script from a folder holding data/ and what `hpml init` writes."""
    import runpy

    from hpml.pipelines import scaffold

    (tmp_path / "data").mkdir()
    data = tmp_path / "data" / "churn.csv"
    os.replace(quickstart_csv(tmp_path), data)
    scaffold.init_project("churn", str(data), "churned", directory=str(tmp_path))
    (example,) = [block for block in doc_blocks(REPO / "docs" / "tfx.md", "python") if "LocalDagRunner" in block]
    (tmp_path / "pipeline.py").write_text(example, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(tmp_path / "pipeline.py"), run_name="__main__")

    (pushed,) = (tmp_path / "serving").iterdir()
    examples, labels = _raw_examples(data, "churned", {"tenure_months": "int", "monthly_fee": "float",
                                                       "plan": "str", "support_calls": "int"})
    assert _accuracy_of_served_classes(str(pushed), examples, labels) > 0.7
    store = _store(str(tmp_path / "metadata.sqlite"))
    assert {t.name for t in store.get_execution_types()} >= {"hpml.pipelines.tfx.components.Transform",
                                                             "hpml.pipelines.tfx.components.Trainer"}


def test_a_bad_parameter_fails_where_the_tfx_pipeline_is_defined():
    example_gen = hpml_tfx.ExampleGen(input_path="/data/penguins.csv")
    with pytest.raises(SpecError, match="'strategy' is 'mirorred'; choose one of"):
        hpml_tfx.Trainer(examples=example_gen.outputs["examples"], module="m.py", strategy="mirorred")
    with pytest.raises(SpecError, match="unknown argument.*epoch") as error:
        hpml_tfx.Trainer(examples=example_gen.outputs["examples"], module="m.py", epoch=3)
    with pytest.raises(SpecError, match="missing input.*examples"):
        hpml_tfx.Trainer(module="m.py")
    assert "hyperparameters" in error.value.hint
