"""TFX-compatible pipeline components: each is a typed spec plus a plain executor function.

All model code uses tf_keras (Keras 2): Keras 3 breaks MultiWorkerMirrored,
ParameterServer and gradient accumulation on TF 2.21, and tf.Transform needs it.
This must be set before TensorFlow is first imported.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
