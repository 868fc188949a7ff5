"""`plain(fn)`: a function tf.data traces as it is written, without autograph's conversion.

hpml's own dataset functions branch on Python structure only (dict keys, static shapes), never on tensor values, so
converting their source buys nothing; it cost about 0.1 s for each new closure, on every dataset a Trainer builds.
A user's function (build_dataset's `transform` and `post_cache`) keeps autograph.
"""
from __future__ import annotations

from collections.abc import Callable


def plain(fn: Callable) -> Callable:
    import tensorflow as tf

    return tf.autograph.experimental.do_not_convert(fn)
