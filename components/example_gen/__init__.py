"""ExampleGen: raw CSV or TFRecord files become split, GZIP-compressed tf.Examples."""
from hpml.components.example_gen.spec import EXAMPLE_GEN

__all__ = ["EXAMPLE_GEN"]
