"""Tuned steps kept between runs on this machine, under a key of the model, the batch, the device and TensorFlow."""
from __future__ import annotations

import hashlib
import json
import logging
import os

from hpml.components import files
from hpml.components.trainer.step_tuning.knobs import Device, StepTuning

log = logging.getLogger("hpml.trainer")


def cache_key(model, batch_size: int, device: Device, extra: str = "") -> str:
    """The same model shape, data and device: its variables' shapes and dtypes, its layers, the optimizer and loss,
    the batch size, the device and TensorFlow's version (and `extra`: the data's element spec, the pinned knobs)."""
    import tensorflow as tf

    parts = [f"{tuple(v.shape)}:{v.dtype.name}" for v in model.variables]  # not names: Keras numbers each model's
    parts += [type(layer).__name__ for layer in getattr(model, "layers", [])]
    parts += [type(model).__name__, type(model.optimizer).__name__, str(getattr(model, "loss", "")), str(batch_size),
              device.describe(), tf.__version__, extra]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def read_cache(cache_dir: str | None, key: str) -> StepTuning | None:
    if not cache_dir:
        return None
    try:
        with open(os.path.join(cache_dir, f"{key}.json"), encoding="utf-8") as handle:
            return StepTuning.from_dict(json.load(handle))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_cache(cache_dir: str | None, key: str, tuning: StepTuning) -> None:
    if not cache_dir:
        return
    try:
        files.write_text(os.path.join(cache_dir, f"{key}.json"), json.dumps(tuning.to_dict(), indent=2))
    except OSError as err:  # a cache that cannot be written costs a measurement next time, nothing else
        log.warning("the tuned step could not be cached in %s: %s", cache_dir, err)


def default_cache_dir() -> str:
    """Where tuned steps are kept between runs on this machine: `$XDG_CACHE_HOME/hpml/tuned_steps`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hpml", "tuned_steps")
