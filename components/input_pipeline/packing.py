"""Dense features packed into one tensor per dtype while they are cached and shuffled, and unpacked per batch."""
from __future__ import annotations

import numpy as np


class DensePacker:
    """Packs a batch's dense features into one [batch, n] tensor per dtype, and back.

    Cached, shuffled elements then carry a few tensors instead of one per feature, which is
    what per-element cost in tf.data scales with. The layout is read from static shapes when
    the packing map is traced. Variable-length features (2-D sparse) travel as ragged tensors,
    which gather and cut into batches row by row as dense ones do, and turn sparse again once
    batched (`sparse_again`); anything else passes through as is.
    """

    def __init__(self):
        self.layout: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        self.ragged: set[str] = set()

    def pack(self, features: dict) -> dict:
        import tensorflow as tf

        groups: dict[str, list] = {}
        passthrough = {}
        for name in sorted(features):
            value = features[name]
            if isinstance(value, tf.Tensor) and value.shape[1:].is_fully_defined():
                shape = tuple(value.shape[1:])
                self.layout.setdefault(value.dtype.name, []).append((name, shape))
                groups.setdefault(value.dtype.name, []).append(tf.reshape(value, [tf.shape(value)[0], -1]))
            elif isinstance(value, tf.SparseTensor) and value.shape.rank == 2:
                self.ragged.add(name)
                passthrough[name] = tf.RaggedTensor.from_sparse(value)
            else:
                passthrough[name] = value
        packed = {f"__packed_{dtype}": tf.concat(parts, axis=1) for dtype, parts in groups.items()}
        return {**packed, **passthrough}

    def unpack(self, batch: dict) -> dict:
        import tensorflow as tf

        features = {k: v for k, v in batch.items() if not k.startswith("__packed_")}
        for dtype, fields in self.layout.items():
            sizes = [int(np.prod(shape, dtype=np.int64)) for _, shape in fields]
            for (name, shape), part in zip(fields, tf.split(batch[f"__packed_{dtype}"], sizes, axis=1)):
                features[name] = tf.reshape(part, [-1, *shape])
        return features

    def sparse_again(self, label_key: str | None):
        """A map from batches of unpacked (features[, label]) to batches whose var-len features are sparse."""

        def sparse(features: dict) -> dict:
            return {k: v.to_sparse() if k in self.ragged else v for k, v in features.items()}

        def restore(*element):
            if len(element) == 1:
                return sparse(element[0])
            features, label = element
            return sparse(features), label.to_sparse() if label_key in self.ragged else label

        return restore


def maybe_pack(packer: DensePacker, parsed):
    """Dict elements are packed; any other structure (a single tensor, a tuple) is left alone."""
    return packer.pack(parsed) if isinstance(parsed, dict) else parsed
