"""Start TensorFlow without its native start-up lines.

`import tensorflow` and the first device query print through C++ logging straight to file descriptor 2, before
and outside Python's logging and TF_CPP_MIN_LOG_LEVEL: "Could not find cuda drivers" and an error-level "failed
call to cuInit" on every machine without a GPU. `start_tensorflow` runs both with descriptor 2 sent to a file,
then writes back every line that is not one of those known start-up lines, or all of them when asked to.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile

# What TensorFlow prints when it starts on a machine without a GPU, or where an optional library is missing.
STARTUP_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called|cudart_stub\.cc|cuda_platform\.cc|cuda_dnn\.cc|"
    r"cuda_fft\.cc|cuda_blas\.cc|cuda_executor\.cc|Unable to register cu(DNN|FFT|BLAS) factory|"
    r"computation_placer\.cc|oneDNN custom operations are on|cpu_feature_guard\.cc|"
    r"This TensorFlow binary is optimized to use available CPU instructions|"
    r"To enable the following instructions|TF-TRT Warning|port\.cc:\d+\] oneDNN")


# Libraries whose info lines (absl's "Feature x has a shape" for every feature, TensorFlow's "Assets written to")
# bury hpml's own; hpml shows their warnings and errors only, unless --verbose.
CHATTY_LOGGERS = ("absl", "tensorflow", "apache_beam", "alembic", "mlflow", "urllib3", "h5py", "matplotlib")


def quiet_libraries() -> None:
    import logging

    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


# Set to "1" by `hpml --verbose`, so that processes it starts (a cluster's workers) keep the lines too.
VERBOSE_ENV = "HPML_VERBOSE"


def start_tensorflow(verbose: bool = False):
    """Import TensorFlow and list its devices quietly; returns the tensorflow module. Idempotent."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines(keepends=True)
            kept = lines if verbose else [line for line in lines if not STARTUP_NOISE.search(line)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
    return tf
