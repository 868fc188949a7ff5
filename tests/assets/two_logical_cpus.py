"""Train the penguin model with Mirrored and with CentralStorage on exactly 2 logical CPU devices.

Run as a subprocess: the test session itself configures 4 logical CPUs, and TensorFlow fixes the
device count when it initialises. Prints one JSON line: per strategy, its replicas and losses.
    python tests/assets/two_logical_cpus.py EXAMPLES TRANSFORM_GRAPH SCHEMA OUT_DIR
"""
import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)

from hpml.components.trainer import TRAINER  # noqa: E402
from hpml.components.trainer.strategies import make_strategy  # noqa: E402

examples, graph, schema, out_dir = sys.argv[1:5]
results = {}
for strategy in ("mirrored", "central_storage"):
    props = TRAINER.run(
        {"examples": examples, "transform_graph": graph, "schema": schema},
        {"model": os.path.join(out_dir, strategy, "model"), "model_run": os.path.join(out_dir, strategy, "run")},
        {"module": "hpml.examples.penguin.module", "strategy": strategy,
         "hyperparameters": {"epochs": 3, "batch_size": 16}})
    results[strategy] = {"replicas": make_strategy(strategy).num_replicas_in_sync,
                         "plan": props["plan"]["strategy"], "losses": [row["loss"] for row in props["history"]]}
print("RESULTS " + json.dumps(results))
