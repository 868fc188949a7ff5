"""TFX 1.16's model evaluation (TFMA's `run_model_analysis`, which TFX's Evaluator runs) scoring a SavedModel that
hpml exported, timed; run by gate.py with .venv-tfx's Python.

The same metrics as hpml's Gate (accuracy and log loss) on the same raw eval split, through the same serving
signature, with the transformed label from the model's `transform_features` signature, on Beam's in-process
DirectRunner. With a champion, the same SavedModel again as TFMA's baseline model. Prints one JSON line:
{"seconds", "accuracy", "loss"}; the seconds exclude importing TFMA, as gate.py's do for hpml.

    .venv-tfx/bin/python benchmarks/tfma_gate.py SERVING_MODEL_DIR EVAL_FILE_PATTERN LABEL_KEY OUT_DIR [champion]
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow_model_analysis as tfma


def main(model: str, pattern: str, label_key: str, out: str, champion: str = "") -> None:
    started = time.perf_counter()
    names = ["candidate", "champion"] if champion else ["candidate"]
    specs = [tfma.ModelSpec(name=name, is_baseline=name == "champion", signature_name="serving_default",
                            label_key=label_key, preprocessing_function_names=["transform_features"],
                            prediction_key="probabilities") for name in names]
    config = tfma.EvalConfig(model_specs=specs, slicing_specs=[tfma.SlicingSpec()], metrics_specs=[tfma.MetricsSpec(
        metrics=[tfma.MetricConfig(class_name="SparseCategoricalAccuracy"),
                 tfma.MetricConfig(class_name="SparseCategoricalCrossentropy")])])
    shared = [tfma.default_eval_shared_model(eval_saved_model_path=model, eval_config=config, model_name=name)
              for name in names]
    result = tfma.run_model_analysis(eval_shared_model=shared if champion else shared[0], eval_config=config,
                                     data_location=pattern, file_format="tfrecords", output_path=out)
    seconds = time.perf_counter() - started
    if champion:  # a result for each model; the two are one SavedModel, so either's metrics do
        result = result.get_results()[0]
    metrics = result.slicing_metrics[0][1][""][""]
    print(json.dumps({"seconds": seconds, "accuracy": metrics["sparse_categorical_accuracy"]["doubleValue"],
                      "loss": metrics["sparse_categorical_crossentropy"]["doubleValue"]}))


if __name__ == "__main__":
    main(*sys.argv[1:6])
