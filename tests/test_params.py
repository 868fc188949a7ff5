"""Pipeline parameters: one JSON schema, readable errors, data paths confined to roots."""
import pytest

from hpml.components.errors import SpecError
from hpml.components.example_gen import EXAMPLE_GEN
from hpml.pipelines import params
from hpml.examples.penguin.pipeline import PIPELINE

SCHEMA = PIPELINE.params_schema


def test_defaults_fill_in_and_validate(penguin_csv):
    values = PIPELINE.validate({"epochs": 2})
    assert values["epochs"] == 2 and values["batch_size"] == 32 and values["strategy"] == "auto"
    assert values["data_path"] == penguin_csv


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"epochs": 0}, "'epochs': 0 is less than the minimum of 1"),
        ({"epochs": "ten"}, "'epochs': 'ten' is not of type 'integer'"),
        ({"strategy": "magic"}, "'strategy': 'magic' is not one of"),
        ({"learning_rate": 0}, "'learning_rate': 0 is less than or equal to the minimum of 0"),
        ({"batch_sise": 3}, "unknown parameter 'batch_sise'"),
        ({"encoding": "latin-9000"}, "'encoding': unknown text encoding 'latin-9000'"),
        # NaN compares false with both bounds, so the schema's range let it through to the first training step.
        ({"learning_rate": float("nan")}, "'learning_rate': nan is not a finite number"),
    ],
)
def test_invalid_values_name_the_field(bad, message):
    with pytest.raises(SpecError) as err:
        PIPELINE.validate(bad)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"strategy": "parameter_server"}, "'num_ps': strategy parameter_server needs at least one parameter server"),
        ({"num_ps": 1, "strategy": "mirrored"},
         "'strategy': num_ps=1 trains with ParameterServerStrategy, not mirrored"),
        ({"num_workers": 2, "strategy": "one_device"}, "'strategy': num_workers=2 runs a cluster of worker processes"),
        ({"launcher": "vertex", "strategy": "gpipe"}, "'strategy': launcher vertex runs a cluster of worker processes"),
        ({"strategy": "gpipe", "gradient_accumulation_steps": 2},
         "'gradient_accumulation_steps': strategy gpipe already splits each batch into micro-batches"),
        ({"batch_size": 8, "gradient_accumulation_steps": 16}, "16 micro-batches of a batch of 8 examples leave 8"),
        ({"remat": "always"}, "'remat': 'always' applies to strategy gpipe's stages only; strategy auto would"),
        ({"remat": "never", "strategy": "mirrored"}, "strategy mirrored would train without it"),
    ],
)
def test_values_that_cannot_work_together_are_refused_before_any_work(values, message):
    """Each of these used to pass validation and fail in the Trainer, after ExampleGen and Transform
    (or, for too many micro-batches, to run with empty ones; remat without gpipe was silently ignored)."""
    with pytest.raises(SpecError) as err:
        PIPELINE.validate(values)
    assert message in str(err.value) and err.value.hint


def test_a_nan_or_infinite_number_is_refused_in_every_pipeline_and_component():
    """NaN passes any range check, since it compares false with both bounds; an infinite temperature passed
    'must be > 0'. Both then ran ExampleGen and Transform before training diverged."""
    from hpml.components.soft_targets import SOFT_TARGETS
    from hpml.examples.distillation.pipeline import PIPELINE as DISTILLATION

    with pytest.raises(SpecError, match="parameter 'temperature': nan is not a finite number"):
        DISTILLATION.validate({"temperature": float("nan")})
    with pytest.raises(SpecError, match="parameter 'alpha': nan is not a finite number"):
        DISTILLATION.validate({"alpha": float("nan")})
    with pytest.raises(SpecError, match="SoftTargets: parameter 'temperature' must be a finite number, got inf"):
        SOFT_TARGETS.resolve_params({"label_key": "species", "temperature": float("inf")})
    assert SOFT_TARGETS.resolve_params({"label_key": "species", "temperature": 2.5})["temperature"] == 2.5


@pytest.mark.parametrize("spec_name, given, message", [
    # Each was accepted, to fail later without naming the parameter: an empty module as "ValueError: Empty module
    # name" from importlib, an empty or repeated analyze split inside the Beam pipeline's construction.
    ("TRANSFORM", {"analyze_splits": []}, "parameter 'analyze_splits': needs at least one split"),
    ("TRANSFORM", {"analyze_splits": ["train", "train"]}, "parameter 'analyze_splits': names split 'train' more "
                                                          "than once"),
    ("TRANSFORM", {"module": " "}, "parameter 'module': must not be empty"),
    ("TRAINER", {"module": ""}, "parameter 'module': must not be empty"),
    ("TRAINER", {"eval_splits": ["eval", 3]}, "parameter 'eval_splits': each split must be a non-empty string, got 3"),
    ("EXAMPLE_GEN", {"input_path": ""}, "parameter 'input_path': must not be empty"),
    ("EXAMPLE_GEN", {"numeric_columns": ["x", ""]}, "parameter 'numeric_columns': each column must be a non-empty "
                                                    "string, got ''"),
])
def test_names_and_lists_of_names_are_checked(spec_name, given, message):
    from hpml.components.trainer import TRAINER
    from hpml.components.transform import TRANSFORM

    spec = {"TRANSFORM": TRANSFORM, "TRAINER": TRAINER, "EXAMPLE_GEN": EXAMPLE_GEN}[spec_name]
    base = {"input_path": "data.csv"} if spec is EXAMPLE_GEN else {"module": "m.py"}
    with pytest.raises(SpecError) as err:
        spec.resolve_params({**base, **given})
    assert str(err.value) == f"{spec.name}: {message}"
    assert spec.resolve_params(base), "the same spec without the bad value resolves"


def test_a_bool_is_not_a_number_parameter():
    """Python's True is an int, so num_workers=True used to train with one worker."""
    from hpml.components.trainer import TRAINER

    with pytest.raises(SpecError, match="Trainer: parameter 'num_workers' must be int, got bool True"):
        TRAINER.resolve_params({"module": "m.py", "num_workers": True})
    with pytest.raises(SpecError, match="SoftTargets: parameter 'temperature' must be int or float, got bool False"):
        from hpml.components.soft_targets import SOFT_TARGETS
        SOFT_TARGETS.resolve_params({"label_key": "species", "temperature": False})
    assert TRAINER.resolve_params({"module": "m.py", "num_workers": 2})["num_workers"] == 2


def test_parameter_servers_are_a_pipeline_parameter_that_reaches_the_trainer(penguin_csv):
    values = PIPELINE.validate({"num_ps": 1, "num_workers": 2})
    trainer = PIPELINE.node("Trainer").params(values)
    assert (trainer["num_ps"], trainer["num_workers"], trainer["strategy"]) == (1, 2, "auto")
    assert PIPELINE.validate({})["num_ps"] == 0
    for fine in ({"strategy": "parameter_server", "num_ps": 1}, {"strategy": "gpipe"},
                 {"num_workers": 2, "strategy": "multi_worker_mirrored"}, {"gradient_accumulation_steps": 32},
                 {"strategy": "gpipe", "remat": "always"}, {"strategy": "mirrored", "remat": "except_last"}):
        assert PIPELINE.validate(fine)["strategy"] == fine.get("strategy", "auto")


def test_data_path_outside_roots_is_refused(monkeypatch):
    monkeypatch.setenv("HPML_DATA_ROOTS", "")
    with pytest.raises(SpecError, match="outside the allowed data roots") as err:
        PIPELINE.validate({"data_path": "/etc/passwd"})
    assert "HPML_DATA_ROOTS" in err.value.hint


def test_symlink_escape_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    (root / "link.csv").symlink_to("/etc/hostname")
    monkeypatch.setenv("HPML_DATA_ROOTS", str(root))
    with pytest.raises(SpecError, match="outside the allowed data roots"):
        PIPELINE.validate({"data_path": str(root / "link.csv")})


def test_cli_values_are_typed():
    assert params.parse_cli_value(SCHEMA, "epochs", "4") == 4
    assert params.parse_cli_value(SCHEMA, "learning_rate", "0.5") == 0.5
    assert params.parse_cli_value(SCHEMA, "skip_bad_rows", "true") is True
    with pytest.raises(SpecError, match="'epochs': 'x' is not a valid integer"):
        params.parse_cli_value(SCHEMA, "epochs", "x")
    with pytest.raises(SpecError, match="unknown parameter 'nope'") as err:
        params.parse_cli_value(SCHEMA, "nope", "1")
    assert err.value.hint.startswith("known parameters: batch_size, data_path, ")


def test_a_misspelt_name_is_answered_with_the_closest_known_one():
    from hpml.pipelines import discovery

    with pytest.raises(SpecError) as err:
        params.parse_cli_value(SCHEMA, "epoch", "3")
    assert err.value.hint.startswith("did you mean 'epochs'? known parameters: batch_size, ")
    # From an Airflow conf or a TFX caller: before, jsonschema's "Additional properties are not allowed".
    with pytest.raises(SpecError, match=r"^unknown parameter 'batch_sise'$") as err:
        PIPELINE.validate({"batch_sise": 3})
    assert err.value.hint.startswith("did you mean 'batch_size'? ")
    with pytest.raises(SpecError, match=r"^unknown pipeline 'pengiun'$") as err:
        discovery.check("pengiun")
    assert err.value.hint.startswith("did you mean 'penguin'? known pipelines: distillation, penguin; or name a "
                                     "project folder (hpml init pengiun --csv FILE --label COLUMN writes one)")
    with pytest.raises(SpecError, match=r"ExampleGen: unknown parameter\(s\) skip_bad_row$") as err:
        EXAMPLE_GEN.resolve_params({"input_path": "x", "skip_bad_row": True})
    assert err.value.hint.startswith("did you mean 'skip_bad_rows'? known parameters: ")


def test_component_parameters_are_typed_and_checked():
    with pytest.raises(SpecError, match="unknown parameter"):
        EXAMPLE_GEN.resolve_params({"input_path": "x", "bogus": 1})
    with pytest.raises(SpecError, match="'input_path' is required"):
        EXAMPLE_GEN.resolve_params({})
    with pytest.raises(SpecError, match="must be bool"):
        EXAMPLE_GEN.resolve_params({"input_path": "x", "skip_bad_rows": "yes"})
    with pytest.raises(SpecError, match="choose one of csv, tfrecord"):
        EXAMPLE_GEN.resolve_params({"input_path": "x", "input_format": "parquet"})
    with pytest.raises(SpecError, match="positive whole number of hash buckets"):
        EXAMPLE_GEN.resolve_params({"input_path": "x", "splits": {"train": 0}})


FRAMEWORK_IMPORT_CHECK = '''
import importlib, pkgutil, sys
sys.modules["palmerpenguins"] = None  # an import of either now fails
sys.modules["sklearn"] = None
import hpml.components, hpml.pipelines, hpml.v1
names = []
for package in (hpml.components, hpml.pipelines):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if info.name.endswith(".worker"):  # a process entry point: runs a job when imported as __main__ only
            continue
        if info.name.startswith("hpml.pipelines.tfx."):  # the TFX adapter needs tfx (tests/tfx_conformance)
            continue
        importlib.import_module(info.name)
        names.append(info.name)
for name in hpml.v1.__all__:
    getattr(hpml.v1, name)
print(len(names))
'''


def test_the_framework_imports_without_the_examples_data_packages():
    """palmerpenguins and scikit-learn are the examples' (the `examples` extra), not the framework's."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FRAMEWORK_IMPORT_CHECK], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.strip().splitlines()[-1]) > 60


def test_a_pipeline_brings_its_own_checks_and_path_parameters_are_confined(tmp_path, monkeypatch):
    """Generic validation: "format": "path" confines any parameter to the data roots (its default excepted), and
    a pipeline's own checks run after the schema, in order, and may update the values."""
    from hpml.pipelines.dsl import Pipeline

    calls = []

    def positive_total(values):
        calls.append("total")
        if values["a"] + values["b"] <= 0:
            raise SpecError("parameter 'b': a + b must be positive")

    def doubled(values):
        calls.append("doubled")
        return {"b": values["b"] * 2}

    schema = {"type": "object", "additionalProperties": False, "properties": {
        "a": {"type": "integer", "default": 1}, "b": {"type": "integer", "default": 1},
        "labels": {"type": "string", "format": "path", "default": "/opt/shipped/labels.txt"}}}
    pipeline = Pipeline(name="custom", nodes=(), params_schema=schema, param_checks=(positive_total, doubled))
    assert pipeline.validate({"b": 3}) == {"a": 1, "b": 6, "labels": "/opt/shipped/labels.txt"}
    assert calls == ["total", "doubled"]
    with pytest.raises(SpecError, match="a \\+ b must be positive"):
        pipeline.validate({"a": -5})
    with pytest.raises(SpecError, match="parameter 'labels': /etc/passwd is outside the allowed data roots"):
        pipeline.validate({"labels": "/etc/passwd"})
    monkeypatch.setenv("HPML_DATA_ROOTS", str(tmp_path))
    assert pipeline.validate({"labels": str(tmp_path / "x.txt")})["labels"] == str(tmp_path / "x.txt")
    with pytest.raises(SpecError, match="pipeline name 'no spaces' is invalid"):
        Pipeline(name="no spaces", nodes=(), params_schema=schema)
