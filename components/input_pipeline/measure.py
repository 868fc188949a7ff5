"""Profiling a sample of the data: read throughput, parse cost, sizes, file count, cores and RAM.

Everything the tuner decides from is measured here, on this machine, and stored in the spec.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import time
from dataclasses import asdict, dataclass
from collections.abc import Callable, Sequence

TFRECORD_FRAMING_BYTES = 16


@dataclass
class Measurements:
    file_count: int
    total_file_bytes: int
    sample_records: int
    est_records: int
    serialized_bytes_per_record: float
    parsed_bytes_per_record: float
    read_wall_s_per_record: float
    read_cpu_s_per_record: float
    parse_one_s_per_record: float
    parse_batch_s_per_record: float
    map_wall_s_per_record: float
    map_cpu_s_per_record: float
    batch_time_p50_s: float
    batch_time_p95_s: float
    cores: int
    ram_total_bytes: int
    ram_available_bytes: int
    # Of the sample's read and parse wall time, the share its threads spent ready to run but waiting for a core
    # (other work on the machine). The wall times above leave it out.
    queued_share: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def machine() -> dict:
    """Cores this process may use, and RAM."""
    import psutil

    memory = psutil.virtual_memory()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"cores": cores, "ram_total_bytes": int(memory.total), "ram_available_bytes": int(memory.available)}


def _queued_seconds() -> float:
    """Seconds this process's threads have spent runnable but waiting for a core (Linux's per-thread schedstat);
    0 where the kernel does not say."""
    total = 0
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/schedstat") as stat:
                total += int(stat.read().split()[1])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile, or no schedstat
            continue
    return total / 1e9


def _timed(iterable) -> tuple[list, float, float, list[float], float]:
    """Items of an iterable with wall time, process CPU time, per-item wall times, and the seconds spent waiting for
    a core, which the wall time leaves out: on a busy machine they would read as the work waiting on I/O, and
    size the stages for the load of the moment rather than for the data."""
    items, gaps = [], []
    wall, cpu, queued = time.perf_counter(), time.process_time(), _queued_seconds()
    last = wall
    iterator = iter(iterable)  # held until the end: its threads' waits go with them when it is freed
    for item in iterator:
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        items.append(item)
    wall, cpu, queued = time.perf_counter() - wall, time.process_time() - cpu, _queued_seconds() - queued
    queued = min(max(queued, 0.0), max(wall - cpu, 0.0))  # parallel threads' waits can add up past the wall time
    return items, wall - queued, cpu, gaps, queued


def _nbytes(structure) -> int:
    import tensorflow as tf

    total = 0
    for tensor in tf.nest.flatten(structure, expand_composites=True):
        total += tensor.numpy().nbytes
    return total


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else 0.0


def measure(
    sources: Sequence[str],
    *,
    open_source: Callable,
    parse_batch: Callable,
    parse_one: Callable,
    source_bytes: Sequence[int],
    batch_size: int,
    sample_records: int = 4096,
    transform: Callable | None = None,
    compressed_bytes_per_record: Callable[[list[bytes]], float] | None = None,
) -> Measurements:
    """Time a sample read sequentially from the first sources, then parse it both ways."""
    import tensorflow as tf

    if not sources:
        raise ValueError("no sources to profile")
    transform = transform or (lambda parsed: parsed)
    read = tf.data.Dataset.from_tensor_slices(list(sources)).flat_map(open_source).take(sample_records)
    read = read.batch(batch_size).with_options(_sequential())
    batches, read_wall, read_cpu, read_gaps, read_queued = _timed(read)
    records = tf.concat(batches, axis=0) if batches else tf.constant([], tf.string)
    count = int(records.shape[0])
    if count == 0:
        raise ValueError(f"no records to profile in {', '.join(sources[:3])}")
    raw = [r for r in records.numpy()] if records.dtype == tf.string else []
    serialized = sum(len(r) for r in raw) / count if raw else float(records.dtype.size)

    sample = tf.data.Dataset.from_tensor_slices(records)
    one = sample.map(lambda r: transform(parse_one(r))).batch(batch_size).with_options(_sequential())
    _, one_wall, _, _, _ = _timed(one)
    vectorized = sample.batch(batch_size).map(lambda r: transform(parse_batch(r))).with_options(_sequential())
    parsed, map_wall, map_cpu, gaps, map_queued = _timed(vectorized)
    parsed_bytes = sum(_nbytes(p) for p in parsed) / count

    total_bytes = int(sum(source_bytes))
    per_record_on_disk = compressed_bytes_per_record(raw) if compressed_bytes_per_record else None
    if count < sample_records or not per_record_on_disk:
        est = count  # the sample read every source to the end
    else:
        est = int(round(total_bytes / per_record_on_disk))
    batch_times = [read + parse for read, parse in zip(read_gaps, gaps)]
    return Measurements(
        file_count=len(sources), total_file_bytes=total_bytes, sample_records=count, est_records=max(est, count),
        serialized_bytes_per_record=serialized, parsed_bytes_per_record=parsed_bytes,
        read_wall_s_per_record=read_wall / count, read_cpu_s_per_record=read_cpu / count,
        parse_one_s_per_record=one_wall / count, parse_batch_s_per_record=map_wall / count,
        map_wall_s_per_record=map_wall / count, map_cpu_s_per_record=map_cpu / count,
        batch_time_p50_s=_percentile(batch_times, 0.5), batch_time_p95_s=_percentile(batch_times, 0.95),
        queued_share=(read_queued + map_queued) / max(read_wall + map_wall + read_queued + map_queued, 1e-9),
        **machine(),
    )


def _sequential():
    """Options for profiling: one thread, no autotune, so times add up to the serial cost."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.apply_default_optimizations = False
    options.threading.private_threadpool_size = 1
    return options


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=4).digest()


def measure_tfrecords(files: Sequence[str], schema, *, compression: str, batch_size: int,
                      sample_records: int = 4096, transform: Callable | None = None) -> Measurements:
    """Measurements of TFRecord shards holding tf.Examples of `schema`."""
    import tensorflow as tf
    from tensorflow_transform.tf_metadata import schema_utils

    feature_spec = schema_utils.schema_as_feature_spec(schema).feature_spec

    def on_disk(raw: list[bytes]) -> float:
        # Each record is framed by its length and two CRCs, of the length and of the data. A digest stands in for
        # each: like a CRC it repeats where its input does and looks random elsewhere, so it compresses as a CRC does.
        # (Zeros compressed to nothing and overestimated the count of records of a few dozen bytes nearly twice.)
        framed = b"".join(length + _digest(length) + r + _digest(r)
                          for r in raw for length in [len(r).to_bytes(8, "little")])
        size = len(gzip.compress(framed, compresslevel=6)) if compression == "GZIP" else len(framed)
        return size / len(raw)

    return measure(
        list(files),
        open_source=lambda path: tf.data.TFRecordDataset(path, compression_type=compression),
        parse_batch=lambda r: tf.io.parse_example(r, feature_spec),
        parse_one=lambda r: tf.io.parse_single_example(r, feature_spec),
        source_bytes=[tf.io.gfile.stat(f).length for f in files],
        batch_size=batch_size, sample_records=sample_records, transform=transform,
        compressed_bytes_per_record=on_disk,
    )
