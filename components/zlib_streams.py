"""Whether a GZIP or ZLIB file's stream is whole: TF's compressed-record reader never checks that it is.

TF's TFRecord reader stops at the last whole record it can inflate, so a shard cut in its trailer, or
at the end of a deflate block, reads as a shorter, complete one. zlib checks the end-of-stream marker
and the checksum (and, for GZIP, the length); this runs it over the whole file. ExampleGen checks its
raw inputs with it, and `build_dataset` the TFRecord shards it reads.
"""
from __future__ import annotations

import zlib

# How many bytes are read, and at most inflated, at a time: memory stays bounded whatever the
# compression ratio, and Python's loop costs nothing beside zlib (which releases the GIL).
INFLATE_BLOCK = 1 << 20

# zlib's window bits for each container: GZIP's header and trailer, or ZLIB's.
_WBITS = {"GZIP": 31, "ZLIB": 15}
_ENDS = {"GZIP": "its GZIP end-of-stream marker and trailer", "ZLIB": "its ZLIB end-of-stream marker and checksum"}


def _open(path: str):
    if "://" in path:  # gs://, s3://, hdfs://: through TF's file systems
        import tensorflow as tf

        return tf.io.gfile.GFile(path, "rb")
    return open(path, "rb")


def _not_compressed(start: bytes, compression: str) -> str | None:
    """Why a file that starts with `start` is not `compression` data at all, or None when its header fits."""
    if compression == "GZIP":
        fits = start[:2] == b"\x1f\x8b"
    else:  # ZLIB: deflate in the low nibble of the first byte, and the first two bytes a multiple of 31
        fits = len(start) >= 2 and start[0] & 0x0F == 8 and (start[0] << 8 | start[1]) % 31 == 0
    if fits:
        return None
    return f"not {compression}-compressed: it starts with bytes {start[:4].hex(' ')}"


def stream_problem(path: str, compression: str = "GZIP") -> str | None:
    """What is wrong with a compressed file's stream, or None when every member ends in an intact trailer
    (zlib checks it). Concatenated members, as `cat a.gz b.gz` makes, form one valid file. An empty file
    has no stream to check, and TF reads it as no records."""
    inflater = None  # the current member's; None between members
    with _open(path) as handle:
        for index, block in enumerate(iter(lambda: handle.read(INFLATE_BLOCK), b"")):
            if index == 0 and (problem := _not_compressed(block, compression)):
                return problem
            while block:
                if inflater is None:
                    block = block.lstrip(b"\x00")  # zero padding after a member, as gzip(1) allows
                    if not block:
                        break
                    inflater = zlib.decompressobj(wbits=_WBITS[compression])
                try:
                    inflater.decompress(block, INFLATE_BLOCK)
                except zlib.error as err:
                    return str(err)
                if inflater.eof:
                    block, inflater = inflater.unused_data, None
                else:
                    block = inflater.unconsumed_tail
    if inflater is not None:
        return f"the file ends before {_ENDS[compression]}"
    return None
