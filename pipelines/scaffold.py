"""`hpml init`: a pipeline for your own CSV, written as files you own and edit.

It reads the CSV once, decides each column's kind (numbers are z-scored; text goes through a vocabulary) and the
task (a text label, or whole numbers with few distinct values, is classification; other numbers, regression),
and writes a project folder:

    NAME/pipeline.py   the pipeline definition (ExampleGen -> Transform -> Trainer)
    NAME/module.py     the user module: preprocessing_fn for Transform, run_fn for Trainer
    NAME/dag.py        an Airflow DAG file for it (or DAGS_FOLDER/NAME.py with --dags-folder)

`hpml run NAME` then runs it from the folder that holds NAME/.
"""
from __future__ import annotations

import csv
import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from hpml.components import files
from hpml.components.errors import InputDataError, SpecError
from hpml.components.example_gen.text_encoding import DEFAULT_ENCODING
from hpml.pipelines.airflow.dag_file import dag_file_text
from hpml.pipelines.discovery import PIPELINE_FILE

MODULE_FILE = "module.py"
DAG_FILE = "dag.py"
MISSING = ("", "NA")  # ExampleGen's default na_values
MAX_CLASSES = 20  # whole-number labels with at most this many values are classes
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
# A TensorFlow op name: features become Keras input names, so they must be valid ones.
_FEATURE_RE = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\-/>]*$")


@dataclass(frozen=True)
class CsvProfile:
    """What `hpml init` learnt from the CSV."""

    path: str
    label: str
    task: str  # "classification" or "regression"
    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    empty: tuple[str, ...]  # columns with no value in any row: left out
    rows: int
    classes: tuple[str, ...] = ()
    # CSV column -> feature name, for the columns whose names cannot name a feature; the fields above hold
    # feature names
    renamed: tuple[tuple[str, str], ...] = ()


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.strip().lower() not in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity")


def feature_name(column: str, taken: set[str]) -> str:
    """A feature name for a CSV column whose name cannot be one: accents dropped, each run of other characters
    as `_`, and a suffix where the result is already taken. `Body size (cm)` becomes `Body_size_cm`."""
    import unicodedata

    plain = "".join(c for c in unicodedata.normalize("NFKD", column) if not unicodedata.combining(c))
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", plain).strip("_") or "column"
    name = name if _FEATURE_RE.match(name) else f"c_{name}"
    unique, number = name, 2
    while unique in taken:
        unique, number = f"{name}_{number}", number + 1
    return unique


def _feature_names(header: list[str]) -> list[str]:
    """Each column's feature name: its own where it can be one."""
    taken = {name for name in header if _FEATURE_RE.match(name)}
    names = []
    for name in header:
        if not _FEATURE_RE.match(name):
            name = feature_name(name, taken)
            taken.add(name)
        names.append(name)
    return names


def profile_csv(path: str, label: str, task: str | None = None, encoding: str = DEFAULT_ENCODING) -> CsvProfile:
    """Read the whole CSV once: each column's kind, and the task its label asks for."""
    if not os.path.isfile(path):
        raise InputDataError(f"{path}: no such file", hint="--csv takes the path of a CSV file with a header row")
    codec = "utf-8-sig" if encoding.lower().replace("_", "-") in ("utf-8", "utf8") else encoding
    try:
        with open(path, newline="", encoding=codec) as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if not header or not any(cell.strip() for cell in header):
                raise InputDataError(f"{path}: the file is empty; hpml init needs a header row and data rows")
            values: list[set[str]] = [set() for _ in header]
            numeric = [True] * len(header)
            whole = [True] * len(header)
            rows = 0
            line = reader.line_num + 1  # where the next record starts
            for row in reader:
                first, line = line, reader.line_num + 1
                if not row:
                    continue
                if "\x00" in "".join(row):
                    raise InputDataError(f"{path}:{first}: the row holds a NUL byte (\\x00)",
                                         hint="check the file: NUL bytes mean binary data, or text in another "
                                              "encoding, such as UTF-16")
                if len(row) != len(header):
                    if reader.line_num > first and next(reader, None) is None:  # read to the end inside quotes
                        raise InputDataError(f"{path}:{first}: a quoted value opened on this line is never closed",
                                             hint='close the quote (a quote inside a quoted value is written '
                                                  'twice: "")')
                    raise InputDataError(f"{path}:{first}: expected {len(header)} fields, got {len(row)}",
                                         hint="fix the row, or quote a field that holds a comma")
                rows += 1
                for i, cell in enumerate(row):
                    if cell in MISSING:
                        continue
                    if len(values[i]) <= MAX_CLASSES:
                        values[i].add(cell)
                    if numeric[i] and not _is_number(cell):
                        numeric[i] = False
                    if whole[i] and numeric[i] and not float(cell).is_integer():
                        whole[i] = False
    except UnicodeDecodeError as err:
        raise InputDataError(f"{path}: not {encoding} text ({err.reason} at byte {err.start})",
                             hint="pass --encoding, e.g. latin-1 or cp1252") from None
    header = [name.strip() for name in header]
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise InputDataError(f"{path}: column(s) {', '.join(map(repr, repeated))} appear more than once in the header")
    if label not in header:
        close = difflib.get_close_matches(label, header, n=1)
        raise SpecError(f"--label {label!r} is not a column of {path}",
                        hint=(f"did you mean {close[0]!r}? " if close else "") + f"columns: {', '.join(header)}")
    features = _feature_names(header)
    renamed = tuple((column, feature) for column, feature in zip(header, features) if column != feature)
    label = features[header.index(label)]
    header = features
    if rows == 0:
        raise InputDataError(f"{path}: the file has a header but no data rows")
    at = header.index(label)
    if not values[at]:
        raise InputDataError(f"{path}: label {label!r} has no value in any row")
    if task is None:
        task = "classification" if not numeric[at] or (whole[at] and len(values[at]) <= MAX_CLASSES) \
            else "regression"
    if task == "regression" and not numeric[at]:
        raise InputDataError(f"{path}: label {label!r} holds text (e.g. {sorted(values[at])[0]!r}), so it cannot be "
                             "a regression target", hint="leave out --task, or choose a numeric label")
    if task == "classification" and len(values[at]) < 2:
        raise InputDataError(f"{path}: label {label!r} has one value ({next(iter(values[at]))!r}) in every row; a "
                             "classifier needs at least 2", hint="choose another label column")
    features = [i for i in range(len(header)) if i != at]
    return CsvProfile(
        path=str(Path(path).resolve()), label=label, task=task, rows=rows,
        numeric=tuple(header[i] for i in features if values[i] and numeric[i]),
        categorical=tuple(header[i] for i in features if values[i] and not numeric[i]),
        empty=tuple(header[i] for i in features if not values[i]),
        classes=tuple(sorted(values[at])) if task == "classification" and len(values[at]) <= MAX_CLASSES else (),
        renamed=renamed,
    )


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise SpecError(f"pipeline name {name!r} is invalid",
                        hint="start with a letter; then letters, digits or '_' (it names a folder, a Python file "
                             "and the Airflow DAG)")
    return name


def _tuple(names: tuple[str, ...]) -> str:
    """Names as a Python tuple literal in double quotes (feature names hold no quotes: _FEATURE_RE)."""
    return "(" + ", ".join(f'"{name}"' for name in names) + ("," if len(names) == 1 else "") + ")"


def _renames(profile: CsvProfile) -> str:
    """The CSV columns that take other names as features, as a dict literal, one column a line."""
    return "{\n" + "".join(f"    {column!r}: {feature!r},\n" for column, feature in profile.renamed) + "}"


def render_module(profile: CsvProfile, name: str, source: str) -> str:
    """module.py's text: the constants derived from the CSV, then the same code for every CSV."""
    left_out = f"# Left out, with no value in any row: {', '.join(profile.empty)}.\n" if profile.empty else ""
    renamed = ("# CSV columns whose names cannot name a feature, and the names ExampleGen gives them (pipeline.py's\n"
               "# RENAME_COLUMNS); the features below, and the serving signature's inputs, use the new names.\n"
               f"CSV_COLUMN_NAMES = {_renames(profile)}\n") if profile.renamed else ""
    constants = (f'{renamed}LABEL_KEY = "{profile.label}"\n'
                 f'TASK = "{profile.task}"  # "classification" or "regression"\n'
                 "# z-scored; a missing value becomes the mean\n"
                 f"NUMERIC_FEATURES = {_tuple(profile.numeric)}\n"
                 "# a vocabulary each, plus one out-of-vocabulary id\n"
                 f"CATEGORICAL_FEATURES = {_tuple(profile.categorical)}\n{left_out}".rstrip("\n"))
    return (MODULE_TEMPLATE.replace("@NAME@", name).replace("@SOURCE@", source)
            .replace("@CONSTANTS@", constants))


def render_pipeline(profile: CsvProfile, name: str) -> str:
    what = "Classify" if profile.task == "classification" else "Predict"
    description = f"{what} {profile.label} from the other columns of {Path(profile.path).name}."
    return (PIPELINE_TEMPLATE.replace("@NAME@", name).replace("@DESCRIPTION@", description)
            .replace("@DATA@", repr(profile.path)).replace("@LABEL@", repr(profile.label))
            .replace("@RENAMES@", "# CSV column -> feature name, for the columns whose names cannot name a feature\n"
                     f"RENAME_COLUMNS = {_renames(profile)}\n" if profile.renamed else "")
            .replace("@RENAME_PARAM@", '                "rename_columns": RENAME_COLUMNS,\n' if profile.renamed else "")
            .replace("@NUMERIC@", _tuple(profile.numeric + ((profile.label,) if profile.task == "regression" else ())))
            .replace("@FEATURES@", _tuple((profile.label, *profile.numeric, *profile.categorical))))


def init_project(name: str, csv_path: str, label: str, directory: str = ".", dags_folder: str | None = None,
                 task: str | None = None, force: bool = False) -> tuple[CsvProfile, dict[str, str]]:
    """Profile the CSV and write the project folder: the profile, and {"pipeline"|"module"|"dag": path}."""
    check_name(name)
    profile = profile_csv(csv_path, label, task)
    folder = Path(directory).expanduser().resolve() / name
    dag_path = (Path(dags_folder).expanduser().resolve() / f"{name}.py") if dags_folder else folder / DAG_FILE
    paths = {"pipeline": folder / PIPELINE_FILE, "module": folder / MODULE_FILE, "dag": dag_path}
    existing = [str(p) for p in paths.values() if p.exists()]
    if existing and not force:
        raise SpecError(f"{', '.join(existing)} already exist(s)", hint="choose another name, or pass --force to "
                                                                         "overwrite")
    source = Path(profile.path).name
    description = f"{name}: {profile.task} of {profile.label} from {source}"
    # All three or none: an error leaves no half-written pipeline.
    files.write_texts({paths["pipeline"]: render_pipeline(profile, name),
                paths["module"]: render_module(profile, name, source),
                paths["dag"]: dag_file_text(f"{paths['pipeline']}:PIPELINE", description)})
    return profile, {kind: str(path) for kind, path in paths.items()}


PIPELINE_TEMPLATE = '''"""The @NAME@ pipeline: @DESCRIPTION@

ExampleGen -> Transform -> Trainer, written by `hpml init`; edit it freely. `hpml run @NAME@` runs it from the
folder that holds @NAME@/, and @NAME@/dag.py is its Airflow DAG.
"""
from pathlib import Path

from hpml.v1 import (EXAMPLE_GEN, TRAINER, TRAINING_CHECKS, TRANSFORM, Node, Pipeline, step_hyperparameters,
                     training_params_schema)

MODULE = str(Path(__file__).with_name("module.py"))  # preprocessing_fn and run_fn
DATA = @DATA@
LABEL = @LABEL@
@RENAMES@
PIPELINE = Pipeline(
    name="@NAME@",
    description="@DESCRIPTION@",
    params_schema=training_params_schema(DATA),
    param_checks=TRAINING_CHECKS,
    nodes=(
        Node(
            "ExampleGen", EXAMPLE_GEN,
            params=lambda p: {
                "input_path": p["data_path"],
                "required_columns": [LABEL],
                "numeric_columns": list(@NUMERIC@),
                "skip_bad_rows": p["skip_bad_rows"],
                "encoding": p["encoding"],
@RENAME_PARAM@            },
        ),
        Node(
            "Transform", TRANSFORM,
            inputs={"examples": ("ExampleGen", "examples"), "schema": ("ExampleGen", "schema")},
            params=lambda p: {
                "module": MODULE,
                "required_features": list(@FEATURES@),
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
    ),
)
'''

MODULE_TEMPLATE = '''"""The @NAME@ user module, derived from the columns of @SOURCE@: `preprocessing_fn` for Transform
and `run_fn` for Trainer. Written by `hpml init`; edit it freely.

Written against TFX's contract (FnArgs fields, tfxio dataset options) and `hpml.v1` only, so a TFX pipeline can
use it as its Transform and Trainer module_file.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf
import tensorflow_transform as tft

@CONSTANTS@
HIDDEN_UNITS = (16, 8)
DEFAULT_HYPERPARAMETERS = {"epochs": 10, "batch_size": 32, "learning_rate": 0.01, "seed": 42}


def _dense(x, default):
    """A [batch] tensor; a missing value (absent feature) becomes `default`."""
    if isinstance(x, tf.sparse.SparseTensor):
        x = tf.sparse.to_dense(
            tf.SparseTensor(x.indices, x.values, [x.dense_shape[0], 1]), default_value=default
        )
    return tf.reshape(x, [-1])


def _float(x):
    """The same tensor, dense or sparse, as float32."""
    if isinstance(x, tf.sparse.SparseTensor):
        return tf.SparseTensor(x.indices, tf.cast(x.values, tf.float32), x.dense_shape)
    return tf.cast(x, tf.float32)


def _text(x):
    """The same tensor, dense or sparse, as strings: a whole-number label's classes are its values."""
    if x.dtype == tf.string:
        return x
    if isinstance(x, tf.sparse.SparseTensor):
        return tf.SparseTensor(x.indices, tf.strings.as_string(x.values), x.dense_shape)
    return tf.strings.as_string(x)


def preprocessing_fn(inputs):
    """z-score the numbers (missing -> the mean), a vocabulary for each text column and a class label."""
    outputs = {}
    for name in NUMERIC_FEATURES:
        outputs[name] = _dense(tft.scale_to_z_score(_float(inputs[name])), 0.0)
    for name in CATEGORICAL_FEATURES:
        outputs[name] = tft.compute_and_apply_vocabulary(
            _dense(_text(inputs[name]), ""), num_oov_buckets=1, vocab_filename=name
        )
    if TASK == "classification":
        outputs[LABEL_KEY] = tft.compute_and_apply_vocabulary(_dense(_text(inputs[LABEL_KEY]), ""),
                                                              vocab_filename=LABEL_KEY)
    else:
        outputs[LABEL_KEY] = _dense(_float(inputs[LABEL_KEY]), 0.0)
    return outputs


def _label_classes(tf_transform_output) -> int:
    """The label vocabulary's size; one class leaves nothing to learn (and Keras would then score
    "accuracy" as binary accuracy, reporting 0 for a model that is always right), so it is refused."""
    from hpml.v1 import InputDataError

    classes = tf_transform_output.vocabulary_size_by_name(LABEL_KEY)
    if classes < 2:
        values = tf_transform_output.vocabulary_by_name(LABEL_KEY)
        raise InputDataError(
            f"label {LABEL_KEY!r}: the training data holds {classes} class(es) "
            f"({', '.join(v.decode() for v in values) or 'none'}); a classifier needs at least 2",
            hint="check the data path: it may hold a subset of the data",
        )
    return classes


def _head(tf_transform_output, label_stats=None):
    """The output layer, loss and metrics the task asks for. A regressor's unit-scale output is moved to the
    label's scale by `label_stats`, the training labels' (mean, standard deviation)."""
    import tf_keras

    if TASK == "classification":
        # float32 outputs whatever the policy: a mixed-precision model keeps its loss in full precision
        return (tf_keras.layers.Dense(_label_classes(tf_transform_output), activation="softmax", dtype="float32"),
                "sparse_categorical_crossentropy", ["accuracy"])
    mean, std = label_stats or (0.0, 1.0)
    head = tf_keras.Sequential([tf_keras.layers.Dense(1, dtype="float32"),
                                tf_keras.layers.Rescaling(std, offset=mean, dtype="float32")], name="head")
    return head, "mse", ["mae"]


def label_stats(dataset):
    """(mean, standard deviation) of a regression label over one pass of (features, label) batches."""
    count, total, squares = 0.0, 0.0, 0.0
    for _, labels in dataset:
        labels = tf.cast(tf.reshape(labels, [-1]), tf.float64)
        count += float(tf.size(labels))
        total += float(tf.reduce_sum(labels))
        squares += float(tf.reduce_sum(labels * labels))
    mean = total / max(count, 1.0)
    return mean, max((squares / max(count, 1.0) - mean * mean), 0.0) ** 0.5 or 1.0


def build_model(tf_transform_output, learning_rate: float, accumulation_steps: int = 1, label_stats=None):
    """A small MLP over the z-scored numbers and one-hot categories."""
    import tf_keras

    from hpml.v1 import GradientAccumulationModel

    inputs, encoded = {}, []
    for name in NUMERIC_FEATURES:
        inputs[name] = tf_keras.Input(shape=(), name=name, dtype=tf.float32)
        encoded.append(tf_keras.layers.Reshape((1,))(inputs[name]))
    for name in CATEGORICAL_FEATURES:
        depth = tf_transform_output.vocabulary_size_by_name(name) + 1
        inputs[name] = tf_keras.Input(shape=(), name=name, dtype=tf.int64)
        encoded.append(tf_keras.layers.CategoryEncoding(depth, output_mode="one_hot")(inputs[name]))
    x = tf_keras.layers.Concatenate()(encoded) if len(encoded) > 1 else encoded[0]
    for units in HIDDEN_UNITS:
        x = tf_keras.layers.Dense(units, activation="relu")(x)
    head, loss, metrics = _head(tf_transform_output, label_stats)
    outputs = head(x)
    if accumulation_steps > 1:
        model = GradientAccumulationModel(inputs, outputs, accumulation_steps=accumulation_steps)
    else:
        model = tf_keras.Model(inputs, outputs)
    model.compile(optimizer=tf_keras.optimizers.Adam(learning_rate), loss=loss, metrics=metrics)
    return model


def _feature_layer(tf_transform_output):
    import tf_keras

    depths = {name: tf_transform_output.vocabulary_size_by_name(name) + 1 for name in CATEGORICAL_FEATURES}

    class EncodeFeatures(tf_keras.layers.Layer):
        """The dict of transformed features -> one dense vector (the first pipeline stage)."""

        def call(self, features):
            numeric = [tf.reshape(tf.cast(features[n], tf.float32), [-1, 1]) for n in NUMERIC_FEATURES]
            onehot = [tf.one_hot(features[n], depths[n]) for n in CATEGORICAL_FEATURES]
            return tf.concat(numeric + onehot, axis=1)

    return EncodeFeatures(name="encode_features")


def build_pipeline_model(tf_transform_output, hp, label_stats=None):
    """The same MLP as a GPipe PipelineModel over K stages and M micro-batches."""
    import tf_keras

    from hpml.v1 import PipelineModel

    encode = _feature_layer(tf_transform_output)
    hidden = [tf_keras.layers.Dense(units, activation="relu") for units in HIDDEN_UNITS]
    head, loss, metrics = _head(tf_transform_output, label_stats)
    layers = [encode, *hidden, head]
    k = int(hp.get("pipeline_stages", 2))
    model = PipelineModel(layers, num_stages=k, num_micro_batches=int(hp.get("micro_batches", 4)),
                          balance=hp.get("balance", [2, 2] if k == 2 else [1] * k),
                          remat=hp.get("remat", "except_last"), schedule_name=hp.get("schedule", "gpipe"),
                          swap=bool(hp.get("swap", False)))
    model.compile(optimizer=tf_keras.optimizers.Adam(hp["learning_rate"]), loss=loss, metrics=metrics)
    return model


def estimate_model_memory(hyperparameters):
    """The Trainer's strategy planner asks for this: the MLP's parameters, with 8 values a category assumed."""
    from hpml.v1 import ModelMemory

    batch = int(hyperparameters.get("batch_size", DEFAULT_HYPERPARAMETERS["batch_size"]))
    widths = [len(NUMERIC_FEATURES) + 8 * len(CATEGORICAL_FEATURES), *HIDDEN_UNITS, 8]
    params = sum((a + 1) * b for a, b in zip(widths, widths[1:]))
    return ModelMemory(params=params, activation_bytes=batch * sum(widths) * 4)


def _dataset(fn_args, files, tf_transform_output, batch_size, seed, shuffle, num_epochs=1):
    from tfx_bsl.public import tfxio

    options = tfxio.TensorFlowDatasetOptions(
        batch_size=batch_size, label_key=LABEL_KEY, num_epochs=num_epochs, shuffle=shuffle, shuffle_seed=seed
    )
    dataset = fn_args.data_accessor.tf_dataset_factory(files, options, tf_transform_output.transformed_metadata.schema)
    # Shard by element across workers: a small data set may have fewer files than workers.
    sharding = tf.data.Options()
    sharding.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(sharding)


def run_fn(fn_args):
    """Train the model under the planned strategy and export it for serving raw tf.Examples."""
    import tf_keras

    from hpml.v1 import (CoordinatorValidation, InputStallProbe, epoch_size, export_serving_model, make_strategy,
                         record_pipeline_schedule, resume_training_data, standard_callbacks,
                         tune_training_step, write_classification_report, write_eval_metrics)

    hp = dict(DEFAULT_HYPERPARAMETERS, **(fn_args.hyperparameters or {}))
    config = fn_args.custom_config or {}
    strategy_name = config.get("strategy", "one_device")
    strategy = make_strategy(strategy_name)  # first: cluster strategies must precede other TF ops
    tf_keras.utils.set_random_seed(hp["seed"])
    tf_transform_output = tft.TFTransformOutput(fn_args.transform_output)
    accumulation = int(hp.get("gradient_accumulation_steps", 1))
    eval_steps = fn_args.eval_steps or None  # 0 or None: the whole eval split

    evaluation = _dataset(fn_args, fn_args.eval_files, tf_transform_output, hp["batch_size"], hp["seed"], False)
    stats = None if TASK == "classification" else label_stats(
        _dataset(fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], False))
    with strategy.scope():
        if strategy_name == "gpipe":
            model = build_pipeline_model(tf_transform_output, hp, stats)
            model(next(iter(evaluation))[0])  # create each stage's variables on its device, outside fit
        else:
            model = build_model(tf_transform_output, hp["learning_rate"], accumulation, stats)
    os.makedirs(fn_args.model_run_dir, exist_ok=True)
    # Steps per epoch must be known for BackupAndRestore to resume mid-epoch and for the PS
    # coordinator; the training data then repeats and the steps mark the epoch boundaries.
    steps, examples = fn_args.train_steps, None
    if not steps:
        steps, examples = epoch_size(
            _dataset(fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], False))
    callbacks = standard_callbacks(fn_args, strategy_name, hp["batch_size"], hp["epochs"],
                                   config.get("backup_save_freq", "epoch"), examples_per_epoch=examples)
    if strategy_name == "parameter_server":
        # The coordinator schedules steps on the workers; each worker makes its own dataset.
        train = tf_keras.utils.experimental.DatasetCreator(lambda context: _dataset(
            fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], True, None))
        local = build_model(tf_transform_output, hp["learning_rate"], label_stats=stats)  # evaluates, exports
        callbacks.insert(0, CoordinatorValidation(local, evaluation, eval_steps))
        model.fit(train, epochs=hp["epochs"], steps_per_epoch=steps, callbacks=callbacks, verbose=0)
        local.set_weights([v.numpy() for v in model.weights])
        model = local
    else:
        train = resume_training_data(  # a resumed run reads on from where its backup was taken
            _dataset(fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], True, None),
            fn_args)

        def rebuild():  # the same model, built again (under a mixed-precision policy, if the tuner measures one)
            with strategy.scope():
                return build_model(tf_transform_output, hp["learning_rate"], accumulation, stats)

        # steps_per_execution, XLA and precision, measured for this model on this machine (or pinned in hp), on a
        # twin of the training data: reading `train` itself would move its shuffle order on
        twin = _dataset(fn_args, fn_args.train_files, tf_transform_output, hp["batch_size"], hp["seed"], True, None)
        model = tune_training_step(model, twin, fn_args, hp, strategy_name=strategy_name, steps_per_epoch=steps,
                                   epochs=hp["epochs"], batch_size=hp["batch_size"], rebuild=rebuild,
                                   save_freq=config.get("backup_save_freq", "epoch"))
        if eval_steps is None:  # several steps per call need the number of steps up front, validation's too
            eval_steps = epoch_size(evaluation)[0]
        # The share of a step that waits on input, measured on the twin once the first epoch is over: the run's
        # live view shows it while the rest trains
        callbacks.append(InputStallProbe(twin, fn_args, steps_per_epoch=steps))
        model.fit(train, epochs=hp["epochs"], steps_per_epoch=steps, validation_data=evaluation,
                  validation_steps=eval_steps, callbacks=callbacks, verbose=0)
    if strategy_name == "gpipe":
        record_pipeline_schedule(model, next(iter(evaluation)), fn_args.model_run_dir)
    results = model.evaluate(evaluation, steps=eval_steps, verbose=0, return_dict=True)
    write_eval_metrics(fn_args.model_run_dir, results)
    if TASK == "classification":
        class_names = [c.decode() if isinstance(c, bytes) else c
                       for c in tf_transform_output.vocabulary_by_name(LABEL_KEY)]
        write_classification_report(fn_args.model_run_dir, model, evaluation, class_names, eval_steps)
        export_serving_model(model, tf_transform_output, fn_args.serving_model_dir, LABEL_KEY, class_names=class_names)
    else:
        export_serving_model(model, tf_transform_output, fn_args.serving_model_dir, LABEL_KEY, regression=True)
'''
