"""TFX-compatible pipeline components: each is a typed spec plus a plain executor function.

All model code uses tf_keras (Keras 2): `hpml/__init__.py` selects it before TensorFlow is imported.
"""
