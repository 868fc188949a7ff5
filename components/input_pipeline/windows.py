"""Shuffling by windows: chunks of records joined into windows, each window's rows permuted and gathered in
slices, so that the cost of a shuffle follows the number of chunks, not of records."""
from __future__ import annotations

from collections.abc import Callable

from hpml.components.input_pipeline.plain import plain
from hpml.components.input_pipeline.spec import InputPipelineSpec


# Chunks in a window of what an endless read takes past its last full pass: a few batches' rows, not a whole pass.
PAST_WINDOW_CHUNKS = 8


def ordered(calls, deterministic: bool):
    """`deterministic` only means something to a parallel stage; tf.data warns otherwise."""
    return deterministic if calls is not None else None


def take_rows(window, rows):
    """The window's `rows`, in that order; a window is a tensor or a dict of dense or sparse tensors."""
    import tensorflow as tf

    def take(value):
        if isinstance(value, tf.SparseTensor):
            return tf.gather(tf.RaggedTensor.from_sparse(value), rows).to_sparse()
        return tf.gather(value, rows)

    return tf.nest.map_structure(take, window, expand_composites=False)


def count_rows(structure):
    import tensorflow as tf

    first = next(iter(structure.values())) if isinstance(structure, dict) else structure
    if isinstance(first, tf.SparseTensor):
        return first.dense_shape[0]
    if isinstance(first, tf.RaggedTensor):
        return first.nrows()
    return tf.shape(first)[0]


def _with_order(window, key):
    """The window and the random order of its rows that `key` (two int64s) draws: reproducible, O(rows)."""
    import tensorflow as tf

    order = tf.random.experimental.stateless_shuffle(tf.range(count_rows(window), dtype=tf.int64), seed=key)
    return window, order


def _slices(window, order, slice_rows: int):
    """(window, rows) pairs that take the window's permuted rows `slice_rows` at a time.

    Each pair holds the window itself, not a copy, so cutting costs nothing. The gathering is left to
    a parallel map, so the copies it and the unpacking make are slice-sized, not window-sized.
    """
    import tensorflow as tf

    return tf.data.Dataset.range(0, tf.shape(order, out_type=tf.int64)[0], slice_rows).map(
        plain(lambda start: (window, order[start:start + slice_rows])))


def _permuted_windows(chunks, spec: InputPipelineSpec, window_records: int, seed: int, shuffle_chunks: bool = True):
    """One pass over `chunks`: chunks shuffled, joined into windows, each window with its own permutation.

    Iterated again (by `repeat`), it draws a new chunk order and new window keys. Without
    `shuffle_chunks` a window is the next chunks as they arrive: a chunk shuffle holds a window's
    worth of chunks back, so the first window would wait for two windows to be parsed.
    """
    import tensorflow as tf

    window_chunks = max(1, window_records // spec.parse_batch_size)
    if shuffle_chunks:
        chunks = chunks.shuffle(window_chunks, seed=seed, reshuffle_each_iteration=True)
    windows = chunks.rebatch(window_chunks * spec.parse_batch_size).enumerate()
    epoch_keys = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    return tf.data.Dataset.zip(windows, epoch_keys).map(
        plain(lambda indexed, epoch_key: _with_order(indexed[1], tf.stack([epoch_key, indexed[0]]))))


def shuffle_and_repeat(chunks, spec: InputPipelineSpec, shuffle: bool, num_epochs, seed, *,
                        finish: Callable | None = None, parallel=None, in_order: bool = True,
                        passes: int | None = None):
    """Each epoch: chunks in a shuffled order, joined into windows, each window's rows permuted.

    Everything here works on chunks, windows and slices of windows, never on single records, so its
    cost does not grow with the record count. A window never spans two epochs. From the second epoch
    on it holds `shuffle_buffer` records: when that covers the data, each epoch is a full random
    permutation, drawn anew each epoch from `seed`. The first epoch, which reads the shards (and
    fills the cache), uses windows of `first_epoch_window` records, each the next chunks read, so
    that batches flow while the rest is still being parsed instead of after the last shard.
    A permuted window is gathered in slices of `permute_slice` records, `parallel` at a time, each
    then passed through `finish`; without `shuffle`, `finish` runs on the chunks themselves.

    `passes`, for an endless read (`num_epochs=None`), is how many passes its reader takes in full (see
    `training_passes`). Where the first epoch has windows of its own size, what it reads past them, the rows that
    fill its last batch, comes from windows of at most `PAST_WINDOW_CHUNKS` chunks, the next ones read: a full
    later-epoch window (all the data, where it fits) would be read and parsed for those few rows, and the next one
    after it, while the run's last validation waits for the cores. Where one window size serves every epoch (data
    parsed so fast that the first epoch needs no windows of its own), `passes` is not used: a further window of
    such data costs little.
    """
    if not shuffle:
        units = chunks.repeat(num_epochs) if num_epochs != 1 else chunks
        if finish is None:
            return units
        return units.map(finish, num_parallel_calls=parallel, deterministic=ordered(parallel, in_order))
    finish = finish or (lambda unit: unit)  # traced inside the plain map below
    first_window = spec.first_epoch_window or spec.shuffle_buffer
    if first_window == spec.shuffle_buffer:  # one kind of window: the plain repeated pass
        windows = _permuted_windows(chunks, spec, spec.shuffle_buffer, seed)
        windows = windows.repeat(num_epochs) if num_epochs != 1 else windows
    else:
        windows = _permuted_windows(chunks, spec, first_window, seed, shuffle_chunks=False)
        if num_epochs != 1:
            later = _permuted_windows(chunks, spec, spec.shuffle_buffer, seed + 1)
            last = num_epochs or passes
            windows = windows.concatenate(later.repeat(None if last is None else last - 1))
            if num_epochs is None and passes is not None:
                past = min(first_window, PAST_WINDOW_CHUNKS * spec.parse_batch_size)
                windows = windows.concatenate(
                    _permuted_windows(chunks, spec, past, seed + 2, shuffle_chunks=False).repeat())
    slice_rows = spec.permute_slice or max(spec.shuffle_buffer, first_window)
    # The next window is joined and its order drawn while this one is gathered.
    slices = windows.prefetch(1).flat_map(plain(lambda window, order: _slices(window, order, slice_rows)))
    return slices.map(plain(lambda window, rows: finish(take_rows(window, rows))), num_parallel_calls=parallel,
                      deterministic=ordered(parallel, in_order))
