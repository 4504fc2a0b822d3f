"""Byte-level work on Arrow string arrays, vectorized: what the range texts' per-call fields need (the texts'
shared part, integers at known positions) without a regular expression run over every text or Python per
text. Positions are byte offsets inside one text."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_DIGITS = 18  # integers of at most 18 digits always fit in int64


def _offsets(texts: pa.Array) -> np.ndarray:
    """The array's own offsets into its data buffer, as stored (a view: no copy)."""
    width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    return np.frombuffer(texts.buffers()[1], dtype=width)[texts.offset : texts.offset + len(texts) + 1]


def _own_bytes(texts: pa.Array, offsets: np.ndarray) -> np.ndarray:
    """The bytes of the array's values (a view), not the rest of a buffer it is a slice of."""
    buffer = texts.buffers()[2]
    data = np.frombuffer(buffer, dtype=np.uint8) if buffer is not None else np.zeros(0, dtype=np.uint8)
    return data[offsets[0] : offsets[-1]]


def string_buffers(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets from the first value, bytes) of a string array without nulls."""
    offsets = _offsets(texts)
    return np.subtract(offsets, offsets[0], dtype=np.int64), _own_bytes(texts, offsets)


def pieces(data: np.ndarray, start: np.ndarray, stop: np.ndarray) -> pa.Array:
    """data[start_i:stop_i] of every row as strings (spans in increasing order, not overlapping), no Python
    per row: the bytes viewed without a copy as an array whose values alternate between the gap before a
    span and the span, then Arrow's take of the spans (one copy of the kept bytes, 4x faster than a byte
    mask over all of data)."""
    n = start.size
    bounds = np.empty(2 * n + 2, dtype=np.int64)
    bounds[0], bounds[-1] = 0, data.size
    bounds[1:-1:2] = start
    bounds[2:-1:2] = stop
    # binary, not string: a gap may cut through a UTF-8 character; the spans are the caller's concern
    spans = pa.Array.from_buffers(pa.large_binary(), 2 * n + 1, [None, pa.py_buffer(bounds), pa.py_buffer(data)])
    return spans.take(pa.array(np.arange(1, 2 * n, 2, dtype=np.int64))).view(pa.large_string())


def prefixes(texts: pa.Array, length: np.ndarray) -> pa.Array:
    """The first length_i bytes of every text (texts without nulls; a cut inside a UTF-8 character is the
    caller's concern); the array itself when nothing is cut."""
    offsets, data = string_buffers(texts)
    full = np.diff(offsets)
    length = np.minimum(np.asarray(length, dtype=np.int64), full)
    if (length == full).all():
        return texts
    return pieces(data, offsets[:-1], offsets[:-1] + length)


def anywhere(texts: pa.Array, needle: bytes) -> bool:
    """Whether any text may contain `needle` (one search over the array's own bytes, not over the rest of a
    buffer it is a slice of: no per-text work; a needle across two texts may give a false True, never a
    false False)."""
    if len(texts) == 0:
        return False
    data = _own_bytes(texts, _offsets(texts))  # its offsets need no copy here
    if len(needle) == 1:
        return bool((data == needle[0]).any())  # one comparison per byte: faster than a regex scan
    return re.search(re.escape(needle), memoryview(data)) is not None


def find(texts: pa.Array, needle: str) -> np.ndarray:
    """Byte position of the first `needle` in each text, -1 where there is none."""
    if not anywhere(texts, needle.encode()):
        return np.full(len(texts), -1, dtype=np.int64)
    return np.asarray(pc.find_substring(texts, needle).to_numpy(zero_copy_only=False), dtype=np.int64)


def number_at(texts: pa.Array, pos: np.ndarray) -> np.ndarray:
    """Whether an integer (an optional '-' then an ASCII digit) is written at byte `pos` of each text (pos < 0:
    none): ints_at's digits >= 1, reading two bytes per text only."""
    pos = np.asarray(pos, dtype=np.int64)
    out = np.zeros(pos.size, dtype=bool)
    rows = np.flatnonzero(pos >= 0)
    if rows.size == 0:
        return out
    offsets, data = string_buffers(texts)
    stop = offsets[1:][rows]
    at = offsets[:-1][rows] + pos[rows]

    def byte(where):
        inside = where < stop
        return np.where(inside, data[np.where(inside, where, 0)] if data.size else 0, 0)

    first = byte(at)
    digit = np.where(first == ord("-"), byte(at + 1), first)
    out[rows] = (digit >= ord("0")) & (digit <= ord("9"))
    return out


def ints_at(texts: pa.Array, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, digits) of the integer written at byte `pos` of each text (pos < 0: none): an optional '-'
    then as many ASCII digits as follow. `digits` counts them: 0 where none follows, MAX_DIGITS + 1 where
    there are more than MAX_DIGITS (the value is then meaningless)."""
    n = len(texts)
    value = np.zeros(n, dtype=np.int64)
    digits = np.zeros(n, dtype=np.int64)
    rows = np.flatnonzero(np.asarray(pos, dtype=np.int64) >= 0)
    if rows.size == 0:
        return value, digits
    offsets, data = string_buffers(texts)
    if data.size == 0:
        return value, digits
    where = offsets[:-1][rows] + np.asarray(pos, dtype=np.int64)[rows]
    room = offsets[1:][rows] - where  # bytes of each text from `pos` on
    negative = (room > 0) & (data.take(where, mode="clip") == ord("-"))
    where += negative
    room -= negative
    number = np.zeros(rows.size, dtype=np.int64)
    count = np.zeros(rows.size, dtype=np.int64)
    going = np.ones(rows.size, dtype=bool)
    digit = np.empty(rows.size, dtype=np.uint8)
    # one digit position of every row at a time (whole-array steps are cheaper than shrinking the row set),
    # in place: no array allocated per step
    for k in range(MAX_DIGITS + 1):
        data.take(where, mode="clip", out=digit)
        np.subtract(digit, np.uint8(ord("0")), out=digit)  # wraps around below '0'
        going &= digit < 10
        going &= room > k
        if not going.any():
            break
        with np.errstate(over="ignore"):
            np.multiply(number, 10, out=number, where=going)
            np.add(number, digit, out=number, where=going)
        count += going
        where += 1
    value[rows] = np.where(negative, -number, number)
    digits[rows] = count
    return value, digits
