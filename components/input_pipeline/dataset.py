"""`build_dataset`: an InputPipelineSpec applied to TFRecord shards, giving a batched tf.data.Dataset.

The order of operations is fixed here so that every spec, tuned or baseline, yields the same
elements: chunks of records per shard -> [parse -> cache] -> shuffle chunks -> repeat -> permute
windows of chunks -> batch -> [parse] -> label -> prefetch. An endless cached stream is batched in
blocks, prefetched whole and sliced into batches as the consumer asks; small data is held whole and
permuted many epochs at a time. The expensive parse (and any transform) runs before the cache;
`post_cache`, a map that grows memory, runs after it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hpml.components.errors import InputDataError, SpecError
from hpml.components.input_pipeline import cache as cache_keys
from hpml.components.input_pipeline.shards import usable_shards
from hpml.components.input_pipeline.spec import AUTOTUNE, InputPipelineSpec, schema_fingerprint


def _ordered(calls, deterministic: bool):
    """`deterministic` only means something to a parallel stage; tf.data warns otherwise."""
    return deterministic if calls is not None else None


def _calls(value: int):
    """num_parallel_calls for a width: None runs sequentially, -1 is AUTOTUNE."""
    import tensorflow as tf

    if value == AUTOTUNE:
        return tf.data.AUTOTUNE
    return None if value <= 1 else value


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


def dataset_options(spec: InputPipelineSpec, deterministic: bool):
    """tf.data Options from the spec: autotune budgets, thread pool, static optimisations."""
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = deterministic
    options.autotune.enabled = spec.autotune
    if spec.ram_budget_bytes:
        options.autotune.ram_budget = spec.ram_budget_bytes
    if spec.cpu_budget:
        options.autotune.cpu_budget = spec.cpu_budget
    if spec.private_threadpool_size:
        options.threading.private_threadpool_size = spec.private_threadpool_size
        options.threading.max_intra_op_parallelism = 1
    options.experimental_optimization.apply_default_optimizations = spec.apply_default_optimizations
    for name, enabled in spec.static_optimizations.items():
        setattr(options.experimental_optimization, name, enabled)
    return options


def _take(window, rows):
    """The window's `rows`, in that order; a window is a tensor or a dict of dense or sparse tensors."""
    import tensorflow as tf

    def take(value):
        if isinstance(value, tf.SparseTensor):
            return tf.gather(tf.RaggedTensor.from_sparse(value), rows).to_sparse()
        return tf.gather(value, rows)

    return tf.nest.map_structure(take, window, expand_composites=False)


def _rows(structure):
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

    order = tf.random.experimental.stateless_shuffle(tf.range(_rows(window), dtype=tf.int64), seed=key)
    return window, order


def _slices(window, order, slice_rows: int):
    """(window, rows) pairs that take the window's permuted rows `slice_rows` at a time.

    Each pair holds the window itself, not a copy, so cutting costs nothing. The gathering is left to
    a parallel map, so the copies it and the unpacking make are slice-sized, not window-sized.
    """
    import tensorflow as tf

    return tf.data.Dataset.range(0, tf.shape(order, out_type=tf.int64)[0], slice_rows).map(
        lambda start: (window, order[start:start + slice_rows]))


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
        lambda indexed, epoch_key: _with_order(indexed[1], tf.stack([epoch_key, indexed[0]])))


def _shuffle_and_repeat(chunks, spec: InputPipelineSpec, shuffle: bool, num_epochs, seed, *,
                        finish: Callable | None = None, parallel=None, in_order: bool = True):
    """Each epoch: chunks in a shuffled order, joined into windows, each window's rows permuted.

    Everything here works on chunks, windows and slices of windows, never on single records, so its
    cost does not grow with the record count. A window never spans two epochs. From the second epoch
    on it holds `shuffle_buffer` records: when that covers the data, each epoch is a full random
    permutation, drawn anew each epoch from `seed`. The first epoch, which reads the shards (and
    fills the cache), uses windows of `first_epoch_window` records, each the next chunks read, so
    that batches flow while the rest is still being parsed instead of after the last shard.
    A permuted window is gathered in slices of `permute_slice` records, `parallel` at a time, each
    then passed through `finish`; without `shuffle`, `finish` runs on the chunks themselves.
    """
    if not shuffle:
        units = chunks.repeat(num_epochs) if num_epochs != 1 else chunks
        if finish is None:
            return units
        return units.map(finish, num_parallel_calls=parallel, deterministic=_ordered(parallel, in_order))
    finish = finish or (lambda unit: unit)
    first_window = spec.first_epoch_window or spec.shuffle_buffer
    if first_window == spec.shuffle_buffer:  # one kind of window: the plain repeated pass
        windows = _permuted_windows(chunks, spec, spec.shuffle_buffer, seed)
        windows = windows.repeat(num_epochs) if num_epochs != 1 else windows
    else:
        windows = _permuted_windows(chunks, spec, first_window, seed, shuffle_chunks=False)
        if num_epochs != 1:
            later = _permuted_windows(chunks, spec, spec.shuffle_buffer, seed + 1)
            windows = windows.concatenate(later.repeat(None if num_epochs is None else num_epochs - 1))
    slice_rows = spec.permute_slice or max(spec.shuffle_buffer, first_window)
    # The next window is joined and its order drawn while this one is gathered.
    slices = windows.prefetch(1).flat_map(lambda window, order: _slices(window, order, slice_rows))
    return slices.map(lambda window, rows: finish(_take(window, rows)), num_parallel_calls=parallel,
                      deterministic=_ordered(parallel, in_order))


def assemble(
    spec: InputPipelineSpec,
    sources: Sequence[str],
    *,
    open_source: Callable,
    parse_batch: Callable,
    parse_one: Callable,
    batch_size: int | None = None,
    shuffle: bool = True,
    num_epochs: int | None = 1,
    seed=None,
    label_key: str | None = None,
    transform: Callable | None = None,
    post_cache: Callable | None = None,
    cache_location: str | None = None,
    deterministic: bool | None = None,
):
    """The spec's pipeline over any sources: `open_source` maps a source name to a dataset of records.

    Records are read in chunks of `parse_batch_size` per source, and chunks are what the reader,
    parser, cache and shuffle pass along. `transform` is elementwise over the leading axis, so
    it serves per-record and batched parsing alike.
    """
    import random

    import tensorflow as tf

    deterministic = spec.deterministic if deterministic is None else deterministic
    batch_size = batch_size or spec.batch_size
    seed = seed if seed is not None else random.randrange(2**31)
    parallel = _calls(spec.map_parallelism)
    in_order = _ordered(parallel, deterministic)
    blocks_prefetched = False

    def parse(records, batched: bool):
        parsed = parse_batch(records) if batched else parse_one(records)
        return transform(parsed) if transform else parsed

    reads = _calls(spec.read_parallelism)
    chunks = tf.data.Dataset.from_tensor_slices(list(sources)).interleave(
        lambda source: open_source(source).batch(spec.parse_batch_size),
        cycle_length=tf.data.AUTOTUNE if spec.cycle_length == AUTOTUNE else spec.cycle_length,
        block_length=1, num_parallel_calls=reads, deterministic=_ordered(reads, deterministic),
    )

    def split_label(features):
        if label_key is None:
            return features
        features = dict(features)
        return features, features.pop(label_key)

    if (spec.cache != "none" or spec.vectorized_parse) and num_epochs != 1:
        # Chunks are parsed first (and cached, where the spec caches); after it everything works on whole
        # chunks or windows, and batches are cut with rebatch, so no function runs per batch on the warm
        # path. Without a cache this still pays: a window of parsed, packed rows is about a quarter of the
        # size of the same rows serialized.
        packer = DensePacker()
        parsed = chunks.map(lambda r: _maybe_pack(packer, parse(r, True)), num_parallel_calls=parallel,
                            deterministic=in_order)
        finish = lambda unit: split_label(packer.unpack(unit) if packer.layout else unit)  # noqa: E731
        if _held_whole(spec, shuffle, num_epochs):
            units = _whole_epochs(parsed, seed, finish)
        else:
            if spec.cache == "memory":
                parsed = parsed.cache()
            elif spec.cache == "disk":
                if not cache_location:
                    raise SpecError("the spec caches on disk but no cache location was given")
                parsed = parsed.snapshot(cache_location)
            units = _shuffle_and_repeat(parsed, spec, shuffle, num_epochs, seed, parallel=parallel,
                                        in_order=in_order, finish=finish)
        if num_epochs is None and _cuttable(units.element_spec):
            # Without post_cache the blocks take the prefetch; each batch is then only a slice.
            blocks_prefetched = post_cache is None and spec.prefetch != 0
            batches = _cut_from_blocks(units, batch_size, spec.prefetch if blocks_prefetched else 0)
        else:
            batches = units.rebatch(batch_size)
        if packer.ragged:
            batches = batches.map(packer.sparse_again(label_key))
    else:
        records = _shuffle_and_repeat(chunks, spec, shuffle, num_epochs, seed, parallel=parallel, in_order=in_order)
        if spec.vectorized_parse:
            batches = records.rebatch(batch_size).map(
                lambda r: split_label(parse(r, True)), num_parallel_calls=parallel, deterministic=in_order)
        else:
            batches = records.unbatch().map(
                lambda r: parse(r, False), num_parallel_calls=parallel, deterministic=in_order
            ).batch(batch_size).map(split_label)
    if post_cache is not None:
        batches = batches.map(post_cache, num_parallel_calls=parallel, deterministic=in_order)
    if spec.prefetch != 0 and not blocks_prefetched:
        batches = batches.prefetch(tf.data.AUTOTUNE if spec.prefetch == AUTOTUNE else spec.prefetch)
    return batches.with_options(dataset_options(spec, deterministic))


BLOCK_ROWS = 4096  # rows cut into batches at a time on the warm path of a repeated, cached dataset


def _held_whole(spec: InputPipelineSpec, shuffle: bool, num_epochs) -> bool:
    """Whether an endless shuffled read keeps the whole data set as one element in memory.

    That is the spec's own plan for small data: a memory cache and one window, the first epoch's
    included, covering every record. Drawing many epochs' permutations at once then spares each
    epoch the window machinery's fixed cost (on penguin's 217 rows, ~0.5 ms of CPU per epoch of 7 batches).
    """
    records = spec.measurements.get("est_records") or 0
    first_window = spec.first_epoch_window or spec.shuffle_buffer
    return (spec.cache == "memory" and shuffle and num_epochs is None and 0 < records <= BLOCK_ROWS
            and records <= spec.shuffle_buffer <= first_window)


def _whole_epochs(parsed, seed, finish: Callable):
    """Endless epochs over parsed chunks joined into one cached element, each epoch a full permutation.

    Each element holds as many epochs as fit in `BLOCK_ROWS` rows (at least one), counted from the
    records actually read, each permuted from (seed, epoch number): the order is reproducible and
    every epoch differs from the last.
    """
    import tensorflow as tf

    whole = parsed.rebatch(2**62).cache()  # one element: every record, in the order read

    def permuted(data, index):
        rows = tf.cast(_rows(data), tf.int64)
        epochs = tf.maximum(tf.constant(1, tf.int64), BLOCK_ROWS // tf.maximum(rows, 1))
        draws = tf.random.stateless_uniform(
            tf.stack([epochs, rows]), seed=tf.stack([tf.cast(seed, tf.int64), index * epochs]), dtype=tf.float32)
        order = tf.reshape(tf.argsort(draws, axis=1, stable=True), [-1])
        return finish(_take(data, tf.cast(order, tf.int64)))

    return tf.data.Dataset.zip(whole.repeat(), tf.data.Dataset.range(2**62)).map(permuted)


def _cuttable(element_spec) -> bool:
    """Whether every component can be cut into batches by reshaping: dense, or ragged in its second axis only."""
    import tensorflow as tf

    def cuttable(spec):
        if isinstance(spec, tf.TensorSpec):
            return spec.shape[1:].is_fully_defined()
        return isinstance(spec, tf.RaggedTensorSpec) and spec.ragged_rank == 1 and spec.shape.rank == 2

    return all(cuttable(s) for s in tf.nest.flatten(element_spec, expand_composites=False))


def _cut_from_blocks(units, batch_size: int, prefetch: int):
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

    blocks = units.rebatch(per_block * batch_size, drop_remainder=True).map(as_batches)
    if prefetch != 0:
        blocks = blocks.prefetch(tf.data.AUTOTUNE if prefetch == AUTOTUNE else -(-prefetch // per_block))
    return blocks.unbatch()


def _maybe_pack(packer: DensePacker, parsed):
    """Dict elements are packed; any other structure (a single tensor, a tuple) is left alone."""
    return packer.pack(parsed) if isinstance(parsed, dict) else parsed


def build_dataset(
    spec: InputPipelineSpec,
    file_patterns: Sequence[str],
    schema,
    *,
    label_key: str | None = None,
    batch_size: int | None = None,
    shuffle: bool = True,
    num_epochs: int | None = 1,
    seed=None,
    transform: Callable | None = None,
    post_cache: Callable | None = None,
    cache_dir: str | None = None,
    deterministic: bool | None = None,
    report: dict | None = None,
):
    """A batched dataset of (features, label), or of features, read from TFRecord shards as the spec says.

    `num_epochs=None` repeats forever; a cache is only used when the data is read more than once.
    `seed` is an int or a scalar int64 tensor (a parameter-server worker draws its own); None draws one.
    `transform` runs before the cache, on parsed features; `post_cache` runs on each batch as yielded.
    `report`, if given, receives the shards skipped as corrupt and the disk cache location.
    """
    import tensorflow as tf
    from tensorflow_transform.tf_metadata import schema_utils

    if schema_fingerprint(schema) != spec.schema_fingerprint:
        raise SpecError(
            "the input pipeline spec was made for a different schema "
            f"({spec.schema_fingerprint} != {schema_fingerprint(schema)})",
            hint="re-run Transform for this data",
        )
    if isinstance(file_patterns, str):
        file_patterns = [file_patterns]
    files = sorted(tf.io.gfile.glob(list(file_patterns)))
    if not files:
        raise SpecError(f"no files match {', '.join(file_patterns)}")
    files, skipped = usable_shards(files, spec.compression, spec.on_corrupt_shard)
    if not files:
        raise InputDataError(f"every shard matching {', '.join(file_patterns)} is corrupt: {', '.join(skipped)}")
    location = None
    if spec.cache == "disk" and num_epochs != 1:
        stage = getattr(transform, "__qualname__", "") if transform else ""
        key = cache_keys.input_fingerprint(files, spec.schema_fingerprint, str(spec.vectorized_parse), stage)
        location = cache_keys.cache_path(cache_dir, key)
    if report is not None:
        report.update(skipped_shards=skipped, cache_location=location, files=files)
    feature_spec = schema_utils.schema_as_feature_spec(schema).feature_spec
    return assemble(
        spec, files,
        open_source=lambda path: tf.data.TFRecordDataset(path, compression_type=spec.compression),
        parse_batch=lambda records: tf.io.parse_example(records, feature_spec),
        parse_one=lambda record: tf.io.parse_single_example(record, feature_spec),
        batch_size=batch_size, shuffle=shuffle, num_epochs=num_epochs, seed=seed, label_key=label_key,
        transform=transform, post_cache=post_cache, cache_location=location, deterministic=deterministic,
    )
