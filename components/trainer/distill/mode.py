"""The Trainer's `distill` mode: what the executor checks before training, what it hands to run_fn
(custom_config["distillation"]), and the helpers a run_fn uses to distil its student."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from hpml.components import artifacts, files
from hpml.components.errors import SpecError

CONFIG_KEY = "distillation"
CACHE_FILE = artifacts.SOFT_TARGETS_FILE  # written by SoftTargets beside the examples it augments
SOFT_TARGETS_FEATURE = "soft_targets"


@dataclass(frozen=True)
class DistillationConfig:
    """Everything run_fn needs to distil: teachers' serving dirs, T, a and where soft targets come from."""

    temperature: float
    alpha: float
    soft_targets: str  # "precomputed" (read from the examples) or "on_the_fly" (run the teachers)
    teachers: tuple[str, ...] = ()
    num_classes: int | None = None  # the cache's class count, when precomputed

    def to_dict(self) -> dict:
        return dict(asdict(self), teachers=list(self.teachers))


def read_cache(examples_uri: str) -> dict | None:
    """The SoftTargets record of an Examples artifact (temperature, num_classes, teachers), or None."""
    path = os.path.join(examples_uri, CACHE_FILE)
    if not files.isfile(path):
        return None
    return json.loads(files.read_text(path))


def teacher_serving_dir(model_uri: str) -> str:
    """A teacher Model artifact's SavedModel; a missing one is refused naming the artifact."""
    serving = artifacts.serving_model_path(model_uri)
    if not os.path.isfile(os.path.join(serving, "saved_model.pb")):
        raise SpecError(f"teacher Model artifact {model_uri} has no SavedModel ({serving}/saved_model.pb is missing)",
                        hint="train the teacher first, or fix the teacher Model artifact URI")
    return serving


def plan(examples_uri: str, teachers: list[str] | None, params) -> DistillationConfig | None:
    """Check a distill request before any training and say where its soft targets come from."""
    teachers = list(teachers or [])
    if params["mode"] != "distill":
        if teachers:
            raise SpecError("Trainer: teachers are wired in but mode is 'train'", hint="set mode='distill'")
        return None
    cache = read_cache(examples_uri)
    source = params["soft_targets"]
    if source == "auto":
        source = "precomputed" if cache else "on_the_fly"
    if source == "precomputed":
        if cache is None:
            raise SpecError(f"Trainer: soft_targets='precomputed' but {examples_uri} carries no soft targets",
                            hint="run SoftTargets on the transformed examples, or use soft_targets='on_the_fly'")
        if abs(cache["temperature"] - params["temperature"]) > 1e-9:
            raise SpecError(f"Trainer: the soft targets in {examples_uri} were computed at T={cache['temperature']}, "
                            f"but temperature={params['temperature']}",
                            hint="use the cache's temperature, recompute the cache, or soft_targets='on_the_fly'")
        serving = [teacher_serving_dir(t) for t in teachers]
        return DistillationConfig(float(params["temperature"]), float(params["alpha"]), "precomputed",
                                  tuple(serving), int(cache["num_classes"]))
    if not teachers:
        raise SpecError("Trainer: mode='distill' needs at least one teacher Model artifact (input 'teachers')",
                        hint="wire the teachers' Trainer model outputs into this Trainer")
    serving = [teacher_serving_dir(t) for t in teachers]
    return DistillationConfig(float(params["temperature"]), float(params["alpha"]), "on_the_fly", tuple(serving))


def config_from(custom_config: dict | None) -> DistillationConfig | None:
    """The distillation request the Trainer put in FnArgs.custom_config, if any."""
    raw = (custom_config or {}).get(CONFIG_KEY)
    return DistillationConfig(**dict(raw, teachers=tuple(raw["teachers"]))) if raw else None


def schema_with_soft_targets(schema, config: DistillationConfig | None):
    """The example schema plus the float soft_targets feature [num_classes], when soft targets are precomputed."""
    if config is None or config.soft_targets != "precomputed":
        return schema
    from tensorflow_metadata.proto.v0 import schema_pb2

    extended = schema_pb2.Schema()
    extended.CopyFrom(schema)
    feature = extended.feature.add(name=SOFT_TARGETS_FEATURE, type=schema_pb2.FLOAT)
    feature.shape.dim.add(size=config.num_classes)
    feature.presence.min_fraction = 1.0  # every example carries them: a fixed-shape dense feature
    return extended


def build_distiller(student, config: DistillationConfig, sample_features):
    """A Distiller around the run_fn's student (which outputs logits), refusing before training a
    teacher or a soft-target cache whose classes do not match the student's."""
    from hpml.components.trainer.distill.distiller import SOFT_TARGETS_KEY, Distiller, check_teachers

    features = {k: v for k, v in sample_features.items() if k != SOFT_TARGETS_KEY} \
        if isinstance(sample_features, dict) else sample_features
    classes = int(student(features, training=False).shape[-1])
    if config.soft_targets == "precomputed":
        if config.num_classes != classes:
            raise SpecError(f"the soft targets hold {config.num_classes} classes but the student predicts {classes}")
        teachers = []
    else:
        teachers = check_teachers(list(config.teachers), classes, features)
    distiller = Distiller(student, teachers, temperature=config.temperature, alpha=config.alpha)
    distiller(features, training=False)  # built before fit, as BackupAndRestore needs
    return distiller


def student_for_serving(student):
    """The student with a softmax on its logits, so its Model artifact serves probabilities like any other."""
    import tf_keras

    return tf_keras.Model(student.input, tf_keras.layers.Softmax(name="probabilities")(student.output))
