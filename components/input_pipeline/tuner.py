"""The tuner: measurements in, an InputPipelineSpec out, every decision with its reason.

A pure function of the measurements and budgets, so each rule can be tested on simulated
machines. Thread counts follow the usual sizing rule: to keep C cores busy on work that spends
W seconds of wall time per second of CPU, run about C x W of it at once.
"""
from __future__ import annotations

import math

from hpml.components.input_pipeline.measure import Measurements
from hpml.components.input_pipeline.spec import InputPipelineSpec

MAX_PARALLELISM = 64
MAX_SHUFFLE_BUFFER = 1_000_000
MAX_PREFETCH = 16
STATIC_OPTIMIZATIONS = {
    "map_and_batch_fusion": True, "map_parallelization": True, "map_fusion": True,
    "noop_elimination": True, "parallel_batch": True, "shuffle_and_repeat_fusion": True,
}
MIB = 1024 * 1024
FIRST_BATCH_LATENCY_S = 0.05  # a parse batch ahead of the cache should not delay the first batch more
FIRST_EPOCH_WINDOWS = 8  # the first epoch, reading the shards, is permuted in this many windows
PERMUTE_SLICE_CHUNKS = 8  # a permuted window is gathered this many chunks' worth of records at a time


def _wait_ratio(wall: float, cpu: float) -> float:
    """Wall time per unit of CPU time; 1 for CPU-bound work, large for work that waits."""
    return max(1.0, wall / cpu) if cpu > 0 else (float(MAX_PARALLELISM) if wall > 0 else 1.0)


def _width(cores: int, ratio: float) -> int:
    return max(1, min(MAX_PARALLELISM, math.ceil(cores * ratio)))


def _queued(m: Measurements) -> str:
    if m.queued_share < 0.01:
        return ""
    return (f", not counting the {m.queued_share:.0%} of the profile's time spent waiting for a core that other work "
            f"held")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} µs"


def tune(m: Measurements, *, schema_fingerprint: str, batch_size: int, compression: str = "GZIP",
         deterministic: bool = True, ram_fraction: float = 0.5, on_corrupt_shard: str = "error") -> InputPipelineSpec:
    """Decide every knob of the pipeline from `m`; `ram_fraction` of available RAM is tf.data's budget."""
    decisions: list[dict] = []

    def decide(what, value, why):
        decisions.append({"what": what, "value": value, "why": why})
        return value

    cycle_length, map_parallelism = _readers_and_parsers(m, decide, deterministic)
    ram_budget = int(ram_fraction * m.ram_available_bytes)
    cache, parse_batch_size = _cache_and_chunks(m, decide, batch_size, ram_budget)
    shuffle_buffer, first_epoch_window, permute_slice = _windows(m, decide, batch_size, ram_budget, cache,
                                                                 parse_batch_size, map_parallelism)
    prefetch, threads = _prefetch_and_threads(m, decide, map_parallelism, ram_budget, ram_fraction)
    return InputPipelineSpec(
        schema_fingerprint=schema_fingerprint, batch_size=batch_size, compression=compression,
        cycle_length=cycle_length, read_parallelism=cycle_length, deterministic=deterministic,
        vectorized_parse=True, parse_batch_size=parse_batch_size, map_parallelism=map_parallelism, cache=cache,
        shuffle_buffer=shuffle_buffer, first_epoch_window=first_epoch_window, permute_slice=permute_slice,
        prefetch=prefetch, ram_budget_bytes=ram_budget, cpu_budget=m.cores,
        private_threadpool_size=threads, static_optimizations=dict(STATIC_OPTIMIZATIONS), autotune=False,
        on_corrupt_shard=on_corrupt_shard, measurements=m.to_dict(), decisions=decisions,
    )


def _readers_and_parsers(m: Measurements, decide, deterministic: bool) -> tuple[int, int]:
    """(cycle_length, map_parallelism): concurrent readers and parse calls for this machine's cores."""
    cores = m.cores
    read_ratio = _wait_ratio(m.read_wall_s_per_record, m.read_cpu_s_per_record)
    readers = _width(cores, read_ratio)
    cycle_length = decide("cycle_length", max(1, min(m.file_count, readers)), (
        f"{m.file_count} shard(s) and {cores} core(s); reading took {_us(m.read_wall_s_per_record)} wall and "
        f"{_us(m.read_cpu_s_per_record)} CPU per record ({read_ratio:.1f}x, "
        f"{'latency-bound' if read_ratio > 2 else 'CPU-bound'}), so {readers} concurrent reader(s) keep the cores "
        f"busy, capped by the shard count"))
    decide("read_parallelism", cycle_length, "one reader thread per shard in the cycle")
    decide("deterministic", deterministic, "an option: True keeps a reproducible order; False lets parallel "
           "stages hand out whichever element is ready first")
    speedup = m.parse_one_s_per_record / m.parse_batch_s_per_record if m.parse_batch_s_per_record > 0 else 1.0
    decide("vectorized_parse", True, (
        f"batching first and parsing the whole batch cost {_us(m.parse_batch_s_per_record)} per record against "
        f"{_us(m.parse_one_s_per_record)} parsing record by record ({speedup:.1f}x)"))
    map_ratio = _wait_ratio(m.map_wall_s_per_record, m.map_cpu_s_per_record)
    map_parallelism = decide("map_parallelism", _width(cores, map_ratio), (
        f"the parse map takes {map_ratio:.1f}x as much wall as CPU time on {cores} core(s)" + _queued(m)))
    return cycle_length, map_parallelism


def _cache_and_chunks(m: Measurements, decide, batch_size: int, ram_budget: int) -> tuple[str, int]:
    """(cache, parse_batch_size): where parsed data is kept between epochs, and the records per chunk."""
    data_bytes = m.est_records * m.parsed_bytes_per_record
    cache_budget = ram_budget // 2
    if data_bytes <= cache_budget:
        cache = decide("cache", "memory", (
            f"the parsed data (~{data_bytes / MIB:.1f} MiB for ~{m.est_records} records) fits the in-memory cache "
            f"budget of {cache_budget / MIB:.0f} MiB (half the tf.data RAM budget); parsing runs before the "
            f"cache so later epochs skip reading and parsing; used only when the data is read more than once"))
    else:
        cache = decide("cache", "disk", (
            f"the parsed data (~{data_bytes / MIB:.0f} MiB) exceeds the in-memory budget of "
            f"{cache_budget / MIB:.0f} MiB, so it is snapshotted to local disk, keyed by a fingerprint of the "
            f"input; used only when the data is read more than once"))
    by_latency = int(FIRST_BATCH_LATENCY_S / m.map_wall_s_per_record) if m.map_wall_s_per_record > 0 else 1024
    parse_batch_size = decide(
        "parse_batch_size", max(batch_size, min(1024, m.est_records // max(1, 4 * m.cores), by_latency)), (
            f"records per chunk (each shard is read, parsed, cached and shuffled in chunks): large enough to "
            f"amortise each call, small enough that every core gets several chunks and the first is parsed within "
            f"{FIRST_BATCH_LATENCY_S * 1e3:.0f} ms (at {_us(m.map_wall_s_per_record)} per record)"))
    return cache, parse_batch_size


def _windows(m: Measurements, decide, batch_size: int, ram_budget: int, cache: str, parse_batch_size: int,
             map_parallelism: int) -> tuple[int, int, int]:
    """(shuffle_buffer, first_epoch_window, permute_slice): the shuffle's windows, the first epoch's, and the
    slices a window is gathered in."""
    element_bytes = max(1.0, m.parsed_bytes_per_record if cache != "none" else m.serialized_bytes_per_record)
    shuffle_budget = ram_budget // 4
    by_memory = int(shuffle_budget // element_bytes)
    shuffle_buffer = decide("shuffle_buffer", max(batch_size, min(m.est_records, by_memory, MAX_SHUFFLE_BUFFER)), (
        f"records are shuffled by permuting windows of chunks; at {element_bytes:.0f} bytes per record a quarter "
        f"of the RAM budget ({shuffle_budget / MIB:.0f} MiB) holds {by_memory}; the data has ~{m.est_records}, so "
        f"{'each epoch is a full permutation' if by_memory >= m.est_records else 'the window is memory-bound'}"))
    parse_all_s = m.est_records * m.map_wall_s_per_record / m.cores
    if parse_all_s <= FIRST_BATCH_LATENCY_S or shuffle_buffer <= parse_batch_size:
        first_window = shuffle_buffer
        why = (f"parsing all ~{m.est_records} records takes ~{parse_all_s * 1e3:.0f} ms on {m.cores} core(s), so "
               f"the first epoch can wait for a whole window")
    else:
        eighth = -(-m.est_records // (FIRST_EPOCH_WINDOWS * parse_batch_size)) * parse_batch_size
        first_window = min(shuffle_buffer, max(parse_batch_size, eighth))
        why = (f"the first epoch reads the shards as it goes; a window of {shuffle_buffer} records would hold back "
               f"the first batch until ~{parse_all_s:.2f} s of parsing is done and leave nothing to overlap it "
               f"with, so its windows are 1/{FIRST_EPOCH_WINDOWS} of the data (the next whole chunks read), and later "
               f"epochs, read from the cache, use the full window")
    first_epoch_window = decide("first_epoch_window", first_window, why)
    window = max(shuffle_buffer, first_window)
    permute_slice = min(window, PERMUTE_SLICE_CHUNKS * parse_batch_size)
    decide("permute_slice", permute_slice, (
        f"a permuted window of up to {window} records is gathered {permute_slice} records "
        f"({PERMUTE_SLICE_CHUNKS} chunks) at a time, {map_parallelism} slice(s) at once, so the copies that gathering "
        f"and unpacking make are slice-sized rather than window-sized (B2: peak RSS -8%, same epoch times)"
        if permute_slice < window else f"windows of {window} records or fewer are gathered whole"))
    return shuffle_buffer, first_epoch_window, permute_slice


def _prefetch_and_threads(m: Measurements, decide, map_parallelism: int, ram_budget: int,
                          ram_fraction: float) -> tuple[int, int]:
    """(prefetch, private_threadpool_size), and tf.data's budgets and static options."""
    cores = m.cores
    jitter = m.batch_time_p95_s / m.batch_time_p50_s if m.batch_time_p50_s > 0 else 1.0
    prefetch = decide("prefetch", max(2, min(MAX_PREFETCH, math.ceil(jitter) + 1)), (
        f"producing a batch took {m.batch_time_p50_s * 1e3:.2f} ms at the median and {m.batch_time_p95_s * 1e3:.2f} ms "
        f"at p95 ({jitter:.1f}x); a queue this deep absorbs the slow batches"))
    # The readers run on the interleave's own threads; the pool runs the map calls and the ops inside them.
    threads = max(cores, map_parallelism)
    decide("private_threadpool_size", threads, (
        f"one thread per concurrent map call ({map_parallelism}), at least one per core, kept apart from the training "
        f"step's threads; the readers have threads of their own, and a larger pool only costs CPU (B2 cold: 0.94x "
        f"the time and 0.92x the CPU of a pool sized for readers + calls)"))
    decide("autotune budgets", {"ram_budget_bytes": ram_budget, "cpu_budget": cores},
           f"{ram_fraction:.0%} of the {m.ram_available_bytes / MIB:.0f} MiB available RAM; all {cores} core(s)")
    decide("static_optimizations", STATIC_OPTIMIZATIONS, "fuse and parallelise maps, drop no-ops; order-preserving")
    decide("autotune", False, "every stage's parallelism and buffer is pinned from these measurements, so the "
           "autotuner has nothing left to tune and its per-element bookkeeping is skipped; the RAM budget still "
           "bounds the cache and shuffle window above. Profiling turns it back on to read the per-stage model")
    return prefetch, threads
