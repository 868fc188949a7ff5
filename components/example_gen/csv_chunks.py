"""A CSV file as chunks of whole records, and a large file as pieces that workers read side by side.

A record ends at a newline outside quotes. Whether a newline is inside a quoted value follows from the number of
quote characters before it (RFC 4180 doubles a quote inside a quoted value), which `bytes.count` finds at memory
speed, so no Python runs per row. Pieces of one file start and end at such record boundaries; a GZIP file, or one
in an encoding that is not ASCII-compatible (UTF-16), is one piece, read from its start.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Sequence

from hpml.components import files as file_system
from hpml.components.example_gen.csv_header import READ_ERRORS, unreadable
from hpml.components.example_gen.inputs import is_gzip, open_binary
from hpml.components.example_gen.text_encoding import is_utf8, python_codec

# Bytes of CSV read, parsed and encoded at a time: bounds a worker's memory (about 8x this) whatever the file size.
CHUNK_BYTES = 8 << 20
# A file larger than this is read as pieces of about this size, each a work item of its own.
PIECE_BYTES = 64 << 20
_SCAN_BLOCK = 16 << 20
_BOM = codecs.BOM_UTF8


def ascii_compatible(encoding: str) -> bool:
    """Whether the encoding writes newlines, quotes and commas as single ASCII bytes, so a file in it can be cut at
    byte offsets: UTF-8, Latin-1 and cp1252 do; UTF-16 does not."""
    return "\n\",0a".encode(python_codec(encoding), "surrogateescape").lstrip(_BOM) == b"\n\",0a"


def _tokens(data):
    return (b"\n", b'"') if isinstance(data, bytes) else ("\n", '"')


def last_record_end(data, quotes_before: int = 0) -> int | None:
    """The offset just after the last newline in `data` that lies outside quotes, given `quotes_before` quote
    characters before `data` in its record run; None when there is none."""
    newline, quote = _tokens(data)
    total = quotes_before + data.count(quote)
    end, after = len(data), 0
    while True:
        found = data.rfind(newline, 0, end)
        if found < 0:
            return None
        after += data.count(quote, found, end)
        if (total - after) % 2 == 0:
            return found + 1
        end = found


def first_record_end(data, start: int = 0, quotes_before: int = 0) -> int | None:
    """The offset just after the first newline at or after `start` that lies outside quotes; None when none."""
    newline, quote = _tokens(data)
    quotes = quotes_before + data.count(quote, 0, start)
    while True:
        found = data.find(newline, start)
        if found < 0:
            return None
        quotes += data.count(quote, start, found)
        if quotes % 2 == 0:
            return found + 1
        start = found + 1


@dataclass(frozen=True)
class Piece:
    """Bytes [start, end) of a file, whole records; start 0 holds the header; end None reads to the end."""

    path: str
    start: int = 0
    end: int | None = None

    @property
    def size(self) -> int:
        return (self.end if self.end is not None else file_system.size(self.path)) - self.start


@dataclass
class Chunk:
    """Whole records of a file: bytes, or text where the encoding is not ASCII-compatible."""

    data: bytes | str
    lines_before: Callable[[], int]  # physical lines of the file before the chunk (header included)
    share: float  # how far through the piece the reader is after this chunk, 0 to 1


def lines_before_offset(path: str, offset: int) -> int:
    """How many newlines a file holds before a byte offset: counted only for an error's line number."""
    count, done = 0, 0
    with open_binary(path) as handle:
        while done < offset:
            block = handle.read(min(_SCAN_BLOCK, offset - done))
            if not block:
                break
            count, done = count + block.count(b"\n"), done + len(block)
    return count


def read_chunks(piece: Piece, encoding: str, chunk_bytes: int | None = None) -> Iterator[Chunk]:
    """The piece's records after the header, in chunks of about `chunk_bytes` that end at record boundaries; a
    UTF-8 byte-order mark is dropped. A record longer than a chunk makes its chunk longer."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    text = not ascii_compatible(encoding)
    with open_binary(piece.path) as raw:
        read: Callable[[int], bytes | str]
        if text:
            import io

            read = io.TextIOWrapper(raw, encoding=python_codec(encoding), errors="surrogateescape", newline="").read
        else:
            if piece.start:
                raw.seek(piece.start)
            remaining = [piece.end - piece.start if piece.end is not None else None]

            def read_share(size: int) -> bytes:
                if remaining[0] is not None:
                    size = min(size, remaining[0])
                    if size <= 0:
                        return b""
                block = raw.read(size)
                if remaining[0] is not None:
                    remaining[0] -= len(block)
                return block

            read = read_share
        underlying = getattr(raw, "fileobj", raw)  # a GZIP file's share is of its compressed bytes
        yield from _chunks(piece, read, chunk_bytes, is_utf8(encoding) and not text, underlying.tell)


def _chunks(piece: Piece, read, chunk_bytes: int, utf8: bool, position: Callable[[], int]) -> Iterator[Chunk]:
    piece_lines = None

    def lines_at_start() -> int:
        nonlocal piece_lines
        if piece_lines is None:
            piece_lines = lines_before_offset(piece.path, piece.start) if piece.start else 0
        return piece_lines

    def counted_from(before: int) -> Callable[[], int]:
        return lambda: lines_at_start() + before

    size = max(piece.size, 1)
    carry, lines = None, 0
    header = piece.start == 0
    while True:
        try:
            block = read(chunk_bytes)
        except READ_ERRORS as err:  # a GZIP file cut short or corrupted
            raise unreadable(piece.path, lines_at_start() + lines, err) from None
        data = block if carry is None else carry + block
        if header:
            if utf8 and data.startswith(_BOM):
                data = data[len(_BOM):]
            end = first_record_end(data)
            if end is None and block:
                carry = data
                continue
            end = len(data) if end is None else end
            lines += data.count(_tokens(data)[0], 0, end)
            data, header = data[end:], False
        if not block:  # the end: what is left is the last record(s), with or without a final newline
            if data:
                yield Chunk(data, counted_from(lines), 1.0)
            return
        end = last_record_end(data)
        if end is None:
            carry = data
            continue
        chunk, carry = data[:end], data[end:]
        before = lines
        lines += chunk.count(_tokens(chunk)[0])
        yield Chunk(chunk, counted_from(before), (position() - piece.start) / size)


def plan_pieces(path: str, encoding: str, piece_bytes: int | None = None) -> list[Piece]:
    """A file as pieces of about `piece_bytes` that start and end at record boundaries; one piece where the file
    is small, GZIP-compressed or in an encoding that is not ASCII-compatible. Finding the boundaries reads the
    file once, counting quotes and newlines."""
    piece_bytes = piece_bytes or PIECE_BYTES
    size = file_system.size(path)
    if size <= piece_bytes * 1.5 or is_gzip(path) or not ascii_compatible(encoding):
        return [Piece(path)]
    bounds, target, quotes, offset = [], piece_bytes, 0, 0
    with open_binary(path) as handle:
        while target < size - piece_bytes // 2:
            block = handle.read(_SCAN_BLOCK)
            if not block:
                break
            search = max(target - offset, 0)
            while search < len(block):
                end = first_record_end(block, search, quotes)
                if end is None:
                    break
                bounds.append(offset + end)
                target = offset + end + piece_bytes
                if target >= size - piece_bytes // 2:
                    break
                search = target - offset
            quotes += block.count(b'"')
            offset += len(block)
    starts = [0, *bounds]
    return [Piece(path, start, end) for start, end in zip(starts, [*bounds, None])]


def plan_work(paths: Sequence[str], encoding: str, num_shards: int = 0,
              piece_bytes: int | None = None) -> list[list[Piece]]:
    """CSV files as work items: `group_pieces` of their pieces."""
    piece_bytes = piece_bytes or PIECE_BYTES
    return group_pieces([piece for path in paths for piece in plan_pieces(path, encoding, piece_bytes)],
                        num_shards, piece_bytes)


def group_pieces(pieces: Sequence[Piece], num_shards: int = 0, piece_bytes: int | None = None) -> list[list[Piece]]:
    """Work items, each a list of pieces that one worker reads and writes as one output shard per split.
    `num_shards` 0: large pieces alone, small ones together up to `piece_bytes`; otherwise exactly that many
    items, pieces given out in order by size (an item may be left empty)."""
    piece_bytes = piece_bytes or PIECE_BYTES
    sizes = [piece.size for piece in pieces]
    if num_shards:
        total = max(sum(sizes), 1)
        items: list[list[Piece]] = [[] for _ in range(num_shards)]
        done = 0
        for piece, size in zip(pieces, sizes):
            items[min(int(done * num_shards / total), num_shards - 1)].append(piece)
            done += size
        return items
    current: list[Piece] = []
    items, current_size = [], 0
    for piece, size in zip(pieces, sizes):
        if current and current_size + size > piece_bytes:
            items.append(current)
            current, current_size = [], 0
        current.append(piece)
        current_size += size
    return [*items, current] if current else items


def item_name(item: Sequence[Piece]) -> str:
    """A work item as a log line names it: the file, its byte range where it is a piece of one, or how many files."""
    if not item:
        return "no input"
    first = item[0]
    if len(item) > 1:
        return f"{len(item)} files from {first.path}"
    if first.start or first.end is not None:
        return f"{first.path} [bytes {first.start:,}-{first.end if first.end is not None else 'end'}]"
    return first.path
