"""Runs one PipelineModel train step per case given on the command line, with TensorFlow dumping
each function graph as its runtime executes it, that is after Grappler's rewrites.

Usage: python -m tests.gpipe_graph_dump DUMP_DIR CASE ...
where CASE is K,M,REMAT,SWAP,SCHEDULE for the transparency tests' Dense stack, or K,M,REMAT,SWAP,bn
for a stack that starts with BatchNormalization (whose recompute writes and restores its statistics).
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

import tf_keras  # noqa: E402

from hpml.components.trainer.gpipe.pipeline_model import PipelineModel  # noqa: E402
from tests.test_gpipe import LR, _data, _layers, _pair  # noqa: E402


def _batchnorm_pipeline(k, m, remat, swap):
    pipe = PipelineModel([tf_keras.layers.BatchNormalization(momentum=0.5)] + _layers(), num_stages=k,
                         num_micro_batches=m, balance={1: [6], 2: [3, 3]}[k], remat=remat, swap=swap)
    pipe(tf.zeros([1, 6]))
    pipe.compile(tf_keras.optimizers.SGD(LR), tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return pipe


for case in CASES:
    k, m, remat, swap, schedule_name = case.split(",")
    k, m, swap = int(k), int(m), swap == "1"
    if schedule_name == "bn":
        pipe = _batchnorm_pipeline(k, m, remat, swap)
    else:
        _, pipe = _pair(k, m, remat, swap, schedule_name=schedule_name)
    pipe.train_on_batch(*_data())
