"""Trainer: TFX FnArgs contract, serving raw tf.Examples, clear failures, clean retries."""
import glob
import json
import os
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from hpml.components.errors import SpecError
from hpml.components.trainer import TRAINER
from tests.helpers import trainer_inputs

TFX_STYLE_MODULE = textwrap.dedent('''
    """A run_fn written only against TFX's documented FnArgs fields and tfxio options."""
    import json, os
    import tensorflow as tf
    import tensorflow_transform as tft
    import tf_keras
    from tfx_bsl.public import tfxio

    FEATURES = ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"]

    def run_fn(fn_args):
        tft_output = tft.TFTransformOutput(fn_args.transform_output)
        dataset = fn_args.data_accessor.tf_dataset_factory(
            fn_args.train_files,
            tfxio.TensorFlowDatasetOptions(batch_size=8, label_key="species"),
            tft_output.transformed_metadata.schema,
        ).repeat()
        inputs = {name: tf_keras.Input(shape=(), name=name) for name in FEATURES}
        stacked = tf_keras.layers.Concatenate()([tf_keras.layers.Reshape((1,))(inputs[n]) for n in FEATURES])
        model = tf_keras.Model(inputs, tf_keras.layers.Dense(3, activation="softmax")(stacked))
        model.compile("sgd", "sparse_categorical_crossentropy")
        model.fit(dataset.map(lambda f, y: ({n: f[n] for n in FEATURES}, y)),
                  steps_per_epoch=fn_args.train_steps, epochs=1, verbose=0)
        model.save(fn_args.serving_model_dir, save_format="tf")
        seen = {
            "steps_run": int(model.optimizer.iterations.numpy()),
            "train_steps": fn_args.train_steps, "eval_steps": fn_args.eval_steps,
            "hyperparameters": fn_args.hyperparameters, "custom": fn_args.custom_config.get("team"),
            "schema_file_exists": os.path.isfile(fn_args.schema_file),
            "schema_path_same": fn_args.schema_path == fn_args.schema_file,
            "working_dir_exists": os.path.isdir(fn_args.working_dir),
            "train_files": fn_args.train_files, "eval_files": fn_args.eval_files,
            "eval_model_dir": fn_args.eval_model_dir, "base_model": fn_args.base_model,
        }
        with open(os.path.join(fn_args.model_run_dir, "seen.json"), "w") as f:
            json.dump(seen, f)
''')


def _module(tmp_path, source, name="user_module.py"):
    path = tmp_path / name
    path.write_text(source)
    return str(path)


def test_tfx_style_run_fn_runs_unchanged(penguin_outputs, tmp_path):
    outputs = {"model": str(tmp_path / "model"), "model_run": str(tmp_path / "model_run")}
    TRAINER.run(trainer_inputs(penguin_outputs), outputs, {
        "module": _module(tmp_path, TFX_STYLE_MODULE), "train_steps": 7, "eval_steps": 0,
        "hyperparameters": {"lr": 0.1}, "custom_config": {"team": "ml-platform"},
    })
    seen = json.load(open(tmp_path / "model_run" / "seen.json"))
    assert seen["steps_run"] == 7
    assert seen["train_steps"] == 7 and seen["eval_steps"] is None, "eval_steps 0 must arrive as None"
    assert seen["hyperparameters"] == {"lr": 0.1} and seen["custom"] == "ml-platform"
    assert seen["schema_file_exists"] and seen["schema_path_same"] and seen["working_dir_exists"]
    assert seen["train_files"][0].endswith("Split-train/transformed_examples-*.gz")
    assert seen["eval_files"][0].endswith("Split-eval/transformed_examples-*.gz")
    assert seen["eval_model_dir"].endswith("Format-TFMA") and seen["base_model"] is None
    assert os.path.isfile(tmp_path / "model" / "Format-Serving" / "saved_model.pb")
    assert not os.path.exists(str(tmp_path / "model") + ".work"), "working dir is removed after success"


def test_run_fn_that_writes_no_model_is_an_error(penguin_outputs, tmp_path):
    module = _module(tmp_path, "def run_fn(fn_args):\n    pass\n", "lazy.py")
    outputs = {"model": str(tmp_path / "model"), "model_run": str(tmp_path / "model_run")}
    with pytest.raises(SpecError, match="wrote no model to serving_model_dir"):
        TRAINER.run(trainer_inputs(penguin_outputs), outputs, {"module": module})
    assert not os.path.exists(outputs["model"]) and not os.path.exists(outputs["model_run"])


def test_failed_attempt_leaves_nothing_and_retry_succeeds(penguin_outputs, tmp_path):
    flaky = _module(tmp_path, textwrap.dedent('''
        import os
        def run_fn(fn_args):
            os.makedirs(fn_args.serving_model_dir)
            open(os.path.join(fn_args.serving_model_dir, "half-written"), "w").write("x")
            marker = os.path.join(fn_args.working_dir, "attempted")
            if not os.path.exists(marker):
                open(marker, "w").write("1")
                # Killed while writing its metrics: the half line must not hide the real error.
                open(os.path.join(fn_args.model_run_dir, "metrics.jsonl"), "w").write('{"epoch": 1, "lo')
                raise RuntimeError("worker lost")
            open(os.path.join(fn_args.serving_model_dir, "saved_model.pb"), "w").write("ok")
    '''), "flaky.py")
    outputs = {"model": str(tmp_path / "model"), "model_run": str(tmp_path / "model_run")}
    with pytest.raises(RuntimeError, match="worker lost"):
        TRAINER.run(trainer_inputs(penguin_outputs), outputs, {"module": flaky})
    assert sorted(os.listdir(tmp_path)) == ["flaky.py", "model.work"], "only the working dir (backups) survives"
    TRAINER.run(trainer_inputs(penguin_outputs), outputs, {"module": flaky})
    assert sorted(os.listdir(os.path.join(outputs["model"], "Format-Serving"))) == ["half-written", "saved_model.pb"]
    assert sorted(os.listdir(tmp_path)) == ["flaky.py", "model", "model_run"]


def test_missing_split_is_refused(penguin_outputs, tmp_path):
    outputs = {"model": str(tmp_path / "model"), "model_run": str(tmp_path / "model_run")}
    with pytest.raises(SpecError, match="Split-test does not exist"):
        TRAINER.run(trainer_inputs(penguin_outputs), outputs,
                    {"module": "hpml.examples.penguin.module", "eval_splits": ["test"]})


def test_serving_model_takes_raw_examples(penguin_dag_run, penguin_outputs):
    model = tf.saved_model.load(os.path.join(penguin_outputs["Trainer"]["model"], "Format-Serving"))
    serve = model.signatures["serving_default"]
    files = glob.glob(os.path.join(penguin_outputs["ExampleGen"]["examples"], "Split-eval", "*.gz"))
    raw = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    labels = [tf.train.Example.FromString(r).features.feature["species"].bytes_list.value[0] for r in raw]
    out = serve(examples=tf.constant(raw))
    assert out["probabilities"].shape == (len(raw), 3)
    np.testing.assert_allclose(out["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)
    accuracy = float(np.mean(np.array(labels) == out["classes"].numpy()))
    recorded = penguin_dag_run["summary"].eval_metrics["accuracy"]
    assert accuracy == pytest.approx(recorded, abs=1e-6), "serving must compute what training evaluated"
    assert accuracy > 0.8
    # TFX's Evaluator reads the transformed label (the vocabulary id) through transform_features.
    transformed = model.signatures["transform_features"](examples=tf.constant(raw))
    vocabulary = [name.encode() for name in model.signatures["class_names"]()["class_names"].numpy().astype(str)]
    assert [vocabulary[i] for i in transformed["species"].numpy()] == labels


def test_penguin_module_refuses_a_label_with_one_class(tmp_path, penguin_csv):
    """Data holding one species used to train "successfully" to loss 0 while Keras scored accuracy 0
    (binary accuracy on a one-unit output): the module now refuses it, naming the label and class."""
    from hpml.components.errors import InputDataError
    from hpml.pipelines import runner
    from hpml.examples.penguin.pipeline import PIPELINE
    from tests.helpers import write_csv

    header, *rows = open(penguin_csv, encoding="utf-8").read().splitlines()
    csv = write_csv(tmp_path / "adelie.csv", header, [r for r in rows if r.startswith("Adelie,")][:60])
    with pytest.raises(InputDataError, match=r"^label 'species': the training data holds 1 class\(es\) "
                                             r"\(Adelie\); a classifier needs at least 2$"):
        runner.run_local(PIPELINE, {"data_path": csv, "epochs": 1})


def test_the_penguin_run_fn_trains_when_working_dir_is_none_as_tfx_trainer_leaves_it(penguin_outputs, tmp_path):
    """TFX's Trainer sets no working_dir; the module trains and exports without backups (hpml's Trainer sets one)."""
    from hpml.components.trainer.fn_args import FnArgs, tfxio_data_accessor
    from hpml.examples.penguin import module

    transformed = penguin_outputs["Transform"]["transformed_examples"]
    fn_args = FnArgs(
        working_dir=None,
        train_files=[f"{transformed}/Split-train/*"], eval_files=[f"{transformed}/Split-eval/*"],
        train_steps=0, eval_steps=0, schema_path=None,
        transform_graph_path=penguin_outputs["Transform"]["transform_graph"],
        data_accessor=tfxio_data_accessor(), serving_model_dir=str(tmp_path / "model" / "Format-Serving"),
        eval_model_dir=str(tmp_path / "model" / "Format-TFMA"), model_run_dir=str(tmp_path / "model_run"),
        hyperparameters={"epochs": 2}, custom_config={})
    module.run_fn(fn_args)
    served = tf.saved_model.load(fn_args.serving_model_dir)
    assert "serving_default" in served.signatures
    assert not (tmp_path / "backup").exists() and os.path.isfile(tmp_path / "model_run" / "metrics.jsonl")
