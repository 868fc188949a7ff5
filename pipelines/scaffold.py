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
import re
from dataclasses import dataclass
from pathlib import Path

from hpml.components import files
from hpml.components.errors import InputDataError, SpecError
from hpml.components.example_gen.text_encoding import DEFAULT_ENCODING
from hpml.pipelines.airflow.dag_file import dag_file_text
from hpml.pipelines.discovery import PIPELINE_FILE
from hpml.pipelines.templates import render

MODULE_FILE = "module.py"
DAG_FILE = "dag.py"
PIPELINE_TEMPLATE, MODULE_TEMPLATE = "pipeline.py.tmpl", "module.py.tmpl"  # in hpml.pipelines.templates
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


@dataclass
class _ColumnScan:
    """What one pass over a CSV's rows finds in each column: up to MAX_CLASSES + 1 distinct values, and whether
    every value is a number and a whole one."""
    header: list[str]
    values: list[set[str]]
    numeric: list[bool]
    whole: list[bool]
    rows: int = 0

    def add(self, row: list[str]) -> None:
        self.rows += 1
        for i, cell in enumerate(row):
            if cell in MISSING:
                continue
            if len(self.values[i]) <= MAX_CLASSES:
                self.values[i].add(cell)
            if self.numeric[i] and not _is_number(cell):
                self.numeric[i] = False
            if self.whole[i] and self.numeric[i] and not float(cell).is_integer():
                self.whole[i] = False


def _scan(path: str, encoding: str) -> _ColumnScan:
    """Read the whole CSV once; a malformed row fails with its line number."""
    codec = "utf-8-sig" if encoding.lower().replace("_", "-") in ("utf-8", "utf8") else encoding
    try:
        with files.open_text(path, codec, newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if not header or not any(cell.strip() for cell in header):
                raise InputDataError(f"{path}: the file is empty; hpml init needs a header row and data rows")
            scan = _ColumnScan(header, [set() for _ in header], [True] * len(header), [True] * len(header))
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
                scan.add(row)
    except UnicodeDecodeError as err:
        raise InputDataError(f"{path}: not {encoding} text ({err.reason} at byte {err.start})",
                             hint="pass --encoding, e.g. latin-1 or cp1252") from None
    return scan


def _feature_header(path: str, header: list[str], label: str) -> tuple[list[str], str, tuple]:
    """The header as feature names, the label's feature name, and the (column, feature) pairs renamed; a
    repeated column or a label that is not a column is refused."""
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
    return features, features[header.index(label)], renamed


def _label_task(path: str, label: str, values: set[str], numeric: bool, whole: bool, task: str | None) -> str:
    """The task the label asks for (or the one asked, checked against the label's values)."""
    if not values:
        raise InputDataError(f"{path}: label {label!r} has no value in any row")
    if task is None:
        task = "classification" if not numeric or (whole and len(values) <= MAX_CLASSES) else "regression"
    if task == "regression" and not numeric:
        raise InputDataError(f"{path}: label {label!r} holds text (e.g. {sorted(values)[0]!r}), so it cannot be "
                             "a regression target", hint="leave out --task, or choose a numeric label")
    if task == "classification" and len(values) < 2:
        raise InputDataError(f"{path}: label {label!r} has one value ({next(iter(values))!r}) in every row; a "
                             "classifier needs at least 2", hint="choose another label column")
    return task


def profile_csv(path: str, label: str, task: str | None = None, encoding: str = DEFAULT_ENCODING) -> CsvProfile:
    """Read the whole CSV once: each column's kind, and the task its label asks for."""
    if not files.isfile(path):
        raise InputDataError(f"{path}: no such file", hint="--csv takes the path or URL (gs://, s3://) of a CSV "
                                                           "file with a header row")
    scan = _scan(path, encoding)
    header, label, renamed = _feature_header(path, scan.header, label)
    if scan.rows == 0:
        raise InputDataError(f"{path}: the file has a header but no data rows")
    at, values, numeric = header.index(label), scan.values, scan.numeric
    task = _label_task(path, label, values[at], numeric[at], scan.whole[at], task)
    features = [i for i in range(len(header)) if i != at]
    return CsvProfile(
        path=path if files.is_url(path) else str(Path(path).resolve()), label=label, task=task, rows=scan.rows,
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
    return render(MODULE_TEMPLATE, {"NAME": name, "SOURCE": source, "CONSTANTS": constants})


def render_pipeline(profile: CsvProfile, name: str) -> str:
    what = "Classify" if profile.task == "classification" else "Predict"
    description = f"{what} {profile.label} from the other columns of {Path(profile.path).name}."
    renamed = profile.renamed
    return render(PIPELINE_TEMPLATE, {
        "NAME": name, "DESCRIPTION": description, "DATA": repr(profile.path), "LABEL": repr(profile.label),
        "RENAMES": ("# CSV column -> feature name, for the columns whose names cannot name a feature\n"
                    f"RENAME_COLUMNS = {_renames(profile)}\n") if renamed else "",
        "RENAME_PARAM": '                "rename_columns": RENAME_COLUMNS,\n' if renamed else "",
        "NUMERIC": _tuple(profile.numeric + ((profile.label,) if profile.task == "regression" else ())),
        **_shipping(profile, name),
        "FEATURES": _tuple((profile.label, *profile.numeric, *profile.categorical))})


def _shipping(profile: CsvProfile, name: str) -> dict[str, str]:
    """The pipeline ends with the Gate and the Pusher: a classifier gated on accuracy, a regressor on R^2."""
    names = ["EXAMPLE_GEN", "TRAINER", "TRAINING_CHECKS", "TRANSFORM", "Node", "Pipeline", "shipping_nodes",
             "step_hyperparameters", "training_params_schema", "with_shipping_params"]
    lines, line = [], "from hpml.v1 import ("
    for index, imported in enumerate(names):
        piece = imported + (", " if index < len(names) - 1 else ")")
        if len(line) + len(piece.rstrip()) > 120:
            lines.append(line.rstrip())
            line = " " * len("from hpml.v1 import (")
        line += piece
    task = "" if profile.task == "classification" else ', task="regression"'
    return {"CHAIN": "ExampleGen -> Transform -> Trainer -> Gate -> Pusher",
            "IMPORTS": "\n".join([*lines, line]),
            "SCHEMA": f"with_shipping_params(training_params_schema(DATA){task})",
            "SHIPPING": f'        *shipping_nodes("{name}", LABEL{task}),\n'}


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
