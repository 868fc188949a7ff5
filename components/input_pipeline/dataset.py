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

from hpml.components import s3_files
from hpml.components.errors import InputDataError, SpecError
from hpml.components.input_pipeline import read_ahead
from hpml.components.input_pipeline import cache as cache_keys
from hpml.components.input_pipeline.blocks import cut_from_blocks, cuttable, held_whole, whole_epochs
from hpml.components.input_pipeline.packing import DensePacker, maybe_pack
from hpml.components.input_pipeline.plain import plain
from hpml.components.input_pipeline.shards import usable_shards
from hpml.components.input_pipeline.spec import AUTOTUNE, InputPipelineSpec, schema_fingerprint
from hpml.components.input_pipeline.windows import ordered, shuffle_and_repeat
from hpml.components.s3_files import is_s3


def _calls(value: int):
    """num_parallel_calls for a width: None runs sequentially, -1 is AUTOTUNE."""
    import tensorflow as tf

    if value == AUTOTUNE:
        return tf.data.AUTOTUNE
    return None if value <= 1 else value


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
    passes: int | None = None,
):
    """The spec's pipeline over any sources: `open_source` maps a source name to a dataset of records.

    Records are read in chunks of `parse_batch_size` per source, and chunks are what the reader,
    parser, cache and shuffle pass along. `transform` is elementwise over the leading axis, so
    it serves per-record and batched parsing alike.
    """
    import random

    import tensorflow as tf

    deterministic = spec.deterministic if deterministic is None else deterministic
    read = _Read(spec, batch_size or spec.batch_size, shuffle, num_epochs,
                 seed if seed is not None else random.randrange(2**31), label_key, deterministic,
                 own=plain if transform is None else (lambda fn: fn),  # a user's transform keeps autograph
                 passes=passes)

    def parse(records, batched: bool):
        parsed = parse_batch(records) if batched else parse_one(records)
        return transform(parsed) if transform else parsed

    chunks = _chunks(spec, sources, open_source, deterministic)
    blocks_prefetched = False
    if (spec.cache != "none" or spec.vectorized_parse) and num_epochs != 1:
        # Without post_cache the blocks take the prefetch; each batch is then only a slice.
        blocks_prefetched = post_cache is None and spec.prefetch != 0 and num_epochs is None
        batches, blocks_prefetched = read.parsed_first(chunks, parse, cache_location, blocks_prefetched)
    else:
        batches = read.parsed_late(chunks, parse)
    if post_cache is not None:
        batches = batches.map(post_cache, num_parallel_calls=read.parallel, deterministic=read.in_order)
    if spec.prefetch != 0 and not blocks_prefetched:
        batches = batches.prefetch(tf.data.AUTOTUNE if spec.prefetch == AUTOTUNE else spec.prefetch)
    return batches.with_options(dataset_options(spec, deterministic))


def _chunks(spec: InputPipelineSpec, sources: Sequence[str], open_source: Callable, deterministic: bool):
    """Chunks of `parse_batch_size` records, read from `cycle_length` sources at a time."""
    import tensorflow as tf

    reads = _calls(spec.read_parallelism)
    return tf.data.Dataset.from_tensor_slices(list(sources)).interleave(
        plain(lambda source: open_source(source).batch(spec.parse_batch_size)),
        cycle_length=tf.data.AUTOTUNE if spec.cycle_length == AUTOTUNE else spec.cycle_length,
        block_length=1, num_parallel_calls=reads, deterministic=ordered(reads, deterministic),
    )


class _Read:
    """One read's settings, and its two shapes: chunks parsed first (then cached, shuffled and cut), or records
    shuffled first and parsed per batch."""

    def __init__(self, spec: InputPipelineSpec, batch_size: int, shuffle: bool, num_epochs, seed, label_key,
                 deterministic: bool, own: Callable = plain, passes: int | None = None):
        self.spec, self.batch_size, self.shuffle, self.num_epochs, self.seed = (spec, batch_size, shuffle,
                                                                                 num_epochs, seed)
        self.passes = passes  # of an endless read, those its reader takes in full (see shuffle_and_repeat)
        self.own = own  # how a function that parses (and so may run the user's transform) is traced
        self.label_key = label_key
        self.parallel = _calls(spec.map_parallelism)
        self.in_order = ordered(self.parallel, deterministic)

    def split_label(self, features):
        if self.label_key is None:
            return features
        features = dict(features)
        return features, features.pop(self.label_key)

    def parsed_first(self, chunks, parse: Callable, cache_location: str | None, prefetch_blocks: bool):
        """(batches, whether the blocks they are cut from took the prefetch).

        Chunks are parsed first (and cached, where the spec caches); after it everything works on whole chunks or
        windows, and batches are cut with rebatch, so no function runs per batch on the warm path. Without a
        cache this still pays: a window of parsed, packed rows is about a quarter of the size of the same rows
        serialized.
        """
        spec, packer = self.spec, DensePacker()
        parsed = chunks.map(self.own(lambda r: maybe_pack(packer, parse(r, True))), num_parallel_calls=self.parallel,
                            deterministic=self.in_order)
        finish = plain(lambda unit: self.split_label(packer.unpack(unit) if packer.layout else unit))
        if held_whole(spec, self.shuffle, self.num_epochs):
            units = whole_epochs(parsed, self.seed, finish)
        else:
            if spec.cache == "memory":
                parsed = parsed.cache()
            elif spec.cache == "disk":
                if not cache_location:
                    raise SpecError("the spec caches on disk but no cache location was given")
                parsed = parsed.snapshot(cache_location)
            units = shuffle_and_repeat(parsed, spec, self.shuffle, self.num_epochs, self.seed, passes=self.passes,
                                       parallel=self.parallel, in_order=self.in_order, finish=finish)
        if self.num_epochs is None and cuttable(units.element_spec):
            batches = cut_from_blocks(units, self.batch_size, spec.prefetch if prefetch_blocks else 0)
        else:
            batches, prefetch_blocks = units.rebatch(self.batch_size), False
        if packer.ragged:
            batches = batches.map(plain(packer.sparse_again(self.label_key)))
        return batches, prefetch_blocks

    def parsed_late(self, chunks, parse: Callable):
        """Records shuffled as serialized chunks, then parsed a batch at a time (or one by one)."""
        records = shuffle_and_repeat(chunks, self.spec, self.shuffle, self.num_epochs, self.seed,
                                     parallel=self.parallel, in_order=self.in_order, passes=self.passes)
        if self.spec.vectorized_parse:
            return records.rebatch(self.batch_size).map(
                self.own(lambda r: self.split_label(parse(r, True))), num_parallel_calls=self.parallel,
                deterministic=self.in_order)
        return records.unbatch().map(
            self.own(lambda r: parse(r, False)), num_parallel_calls=self.parallel, deterministic=self.in_order
        ).batch(self.batch_size).map(plain(self.split_label))


def _opened_at_once(spec: InputPipelineSpec) -> int:
    """How many shards the reader opens at once (its interleave's cycle)."""
    import os

    return (os.cpu_count() or 1) if spec.cycle_length == AUTOTUNE else max(spec.cycle_length, 1)


def _matching(file_patterns: Sequence[str]) -> list[str]:
    """The files the patterns match, sorted: TensorFlow's glob, or the store's listing for s3://."""
    import tensorflow as tf

    local = [pattern for pattern in file_patterns if not is_s3(pattern)]
    remote = [path for pattern in file_patterns if is_s3(pattern) for path in s3_files.glob(pattern)]
    return sorted(set(tf.io.gfile.glob(local) if local else []) | set(remote))


def _readable_shards(spec: InputPipelineSpec, file_patterns: list[str]):
    """(the reader of shards on s3://, or None; the shards to read; the ones skipped as corrupt) for the patterns."""
    files = _matching(file_patterns)
    if not files:
        raise SpecError(f"no files match {', '.join(file_patterns)}")
    reader = None
    if any(is_s3(path) for path in files):  # read from local copies, fetched ahead of the reader
        reader, files, skipped = read_ahead.usable_shards(files, spec.compression, spec.on_corrupt_shard,
                                                          read_ahead.AHEAD + _opened_at_once(spec))
    else:
        files, skipped = usable_shards(files, spec.compression, spec.on_corrupt_shard)
    if not files:
        raise InputDataError(f"every shard matching {', '.join(file_patterns)} is corrupt: {', '.join(skipped)}")
    return reader, files, skipped


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
    passes: int | None = None,
):
    """A batched dataset of (features, label), or of features, read from TFRecord shards as the spec says.

    `num_epochs=None` repeats forever; a cache is only used when the data is read more than once. `passes`, with
    it, says how many passes the reader takes in full (fit's epochs): past them, the rows that fill the last
    batch come from small windows, not from a whole further pass read and parsed for them.
    `seed` is an int or a scalar int64 tensor (a parameter-server worker draws its own); None draws one.
    `transform` runs before the cache, on parsed features; `post_cache` runs on each batch as yielded.
    `report`, if given, receives the shards skipped as corrupt and the disk cache location.
    Shards on s3:// are read from local copies, downloaded a few shards ahead of the reader (`read_ahead`).
    """
    import tensorflow as tf
    from tensorflow_transform.tf_metadata import schema_utils

    if schema_fingerprint(schema) != spec.schema_fingerprint:
        raise SpecError(
            "the input pipeline spec was made for a different schema "
            f"({spec.schema_fingerprint} != {schema_fingerprint(schema)})",
            hint="re-run Transform for this data",
        )
    reader, files, skipped = _readable_shards(spec, [file_patterns] if isinstance(file_patterns, str)
                                              else list(file_patterns))
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
        open_source=lambda path: tf.data.TFRecordDataset(reader.op(path) if reader else path,
                                                         compression_type=spec.compression),
        parse_batch=lambda records: tf.io.parse_example(records, feature_spec),
        parse_one=lambda record: tf.io.parse_single_example(record, feature_spec),
        batch_size=batch_size, shuffle=shuffle, num_epochs=num_epochs, seed=seed, label_key=label_key,
        transform=transform, post_cache=post_cache, cache_location=location, deterministic=deterministic,
        passes=passes,
    )
