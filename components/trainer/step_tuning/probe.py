"""What the device offers, and a probe of what a compute dtype is worth for a model's matmuls before paying for
measuring the whole step under it."""
from __future__ import annotations

import time

from hpml.components.trainer import keras_internals
from hpml.components.trainer.step_tuning.knobs import BURST_S, Device, compute_dtype


def this_device() -> Device:
    """The device training runs on: the first GPU or TPU TensorFlow sees, else the CPU and its instruction set."""
    import tensorflow as tf

    if tf.config.list_logical_devices("TPU"):
        return Device("TPU")
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return Device("GPU", compute_capability=details.get("compute_capability"))
    return Device("CPU", cpu_bf16=_cpu_has_bf16())


def _cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            flags = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def dense_kernel_shapes(model) -> list[tuple[int, int]]:
    import tf_keras

    return [tuple(layer.kernel.shape) for layer in keras_internals.sublayers(model, include_self=False)
            if isinstance(layer, tf_keras.layers.Dense) and len(layer.kernel.shape) == 2]


def matmul_step(kernel_shapes, rows: int, dtype: str):
    """A function running one training step's matmuls of dense layers with `kernel_shapes` on `rows` rows in
    `dtype`: the forward product and the two of the backward pass. A probe of what a compute dtype is worth here,
    costing a small trace instead of building and tracing the whole model again."""
    import tensorflow as tf

    generator = tf.random.Generator.from_seed(0)
    operands = [[tf.cast(generator.normal(shape), dtype) for shape in ((rows, fan_in), (fan_in, fan_out),
                                                                       (rows, fan_out))]
                for fan_in, fan_out in kernel_shapes]

    @tf.function
    def products():
        sums = []
        for x, kernel, grad in operands:
            sums += [tf.matmul(x, kernel), tf.matmul(x, grad, transpose_a=True),
                     tf.matmul(grad, kernel, transpose_b=True)]
        return tf.add_n([tf.cast(tf.reduce_sum(t), tf.float32) for t in sums])

    products().numpy()
    return products


def seconds_per_call(function) -> float:
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < BURST_S:
        result = function()
        calls += 1
    result.numpy()
    return (time.perf_counter() - started) / calls


def predicted_saving_s(model, policy: str, batch_size: int, total_steps: int, needed_s: float = 0.0) -> float:
    """Seconds `policy` is predicted to save over `total_steps` steps: the model's matmuls in float32 against the
    policy's compute dtype, best of three interleaved bursts each. Casts and the rest of the step are not in it;
    measuring the policy settles that. Where the float32 matmuls alone take less than `needed_s`, no saving can reach
    it and the policy is not probed."""
    shapes = dense_kernel_shapes(model)
    if not shapes:
        return 0.0
    rows = max(1, batch_size // model.distribute_strategy.num_replicas_in_sync)
    full = matmul_step(shapes, rows, "float32")
    best_full = seconds_per_call(full)
    if total_steps * best_full < needed_s:
        return 0.0
    reduced = matmul_step(shapes, rows, compute_dtype(policy))
    best_reduced = seconds_per_call(reduced)
    for _ in range(2):
        best_full = min(best_full, seconds_per_call(full))
        best_reduced = min(best_reduced, seconds_per_call(reduced))
    return total_steps * (best_full - best_reduced)
