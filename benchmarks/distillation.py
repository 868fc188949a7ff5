"""Distillation results on scikit-learn's 8x8 digits (ships with the package; nothing downloaded).

Rows: teacher, 3-teacher ensemble, student from scratch, student distilled from the teacher and
from the ensemble. Columns: test accuracy (mean +- std over 3 seeds), parameters, SavedModel size,
latency per example. Also times student epochs with soft targets computed on the fly vs
precomputed. Writes benchmarks/distillation.md (quoted by the README) and logs it to MLflow.

    python benchmarks/distillation.py
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from benchmarks._common import RESULTS, machine  # noqa: E402

# (T, a, student activation), chosen on a validation split, never on test. The student is the
# ReLU MLP of the pipeline; a tanh student from scratch is measured as a reference row.
GRID = [(t, a, "relu") for t in (2.0, 4.0, 8.0) for a in (0.5, 0.9)]
ACTIVATION = "relu"
SEEDS = (0, 1, 2)
TEACHERS_PER_ENSEMBLE = 3
STUDENT_HIDDEN = 32
EPOCHS = 60
TEACHER_EPOCHS = 30  # over the train split and its four one-pixel shifts (5x the examples)


def _data():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    return train_test_split(x, digits.target, test_size=0.3, random_state=0, stratify=digits.target)


def _teacher(seed):
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    model = tf_keras.Sequential([
        tf_keras.layers.Dense(512, activation="relu", input_shape=(64,)), tf_keras.layers.Dropout(0.3),
        tf_keras.layers.Dense(512, activation="relu"), tf_keras.layers.Dropout(0.3),
        tf_keras.layers.Dense(10, activation="softmax")])
    model.compile(tf_keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _augmented(x, y):
    """The train split plus its one-pixel shifts, as the pipeline's teachers see it (digits_module.SHIFTS)."""
    import tensorflow as tf

    from pipelines.digits_module import SHIFTS, shift_pixels

    images = np.concatenate([shift_pixels(tf.constant(x), dx, dy).numpy() for dx, dy in SHIFTS])
    return images.astype("float32"), np.tile(y, len(SHIFTS))


def _fit_teacher(seed, x, y):
    teacher = _teacher(seed)
    teacher.fit(*_augmented(x, y), batch_size=64, epochs=TEACHER_EPOCHS, verbose=0)
    return teacher


def _scratch(seed, x, y, activation=None):
    import tf_keras

    model = _student(seed, activation)
    model.compile(tf_keras.optimizers.Adam(1e-2), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=64, epochs=EPOCHS, verbose=0)
    return model


def _student(seed, activation=None):
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    return tf_keras.Sequential([tf_keras.layers.Dense(STUDENT_HIDDEN, activation=activation or ACTIVATION,
                                                      input_shape=(64,)),
                                tf_keras.layers.Dense(10)])  # logits


def _accuracy(predict, x, y) -> float:
    return float(np.mean(np.argmax(predict(x), axis=1) == y))


def _size_and_latency(model, x) -> tuple[float, float]:
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        model.save(tmp, save_format="tf")
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(tmp) for f in files)
    fn = tf.function(lambda inp: model(inp, training=False))
    batch = tf.constant(x[:256])
    fn(batch)
    times = []
    for _ in range(20):
        start = time.perf_counter()
        fn(batch).numpy()
        times.append(time.perf_counter() - start)
    return size / 1024, statistics.median(times) / 256 * 1e6


def _distill(student, teachers, x, y, temperature, alpha, seed, epochs=EPOCHS):
    """Precompute the teachers' soft targets once, then train the student on them."""
    import tensorflow as tf
    import tf_keras

    from components.trainer.distill.distiller import Distiller

    targets = Distiller(student, teachers, temperature=temperature).soft_targets(tf.constant(x)).numpy()
    cached = Distiller(student, [], temperature=temperature, alpha=alpha)
    cached.compile(tf_keras.optimizers.Adam(1e-2))
    data = tf.data.Dataset.from_tensor_slices(((x, targets), y)).shuffle(2048, seed=seed).batch(64)
    cached.fit(data, epochs=epochs, verbose=0)
    return cached, data


def _choose_temperature_and_alpha(x_train, y_train):
    """Grid over (T, a), scored on 20% of the train split held out, with a teacher trained on the rest."""
    from sklearn.model_selection import train_test_split

    x_fit, x_val, y_fit, y_val = train_test_split(x_train, y_train, test_size=0.2, random_state=1, stratify=y_train)
    teacher = _fit_teacher(999, x_fit, y_fit)
    scores = {}
    for temperature, alpha, activation in GRID:
        student, _ = _distill(_student(999, activation), [teacher], x_fit, y_fit, temperature, alpha, 999)
        scores[(temperature, alpha, activation)] = _accuracy(student.student.predict, x_val, y_val)
        print(f"validation T={temperature} a={alpha} {activation}: {scores[(temperature, alpha, activation)]:.4f}",
              flush=True)
    return max(scores, key=scores.get), scores


def main() -> None:
    import tensorflow as tf
    import tf_keras

    from components.trainer.distill.distiller import Distiller

    x_train, x_test, y_train, y_test = _data()
    global TEMPERATURE, ALPHA, ACTIVATION
    (TEMPERATURE, ALPHA, ACTIVATION), validation = _choose_temperature_and_alpha(x_train, y_train)
    acc = {name: [] for name in ("teacher", "ensemble", "scratch", "scratch_tanh", "distilled_teacher",
                                 "distilled_ensemble")}
    sizes, speed = {}, {"on_the_fly": [], "precomputed": []}
    for seed in SEEDS:
        teachers = []
        for i in range(TEACHERS_PER_ENSEMBLE):
            teachers.append(_fit_teacher(100 * seed + i, x_train, y_train))
        acc["teacher"].append(_accuracy(teachers[0].predict, x_test, y_test))
        acc["ensemble"].append(_accuracy(lambda x: np.mean([t.predict(x, verbose=0) for t in teachers], 0),
                                         x_test, y_test))
        scratch = _scratch(seed, x_train, y_train)
        acc["scratch"].append(_accuracy(scratch.predict, x_test, y_test))
        acc["scratch_tanh"].append(_accuracy(_scratch(seed, x_train, y_train, "tanh").predict, x_test, y_test))
        for name, group in (("distilled_teacher", teachers[:1]), ("distilled_ensemble", teachers)):
            cached, data = _distill(_student(seed), group, x_train, y_train, TEMPERATURE, ALPHA, seed)
            acc[name].append(_accuracy(cached.student.predict, x_test, y_test))
            if name == "distilled_ensemble":
                distiller = Distiller(cached.student, group, temperature=TEMPERATURE, alpha=ALPHA)
                distiller.compile(tf_keras.optimizers.Adam(1e-2))
                for mode, model, feed in (("on_the_fly", distiller, (x_train, y_train)), ("precomputed", cached, data)):
                    start = time.perf_counter()
                    if mode == "on_the_fly":
                        model.fit(*feed, batch_size=64, epochs=5, verbose=0)
                    else:
                        model.fit(feed, epochs=5, verbose=0)
                    speed[mode].append((time.perf_counter() - start) / 5)
        if seed == SEEDS[0]:
            sizes["teacher"] = (teachers[0].count_params(),) + _size_and_latency(teachers[0], x_test)
            sizes["student"] = (scratch.count_params(),) + _size_and_latency(scratch, x_test)
        print(f"seed {seed}: " + ", ".join(f"{k}={v[-1]:.4f}" for k, v in acc.items()), flush=True)

    mean = {k: statistics.mean(v) for k, v in acc.items()}
    std = {k: statistics.pstdev(v) for k, v in acc.items()}
    gap = {src: (mean[f"distilled_{src}"] - mean["scratch"]) / max(mean[src] - mean["scratch"], 1e-9)
           for src in ("teacher", "ensemble")}
    gap_tanh = {src: (mean[f"distilled_{src}"] - mean["scratch_tanh"]) / max(mean[src] - mean["scratch_tanh"], 1e-9)
                for src in ("teacher", "ensemble")}
    slow = statistics.median(speed["on_the_fly"]) / statistics.median(speed["precomputed"])
    t_params, t_kib, t_us = sizes["teacher"]
    s_params, s_kib, s_us = sizes["student"]
    ensemble_params = t_params * TEACHERS_PER_ENSEMBLE
    rows = [
        ("teacher (MLP 512x512)", "teacher", t_params, t_kib, t_us),
        (f"ensemble of {TEACHERS_PER_ENSEMBLE} teachers", "ensemble", ensemble_params,
         t_kib * TEACHERS_PER_ENSEMBLE, t_us * TEACHERS_PER_ENSEMBLE),
        (f"student from scratch (MLP {STUDENT_HIDDEN}, {ACTIVATION})", "scratch", s_params, s_kib, s_us),
        (f"reference: student from scratch with tanh (MLP {STUDENT_HIDDEN})", "scratch_tanh", s_params, s_kib, s_us),
        ("student distilled from the teacher", "distilled_teacher", s_params, s_kib, s_us),
        ("student distilled from the ensemble", "distilled_ensemble", s_params, s_kib, s_us),
    ]
    chosen = ", ".join(f"T={t} a={a} {act}: {100 * v:.1f}%" for (t, a, act), v in validation.items())
    lines = [f"Digits 8x8 (scikit-learn), 30% stratified test split; accuracy over seeds {list(SEEDS)}. Teachers: "
             f"MLP 512x512 with dropout 0.3, {TEACHER_EPOCHS} epochs over the train split and its one-pixel shifts "
             f"(Hinton et al.'s jitter). Students: MLP {STUDENT_HIDDEN}, {ACTIVATION}, {EPOCHS} epochs over the "
             f"unshifted train split, no regularisation. T={TEMPERATURE}, a={ALPHA} chosen on a validation split of "
             f"the train data ({chosen}).", "",
             "| model | test accuracy | parameters | SavedModel | latency / example |", "|---|---|---|---|---|"]
    for label, key, params, kib, us in rows:
        lines.append(f"| {label} | {100 * mean[key]:.2f}% ± {100 * std[key]:.2f} | {params:,} | {kib:.0f} KiB "
                     f"| {us:.2f} µs |")
    lines += ["",
              f"Student / teacher parameters: {s_params / t_params:.3f} (target ≤ 0.1).",
              f"Gap closed (distilled − scratch) / (teacher − scratch): from the teacher {100 * gap['teacher']:.0f}%, "
              f"from the ensemble (vs the ensemble's accuracy) {100 * gap['ensemble']:.0f}% (target ≥ 50%).",
              f"Against the tanh reference row instead of the same ReLU student: from the teacher "
              f"{100 * gap_tanh['teacher']:.0f}%, from the ensemble {100 * gap_tanh['ensemble']:.0f}%.",
              f"Soft targets: an epoch with teachers run on the fly takes {slow:.1f}x as long as with precomputed "
              f"targets (median of {len(speed['precomputed'])} seeds x 5 epochs).",
              "Latency: a batch of 256 through the model's tf.function on this CPU, divided by 256; the ensemble "
              "row is 3x one teacher."]
    table = "\n".join(lines) + "\n"
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distillation.md")
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "distillation.json").write_text(json.dumps(
        {"machine": machine(), "accuracy": acc, "mean": mean, "std": std, "gap_closed": gap,
         "gap_closed_vs_tanh_reference": gap_tanh,
         "on_the_fly_over_precomputed": slow, "sizes": sizes}, indent=2))
    _log_to_mlflow(table, mean, gap, slow)
    print(table)


def _log_to_mlflow(table, mean, gap, slow):
    from pipelines import records

    mlflow_client = records.client()
    run_id = records.start("distillation", f"digits_{time.strftime('%Y%m%dT%H%M%S')}",
                           {"temperature": TEMPERATURE, "alpha": ALPHA, "student_hidden": STUDENT_HIDDEN, "activation": ACTIVATION,
                            "epochs": EPOCHS, "teacher_epochs": TEACHER_EPOCHS, "teachers": TEACHERS_PER_ENSEMBLE}, {"hpml.kind": "benchmark"})
    for key, value in mean.items():
        mlflow_client.log_metric(run_id, f"accuracy.{key}", value)
    for key, value in gap.items():
        mlflow_client.log_metric(run_id, f"gap_closed.{key}", value)
    mlflow_client.log_metric(run_id, "soft_targets.on_the_fly_over_precomputed", slow)
    mlflow_client.log_text(run_id, table, "distillation.md")
    records.finish(run_id)


if __name__ == "__main__":
    main()
