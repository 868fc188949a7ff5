"""Evaluator executor: each Model's serving signature scores the same raw eval examples.

Per row: accuracy, parameter count, SavedModel size on disk and serving latency per example
(a batch of raw serialized examples through the signature: parse, transform and model). An
ensemble row averages its members' probabilities; its size, parameters and latency are the sums.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any
from collections.abc import Mapping

import numpy as np

from hpml.components import artifacts, files, publishing
from hpml.components.errors import InputDataError, SpecError
from hpml.components.evaluator.record import run_record
from hpml.components.results import RECORD_KEY

RESULTS_JSON, RESULTS_MD = artifacts.EVALUATION_FILE, artifacts.EVALUATION_TABLE_FILE


def _label_text(example, label_key: str, where: str) -> str:
    feature = example.features.feature.get(label_key)
    if feature is None:
        raise InputDataError(f"{where}: an example has no label feature {label_key!r}")
    kind = feature.WhichOneof("kind")
    values = getattr(feature, kind).value if kind else []
    if len(values) != 1:
        raise InputDataError(f"{where}: label {label_key!r} must hold exactly one value, got {list(values)}")
    value = values[0]
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_split(examples_uri: str, split: str, label_key: str) -> tuple[list[bytes], np.ndarray]:
    import tensorflow as tf

    pattern = artifacts.examples_file_pattern(examples_uri, split)
    shards = artifacts.require_files(pattern, f"Evaluator split {split}")
    serialized = [r.numpy() for r in tf.data.TFRecordDataset(shards, compression_type="GZIP")]
    labels = [_label_text(tf.train.Example.FromString(r), label_key, pattern) for r in serialized]
    return serialized, np.array(labels)


def _directory_bytes(path: str) -> int:
    return sum(size for _, size in files.walk_files(path))


class _Scored:
    """One model's outputs on the split, plus what it costs to keep and to call."""

    def __init__(self, model_uri: str, serialized: list[bytes], latency_batch: int, repeats: int):
        import tensorflow as tf
        import tf_keras

        serving = artifacts.serving_model_path(model_uri)
        if not files.isfile(os.path.join(serving, "saved_model.pb")):
            raise SpecError(f"Evaluator: Model artifact {model_uri} has no SavedModel at {serving}")
        loaded = tf.saved_model.load(serving)
        signature = loaded.signatures["serving_default"]
        outputs = signature(examples=tf.constant(serialized))
        if "classes" not in outputs or "probabilities" not in outputs:
            raise SpecError(f"Evaluator: {serving}'s serving signature must return 'classes' and 'probabilities'")
        self.probabilities = outputs["probabilities"].numpy()
        self.classes = np.array([c.decode() for c in outputs["classes"].numpy()])
        self.params = int(tf_keras.models.load_model(serving, compile=False).count_params())
        self.size_bytes = _directory_bytes(serving)
        batch = tf.constant((serialized * (latency_batch // max(len(serialized), 1) + 1))[:latency_batch])
        signature(examples=batch)  # warm up
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            signature(examples=batch)["probabilities"].numpy()
            times.append(time.perf_counter() - started)
        self.latency_us = statistics.median(times) / latency_batch * 1e6
        self.column_names = _column_names(loaded, outputs["class_ids"].numpy(), self.classes)


def _column_names(loaded, class_ids: np.ndarray, classes: np.ndarray) -> dict[int, str]:
    """Probability column -> class name: from the model's class-names signature when it has one;
    otherwise only the columns some row's argmax names are known."""
    if artifacts.CLASS_NAMES_SIGNATURE in loaded.signatures:
        names = loaded.signatures[artifacts.CLASS_NAMES_SIGNATURE]()["class_names"].numpy()
        return {i: name.decode() for i, name in enumerate(names)}
    return {int(i): name for i, name in zip(class_ids, classes)}


def _table(rows: list[dict], gap: dict | None) -> str:
    lines = ["| model | accuracy | parameters | SavedModel | latency / example |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['name']} | {100 * row['accuracy']:.2f}% | {row['params']:,} "
                     f"| {row['size_bytes'] / 1024:.0f} KiB | {row['latency_us']:.2f} µs |")
    if gap:
        lines += ["", f"Gap closed by distillation: {100 * gap['gap_closed']:.0f}% "
                      f"((distilled − scratch) / (teacher − scratch) = ({100 * gap['distilled']:.2f} − "
                      f"{100 * gap['scratch']:.2f}) / ({100 * gap['teacher']:.2f} − {100 * gap['scratch']:.2f})); "
                      f"student / teacher parameters: {gap['param_ratio']:.3f}."]
    return "\n".join(lines) + "\n"


def _gap(rows: dict[str, dict], names: Mapping[str, str]) -> dict | None:
    if not names:
        return None
    missing = [names.get(k) for k in ("teacher", "scratch", "distilled") if names.get(k) not in rows]
    if missing:
        raise SpecError(f"Evaluator: distillation names unknown rows {missing}", hint=f"rows: {', '.join(rows)}")
    teacher, scratch, distilled = (rows[names[k]] for k in ("teacher", "scratch", "distilled"))
    span = teacher["accuracy"] - scratch["accuracy"]
    return {"teacher": teacher["accuracy"], "scratch": scratch["accuracy"], "distilled": distilled["accuracy"],
            "gap_closed": (distilled["accuracy"] - scratch["accuracy"]) / span if span else float("nan"),
            "param_ratio": distilled["params"] / teacher["params"]}


def _ensemble_row(name: str, members: list[_Scored], member_rows: list[dict | None], labels) -> dict:
    """Average the members' probabilities; sizes, parameters and latencies add up."""
    rows = [row for row in member_rows if row is not None]
    if len(rows) < len(member_rows):
        raise SpecError(f"Evaluator: ensemble {name!r} must list its members in model order")
    averaged = np.mean([m.probabilities for m in members], axis=0)
    columns: dict[int, str] = {}
    for member in members:
        for column, label in member.column_names.items():
            if columns.setdefault(column, label) != label:
                raise SpecError(f"Evaluator: ensemble {name!r} averages members that disagree on probability "
                                f"column {column} ({columns[column]!r} vs {label!r})",
                                hint="ensemble only models trained on the same label vocabulary")
    unnamed = sorted(set(averaged.argmax(axis=1).tolist()) - set(columns))
    if unnamed:
        raise SpecError(f"Evaluator: ensemble {name!r} predicts probability column(s) {unnamed}, whose class no "
                        "member names", hint="export the members with class_names (export_serving_model) so "
                        f"their SavedModels carry a {artifacts.CLASS_NAMES_SIGNATURE!r} signature")
    predicted = np.array([columns[int(i)] for i in averaged.argmax(axis=1)])
    return {"name": name, "accuracy": float(np.mean(predicted == labels)),
            **{k: sum(row[k] for row in rows) for k in ("params", "size_bytes", "latency_us")}}


def run(inputs: Mapping[str, Any], outputs: Mapping[str, str], params: Mapping[str, Any]) -> dict:
    names = list(params["model_names"])
    if len(names) != len(inputs["models"]) or len(set(names)) != len(names):
        raise SpecError(f"Evaluator: model_names {names} must name each of the {len(inputs['models'])} models once")
    for ensemble, members in params["ensembles"].items():
        unknown = sorted(set(members) - set(names))
        if unknown or ensemble in names:
            raise SpecError(f"Evaluator: ensemble {ensemble!r} names unknown models {unknown}" if unknown
                            else f"Evaluator: ensemble {ensemble!r} has the name of a model")
    serialized, labels = _read_split(inputs["examples"], params["split"], params["label_key"])
    scored = {name: _Scored(uri, serialized, params["latency_batch"], params["latency_repeats"])
              for name, uri in zip(names, inputs["models"])}
    rows: dict[str, dict] = {}
    for name in names:  # an ensemble's row follows its last member's
        s = scored[name]
        rows[name] = {"name": name, "accuracy": float(np.mean(s.classes == labels)), "params": s.params,
                      "size_bytes": s.size_bytes, "latency_us": s.latency_us}
        for ensemble, members in params["ensembles"].items():
            if members[-1] == name:
                rows[ensemble] = _ensemble_row(ensemble, [scored[m] for m in members],
                                               [rows.get(m) for m in members], labels)
    gap = _gap(rows, params["distillation"])
    result = {"split": params["split"], "examples": len(labels), "rows": list(rows.values()), "distillation": gap}
    with publishing.publish(outputs["evaluation"]) as out_dir:
        files.write_text(os.path.join(out_dir, RESULTS_JSON), json.dumps(result, indent=2))
        files.write_text(os.path.join(out_dir, RESULTS_MD), _table(result["rows"], gap))
    return {"evaluation": result, RECORD_KEY: run_record({"evaluation": result}).to_json()}
