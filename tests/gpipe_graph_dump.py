"""Runs one PipelineModel train step per case given on the command line, with TensorFlow dumping
each function graph as its runtime executes it, that is after Grappler's rewrites.

Usage: python -m tests.gpipe_graph_dump DUMP_DIR K,M,REMAT,SWAP,SCHEDULE ...
The dump needs the environment set before TensorFlow loads, hence a process of its own.
"""
import os
import sys

DUMP_DIR, CASES = sys.argv[1], sys.argv[2:]
os.environ["TF_DUMP_GRAPH_PREFIX"] = DUMP_DIR
os.environ["TF_CPP_VMODULE"] = "optimize_function_graph_utils=4"  # dumps "<function>.main.before_partition"
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 4)

from tests.test_gpipe import _data, _pair  # noqa: E402

for case in CASES:
    k, m, remat, swap, schedule_name = case.split(",")
    _, pipe = _pair(int(k), int(m), remat, swap == "1", schedule_name=schedule_name)
    pipe.train_on_batch(*_data())
