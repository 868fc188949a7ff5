"""Transform: full-pass preprocessing with tf.Transform, plus the input-pipeline spec."""
from hpml.components.transform.spec import TRANSFORM

__all__ = ["TRANSFORM"]
