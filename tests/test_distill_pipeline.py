"""Distillation as a Trainer mode and a pipeline: a real Airflow DAG run on the digits, the Beam
soft-target cache, teachers refused before training, Mirrored equal to one device, BackupAndRestore."""
import glob
import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from hpml.components.errors import SpecError
from hpml.components.soft_targets import SOFT_TARGETS
from hpml.components.trainer import TRAINER
from hpml.components.trainer.distill.loss import ensemble_soft_targets
from tests.helpers import trainer_outputs

CONF = {"teacher_epochs": 4, "student_epochs": 3, "teacher_hidden": 32, "student_hidden": 8, "batch_size": 64,
        "temperature": 3.0, "alpha": 0.7, "strategy": "one_device", "seed": 7}
ROWS = ["teacher_0", "teacher_1", "teacher_2", "ensemble", "student_scratch", "student_distilled"]


@pytest.fixture(scope="module")
def distill_run(airflow_db):
    from hpml.pipelines import records
    from hpml.pipelines.airflow import local as airflow_local

    dag_run = airflow_local.test_run("distillation", CONF)
    mlflow_run_id = records.find("airflow.run_id", dag_run.run_id, "distillation")
    summary = records.load(mlflow_run_id)
    return {"dag_run": dag_run, "mlflow_run_id": mlflow_run_id, "summary": summary, "outputs": summary.outputs}


def _raw_eval(outputs):
    files = glob.glob(os.path.join(outputs["ExampleGen"]["examples"], "Split-eval", "*.gz"))
    raw = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    labels = np.array([str(tf.train.Example.FromString(r).features.feature["digit"].int64_list.value[0]) for r in raw])
    return raw, labels


def _serve(model_uri, raw):
    signature = tf.saved_model.load(os.path.join(model_uri, "Format-Serving")).signatures["serving_default"]
    return signature(examples=tf.constant(raw))


def _class_names(model_uri) -> np.ndarray:
    loaded = tf.saved_model.load(os.path.join(model_uri, "Format-Serving"))
    return loaded.signatures["class_names"]()["class_names"].numpy().astype(str)


def _results(outputs):
    return json.load(open(os.path.join(outputs["Evaluator"]["evaluation"], "results.json")))


def test_dag_runs_every_model_and_scores_them_on_one_eval_split(distill_run):
    from hpml.pipelines import records

    assert str(distill_run["dag_run"].state).endswith("success")
    results = _results(distill_run["outputs"])
    assert [row["name"] for row in results["rows"]] == ROWS
    raw, labels = _raw_eval(distill_run["outputs"])
    assert results["examples"] == len(raw) > 100
    rows = {row["name"]: row for row in results["rows"]}
    # Recompute every row from the exported Models' serving signatures on raw tf.Examples.
    probabilities = {}
    for name, node in [("teacher_0", "Teacher_0"), ("teacher_1", "Teacher_1"), ("teacher_2", "Teacher_2"),
                       ("student_scratch", "Student_scratch"), ("student_distilled", "Student_distilled")]:
        out = _serve(distill_run["outputs"][node]["model"], raw)
        probabilities[name] = out["probabilities"].numpy()
        np.testing.assert_allclose(probabilities[name].sum(axis=1), 1.0, rtol=1e-5)
        assert rows[name]["accuracy"] == pytest.approx(np.mean(out["classes"].numpy().astype(str) == labels))
        # Every Model names each probability column's class; the names are the ones its rows predict.
        class_names = _class_names(distill_run["outputs"][node]["model"])
        assert sorted(class_names) == [str(d) for d in range(10)]
        assert (class_names[out["class_ids"].numpy()] == out["classes"].numpy().astype(str)).all()
    ensemble = class_names[np.mean([probabilities[f"teacher_{i}"] for i in range(3)], axis=0).argmax(axis=1)]
    assert rows["ensemble"]["accuracy"] == pytest.approx(np.mean(ensemble == labels))
    assert rows["ensemble"]["params"] == 3 * rows["teacher_0"]["params"]
    assert rows["student_distilled"]["params"] == rows["student_scratch"]["params"] == 64 * 8 + 8 + 8 * 10 + 10
    assert rows["teacher_0"]["params"] == 64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10
    assert rows["student_distilled"]["accuracy"] > 0.5, "a distilled student learns the digits"
    gap = results["distillation"]
    assert gap["param_ratio"] == pytest.approx(rows["student_distilled"]["params"] / rows["ensemble"]["params"])
    # The table and the numbers are in the MLflow run.
    run = records.client().get_run(distill_run["mlflow_run_id"])
    assert run.data.metrics["evaluation.student_distilled.accuracy"] == pytest.approx(
        rows["student_distilled"]["accuracy"])
    assert run.data.metrics["distillation.param_ratio"] == pytest.approx(gap["param_ratio"])
    assert "Teacher_0.loss" in run.data.metrics and "Student_distilled.loss" in run.data.metrics
    logged = records.client().download_artifacts(distill_run["mlflow_run_id"], "Evaluator/evaluation/results.md")
    assert "| student_distilled |" in open(logged).read()
    assert run.data.tags["Student_distilled.distillation.soft_targets"] == "precomputed"


def test_ensemble_names_columns_from_the_members_class_names_not_from_their_predictions():
    from types import SimpleNamespace

    from hpml.components.evaluator.executor import _ensemble_row

    # Each member's own argmax is column 0 or 1; their average picks column 2, which neither predicts.
    first = np.array([[0.50, 0.05, 0.45]])
    second = np.array([[0.05, 0.50, 0.45]])
    named = {0: "a", 1: "b", 2: "c"}
    rows = [{"params": 10, "size_bytes": 100, "latency_us": 1.0}] * 2
    members = [SimpleNamespace(probabilities=p, column_names=named) for p in (first, second)]
    assert _ensemble_row("both", members, rows, np.array(["c"]))["accuracy"] == 1.0

    seen_only = [SimpleNamespace(probabilities=first, column_names={0: "a"}),
                 SimpleNamespace(probabilities=second, column_names={1: "b"})]
    with pytest.raises(SpecError, match=r"column\(s\) \[2\], whose class no member names"):
        _ensemble_row("both", seen_only, rows, np.array(["c"]))
    swapped = [members[0], SimpleNamespace(probabilities=second, column_names={0: "b", 1: "a", 2: "c"})]
    with pytest.raises(SpecError, match="disagree on probability column 0"):
        _ensemble_row("both", swapped, rows, np.array(["c"]))


def test_soft_target_cache_holds_the_teachers_averaged_softened_outputs(distill_run):
    outputs = distill_run["outputs"]
    cache = outputs["SoftTargets"]["examples"]
    record = json.load(open(os.path.join(cache, "soft_targets.json")))
    assert record["temperature"] == CONF["temperature"] and record["num_classes"] == 10
    assert record["splits"] == ["eval", "train"]
    files = glob.glob(os.path.join(cache, "Split-train", "transformed_examples-*.gz"))
    examples = [tf.train.Example.FromString(r.numpy())
                for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    source = glob.glob(os.path.join(outputs["Transform"]["transformed_examples"], "Split-train", "*.gz"))
    assert len(examples) == sum(1 for _ in tf.data.TFRecordDataset(source, compression_type="GZIP"))
    pixels = np.array([e.features.feature["pixels"].float_list.value for e in examples[:50]], dtype=np.float32)
    cached = np.array([e.features.feature["soft_targets"].float_list.value for e in examples[:50]])
    teachers = [tf_keras.models.load_model(os.path.join(outputs[f"Teacher_{i}"]["model"], "Format-Serving"),
                                           compile=False) for i in range(3)]
    expected = ensemble_soft_targets([t({"pixels": tf.constant(pixels)}) for t in teachers], CONF["temperature"])
    np.testing.assert_allclose(cached, expected.numpy(), atol=1e-6)
    np.testing.assert_allclose(cached.sum(axis=1), 1.0, rtol=1e-5)


def test_soft_targets_in_two_beam_processes_write_the_in_process_output(distill_run, tmp_path, gcs):
    """Beam's multi-process runner (two SDK worker processes, each loading the teachers), writing to the object
    store, writes the soft targets the DAG's in-process run wrote to local disk, to float32 rounding: the teachers
    may see other batches."""
    outputs = distill_run["outputs"]
    cache = f"{gcs.root}/{tmp_path.name}/soft_targets"
    SOFT_TARGETS.run({"examples": outputs["Transform"]["transformed_examples"],
                      "transform_graph": outputs["Transform"]["transform_graph"],
                      "teachers": [outputs[f"Teacher_{i}"]["model"] for i in range(3)]},
                     {"examples": cache},
                     {"label_key": "digit", "temperature": CONF["temperature"],
                      "beam_pipeline_args": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]})

    def rows(folder, split):
        files = tf.io.gfile.glob(os.path.join(folder, f"Split-{split}", "*.gz"))
        examples = [tf.train.Example.FromString(r.numpy())
                    for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
        table = [[*e.features.feature["pixels"].float_list.value, *e.features.feature["digit"].int64_list.value,
                  *e.features.feature["soft_targets"].float_list.value] for e in examples]
        return np.array(sorted(table, key=lambda row: [round(v, 4) for v in row[:65]]))

    for split in ("train", "eval"):
        got, want = rows(cache, split), rows(outputs["SoftTargets"]["examples"], split)
        assert got.shape == want.shape and len(got) > 100
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert json.loads(tf.io.gfile.GFile(os.path.join(cache, "soft_targets.json")).read()) == \
        json.load(open(os.path.join(outputs["SoftTargets"]["examples"], "soft_targets.json")))


def _trainer_inputs(outputs, examples=None, teachers=None):
    inputs = {"examples": examples or outputs["Transform"]["transformed_examples"],
              "transform_graph": outputs["Transform"]["transform_graph"]}
    if teachers is not None:
        inputs["teachers"] = teachers
    return inputs


def _distill_params(**extra):
    hp = {"hidden": [8], "epochs": 2, "batch_size": 64, "seed": 3, "learning_rate": 0.01}
    return dict({"module": "hpml.examples.distillation.module", "mode": "distill", "temperature": CONF["temperature"],
                 "alpha": 0.7, "strategy": "one_device", "hyperparameters": hp}, **extra)


def test_bad_teachers_and_caches_are_refused_before_training(distill_run, tmp_path):
    outputs = distill_run["outputs"]
    teachers = [outputs["Teacher_0"]["model"]]
    cache = outputs["SoftTargets"]["examples"]
    not_trained = tmp_path / "never_trained"
    not_trained.mkdir()
    cases = [
        (_trainer_inputs(outputs, teachers=[str(not_trained)]), {}, "never_trained has no SavedModel"),
        (_trainer_inputs(outputs, teachers=[]), {}, "needs at least one teacher Model"),
        (_trainer_inputs(outputs, teachers=teachers), {"soft_targets": "precomputed"}, "carries no soft targets"),
        (_trainer_inputs(outputs, examples=cache), {"temperature": 9.0}, "computed at T=3.0, but temperature=9.0"),
        (_trainer_inputs(outputs, teachers=teachers), {"mode": "train"}, "teachers are wired in but mode is 'train'"),
    ]
    for inputs, extra, message in cases:
        out = trainer_outputs(tmp_path, "refused")
        with pytest.raises(SpecError, match=message):
            TRAINER.run(inputs, out, _distill_params(**extra))
        assert not os.path.exists(out["model"]) and not os.path.exists(out["model"] + ".work"), message
    # A teacher for another label set (3 classes) is refused before the first step.
    pixels = tf_keras.Input(shape=(64,), name="pixels")
    three = tf_keras.Model({"pixels": pixels}, tf_keras.layers.Dense(3, activation="softmax")(pixels))
    three.save(str(tmp_path / "three" / "Format-Serving"), save_format="tf")
    out = trainer_outputs(tmp_path, "mismatch")
    with pytest.raises(SpecError, match="predicts 3 classes but the student predicts 10"):
        TRAINER.run(_trainer_inputs(outputs, teachers=[str(tmp_path / "three")]), out, _distill_params())
    assert not os.path.exists(os.path.join(out["model"] + ".work", "backup")), "no training step was taken"
    with pytest.raises(SpecError, match="teachers predict different numbers of classes"):
        SOFT_TARGETS.run({"examples": outputs["Transform"]["transformed_examples"],
                          "transform_graph": outputs["Transform"]["transform_graph"],
                          "teachers": teachers + [str(tmp_path / "three")]},
                         {"examples": str(tmp_path / "cache")}, {"label_key": "digit"})
    assert not os.path.exists(tmp_path / "cache")


def _student_weights(model_uri):
    model = tf_keras.models.load_model(os.path.join(model_uri, "Format-Serving"), compile=False)
    return [w.numpy() for w in model.weights]


def test_distill_on_mirrored_replicas_equals_one_device_and_teachers_on_the_fly(distill_run, tmp_path):
    outputs = distill_run["outputs"]
    teachers = [outputs[f"Teacher_{i}"]["model"] for i in range(3)]
    cache = outputs["SoftTargets"]["examples"]
    runs = {}
    for name, extra in [("one", {}), ("mirrored", {"strategy": "mirrored"})]:
        params = _distill_params(**extra)
        # The tuned step may pick bfloat16 on one side and not the other; the subject here is the strategy.
        params["hyperparameters"].update(precision="float32", jit_compile=False)
        props = TRAINER.run(_trainer_inputs(outputs, examples=cache), trainer_outputs(tmp_path, name), params)
        assert props["distillation"]["soft_targets"] == "precomputed"
        step = props["tuned_step"]  # the example tunes its step; the pinned knobs are kept
        assert step["choice"]["precision"] == "float32" and step["choice"]["jit_compile"] is False
        assert step["reasons"]["precision"] == "pinned in hyperparameters"
        assert step["choice"]["steps_per_execution"] >= 1
        runs[name] = props
    from hpml.components.trainer.strategies import make_strategy

    assert runs["mirrored"]["plan"]["strategy"] == "mirrored" and make_strategy("mirrored").num_replicas_in_sync == 4
    for one, mirrored in zip(_student_weights(str(tmp_path / "one" / "model")),
                             _student_weights(str(tmp_path / "mirrored" / "model"))):
        np.testing.assert_allclose(one, mirrored, rtol=1e-4, atol=1e-5)
    # The same student with the teachers run in the training step instead of the cache.
    props = TRAINER.run(_trainer_inputs(outputs, teachers=teachers), trainer_outputs(tmp_path, "fly"),
                        _distill_params(soft_targets="auto"))
    assert props["distillation"]["soft_targets"] == "on_the_fly" and len(props["distillation"]["teachers"]) == 3
    raw, labels = _raw_eval(outputs)
    served = _serve(str(tmp_path / "fly" / "model"), raw)
    assert np.mean(served["classes"].numpy().astype(str) == labels) > 0.5


CRASH_ONCE = textwrap.dedent('''
    """The digits run_fn, but the first attempt dies after epoch 2 (a lost worker)."""
    import json, os
    import tf_keras
    import hpml.v1
    from hpml.examples.distillation import module as digits_module

    class DieAfterSecondEpoch(tf_keras.callbacks.Callback):
        def __init__(self, marker):
            super().__init__()
            self.marker = marker

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1 and not os.path.exists(self.marker):
                open(self.marker, "w").write("died")
                raise RuntimeError("worker lost after epoch 2")

    def run_fn(fn_args):
        original = hpml.v1.standard_callbacks  # where the module takes it from

        def with_crash(*args, **kwargs):
            return original(*args, **kwargs) + [DieAfterSecondEpoch(os.path.join(fn_args.working_dir, "died"))]

        hpml.v1.standard_callbacks = with_crash
        try:
            digits_module.run_fn(fn_args)
        finally:
            hpml.v1.standard_callbacks = original
''')


def test_distill_under_mirrored_resumes_from_backup_after_a_crash(distill_run, tmp_path):
    outputs = distill_run["outputs"]
    module = tmp_path / "crash_once.py"
    module.write_text(CRASH_ONCE)
    params = _distill_params(strategy="mirrored", module=str(module))
    params["hyperparameters"] = dict(params["hyperparameters"], epochs=4)
    out = trainer_outputs(tmp_path, "resumed")
    inputs = _trainer_inputs(outputs, examples=outputs["SoftTargets"]["examples"])
    with pytest.raises(RuntimeError, match="worker lost after epoch 2"):
        TRAINER.run(inputs, out, params)
    assert os.path.isdir(os.path.join(out["model"] + ".work", "backup")), "the backup survives the failed attempt"
    props = TRAINER.run(inputs, out, params)
    epochs = [row["epoch"] for row in props["history"]]
    assert epochs == [3, 4], f"the retry resumed after the two finished epochs, not from scratch: {epochs}"
    assert os.path.isfile(os.path.join(out["model"], "Format-Serving", "saved_model.pb"))


def test_distillation_dag_shape_and_trigger_form(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.path.join(os.path.dirname(__file__), "..", "dags"))
    assert bag.import_errors == {}
    dag = bag.get_dag("distillation")
    teachers = {"Teacher_0", "Teacher_1", "Teacher_2"}
    assert dag.task_dict["SoftTargets"].upstream_task_ids == {"start_run", "Transform", *teachers}
    assert dag.task_dict["Student_distilled"].upstream_task_ids == {"start_run", "Transform", "SoftTargets", *teachers}
    assert dag.task_dict["Student_scratch"].upstream_task_ids == {"start_run", "Transform"}
    assert dag.task_dict["Evaluator"].upstream_task_ids == {"start_run", "ExampleGen", "Student_scratch",
                                                            "Student_distilled", *teachers}
    assert type(dag.timetable).__name__ == "NullTimetable", "distillation runs are triggered, not scheduled"
    form = dag.params.dump()
    assert {"temperature", "alpha", "teacher_epochs", "student_epochs", "student_hidden"} <= set(form)
    assert all(dag.params.get_param(name).description for name in form)


def test_parsing_the_dag_writes_nothing_and_a_run_writes_the_digits_csv(tmp_path, monkeypatch):
    from hpml.examples.distillation import pipeline as distillation

    monkeypatch.setenv("HPML_HOME", str(tmp_path))
    pipeline = distillation.build()  # what every parse of dags/distillation.py does
    assert not (tmp_path / "data").exists(), "a DAG parse must not write data"
    default_path = pipeline.params_schema["properties"]["data_path"]["default"]
    assert default_path == str(tmp_path / "data" / "digits.csv")

    example_gen = pipeline.node("ExampleGen")
    params = pipeline.validate({})
    assert example_gen.params(params)["input_path"] == default_path
    rows = Path(default_path).read_text().splitlines()
    assert rows[0].split(",")[-1] == "digit" and len(rows[0].split(",")) == 65 and len(rows) == 1 + 1797
    assert not list((tmp_path / "data").glob("*.tmp-*")), "written atomically: no temporary file left"

    other = tmp_path / "data" / "mine.csv"
    assert example_gen.params({**params, "data_path": str(other)})["input_path"] == str(other)
    assert not other.exists(), "only the default location is ever written"


def test_list_inputs_are_wired_as_lists_only():
    from hpml.components.evaluator import EVALUATOR
    from hpml.pipelines.dsl import Node, Pipeline
    from hpml.examples.distillation.pipeline import build

    pipeline = build(num_teachers=1, name="one_teacher")
    assert pipeline.node("SoftTargets").upstream == ["Teacher_0", "Transform"]
    first = pipeline.nodes[0]
    with pytest.raises(SpecError, match="must be wired to a list of outputs"):
        Pipeline("bad", (first, Node("Evaluator", EVALUATOR, inputs={
            "examples": ("ExampleGen", "examples"), "models": ("ExampleGen", "examples")})), {})
    with pytest.raises(SpecError, match="takes a list of Model URIs"):
        EVALUATOR.run({"examples": "/tmp", "models": "/tmp"}, {"evaluation": "/tmp/x"},
                      {"label_key": "digit", "model_names": ["a"]})


def test_teacher_jitter_moves_each_image_by_one_of_the_shifts():
    from hpml.examples.distillation.module import SHIFTS, _shift_batch, shift_pixels

    images = np.arange(1, 65, dtype=np.float32).reshape(1, 8, 8)
    for dx, dy in SHIFTS:
        expected = np.zeros_like(images)
        expected[:, max(dy, 0):8 + min(dy, 0), max(dx, 0):8 + min(dx, 0)] = \
            images[:, max(-dy, 0):8 - max(dy, 0), max(-dx, 0):8 - max(dx, 0)]
        moved = shift_pixels(tf.constant(images.reshape(1, 64)), dx, dy).numpy().reshape(1, 8, 8)
        np.testing.assert_array_equal(moved, expected)
    batch = tf.constant(np.random.default_rng(0).random((200, 64), dtype=np.float32))
    features, label = _shift_batch({"pixels": batch}, tf.range(200), seed=1)
    np.testing.assert_array_equal(label.numpy(), np.arange(200))
    candidates = np.stack([shift_pixels(batch, dx, dy).numpy() for dx, dy in SHIFTS], axis=1)
    picked = [next(i for i in range(len(SHIFTS)) if np.array_equal(candidates[n, i], features["pixels"][n]))
              for n in range(200)]
    assert len(set(picked)) == len(SHIFTS), "every shift is drawn, per image"


def test_run_report_shows_the_table_and_every_models_curve(distill_run):
    from hpml.pipelines import records

    report = distill_run["summary"].tags["hpml.report"]
    folder = os.path.dirname(report)
    data = json.load(open(os.path.join(folder, "report.json")))
    assert data["evaluation"] == _results(distill_run["outputs"])
    nodes = ["Teacher_0", "Teacher_1", "Teacher_2", "Student_scratch", "Student_distilled"]
    assert data["node_curves"] == sorted(f"{n}.val_accuracy" for n in nodes)
    for name in data["node_curves"]:
        assert data["series"][name] == [list(p) for p in records.history(distill_run["mlflow_run_id"], name)]
    assert len(data["series"]["Student_distilled.val_accuracy"]) == CONF["student_epochs"]
    for png in ("evaluation.png", "node_curves.png"):
        with open(os.path.join(folder, png), "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    page = open(report).read()
    assert "Models on the eval split" in page and "<td>student_distilled</td>" in page
