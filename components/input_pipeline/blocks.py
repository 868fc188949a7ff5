"""Batches cut from blocks of many rows on the warm path of an endless read, and small data held whole with many
epochs' permutations drawn at once."""
from __future__ import annotations

from collections.abc import Callable

from hpml.components.input_pipeline.plain import plain
from hpml.components.input_pipeline.spec import AUTOTUNE, InputPipelineSpec
from hpml.components.input_pipeline.windows import count_rows, take_rows

BLOCK_ROWS = 4096  # rows cut into batches at a time on the warm path of a repeated, cached dataset


def held_whole(spec: InputPipelineSpec, shuffle: bool, num_epochs) -> bool:
    """Whether an endless shuffled read keeps the whole data set as one element in memory.

    That is the spec's own plan for small data: a memory cache and one window, the first epoch's
    included, covering every record. Drawing many epochs' permutations at once then spares each
    epoch the window machinery's fixed cost (on penguin's 217 rows, ~0.5 ms of CPU per epoch of 7 batches).
    """
    records = spec.measurements.get("est_records") or 0
    first_window = spec.first_epoch_window or spec.shuffle_buffer
    return (spec.cache == "memory" and shuffle and num_epochs is None and 0 < records <= BLOCK_ROWS
            and records <= spec.shuffle_buffer <= first_window)


def whole_epochs(parsed, seed, finish: Callable):
    """Endless epochs over parsed chunks joined into one cached element, each epoch a full permutation.

    Each element holds as many epochs as fit in `BLOCK_ROWS` rows (at least one), counted from the
    records actually read, each permuted from (seed, epoch number): the order is reproducible and
    every epoch differs from the last.
    """
    import tensorflow as tf

    whole = parsed.rebatch(2**62).cache()  # one element: every record, in the order read

    def permuted(data, index):
        rows = tf.cast(count_rows(data), tf.int64)
        epochs = tf.maximum(tf.constant(1, tf.int64), BLOCK_ROWS // tf.maximum(rows, 1))
        draws = tf.random.stateless_uniform(
            tf.stack([epochs, rows]), seed=tf.stack([tf.cast(seed, tf.int64), index * epochs]), dtype=tf.float32)
        order = tf.reshape(tf.argsort(draws, axis=1, stable=True), [-1])
        return finish(take_rows(data, tf.cast(order, tf.int64)))

    return tf.data.Dataset.zip(whole.repeat(), tf.data.Dataset.range(2**62)).map(plain(permuted))


def cuttable(element_spec) -> bool:
    """Whether every component can be cut into batches by reshaping: dense, or ragged in its second axis only."""
    import tensorflow as tf

    def fits(spec):
        if isinstance(spec, tf.TensorSpec):
            return spec.shape[1:].is_fully_defined()
        return isinstance(spec, tf.RaggedTensorSpec) and spec.ragged_rank == 1 and spec.shape.rank == 2

    return all(fits(s) for s in tf.nest.flatten(element_spec, expand_composites=False))


def cut_from_blocks(units, batch_size: int, prefetch: int):
    """Batches of an endless stream of dense (or ragged) rows, cut from blocks of `BLOCK_ROWS` rows.

    A block is joined (and prefetched) as one element; the batches are then slices of it, taken on
    the consumer's thread, so each step pays for a slice rather than for a join and a hand-off between
    threads. The batches and their order are those of `rebatch(batch_size)`: an endless stream has no
    short last batch.
    """
    import tensorflow as tf

    per_block = max(1, BLOCK_ROWS // batch_size)

    def cut(value):
        if isinstance(value, tf.RaggedTensor):
            return tf.RaggedTensor.from_uniform_row_length(value, batch_size)
        return tf.reshape(value, [per_block, batch_size, *value.shape[1:].as_list()])

    def as_batches(*block):  # a tuple element (features, label) arrives as two arguments
        return tf.nest.map_structure(cut, block if len(block) > 1 else block[0])

    blocks = units.rebatch(per_block * batch_size, drop_remainder=True).map(plain(as_batches))
    if prefetch != 0:
        blocks = blocks.prefetch(tf.data.AUTOTUNE if prefetch == AUTOTUNE else -(-prefetch // per_block))
    return blocks.unbatch()
