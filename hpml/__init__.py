"""hpml: high-performance ML training pipelines for Apache Airflow, built from TFX-compatible components.

Import the public API from `hpml.v1`.
"""
import os

__version__ = "0.2.0"

# All model code uses tf_keras (Keras 2): Keras 3 breaks MultiWorkerMirrored, ParameterServer and gradient
# accumulation on TF 2.21, and tf.Transform needs it. It must be set before TensorFlow is first imported, so it is
# set here, where every import of hpml starts; a process hpml starts elsewhere (a container) gets KERAS_ENV.
KERAS_ENV = {"TF_USE_LEGACY_KERAS": "1"}
for _name, _value in KERAS_ENV.items():
    os.environ.setdefault(_name, _value)
