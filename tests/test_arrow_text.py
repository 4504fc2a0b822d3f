"""Byte-level helpers over Arrow string arrays, checked against Python's own string operations."""

import numpy as np
import pyarrow as pa

from dlprof_profiler.ingest import arrow_text as at

TEXTS = [
    "aten::mm, seq = 12, op_id = 3",
    "é, seq = -7",
    "seq = 1",
    "",
    "x, seq = 1234567890123456789",
    "y, seq = ",
    "z, seq = 00042x",
    "w, seq = -",
    "multi\nline, seq = 5",
]


def test_find_and_prefixes_match_python():
    texts = pa.array(TEXTS)
    pos = at.find(texts, ", seq = ")
    assert pos.tolist() == [t.encode().find(b", seq = ") for t in TEXTS]
    cut = np.where(pos >= 0, pos, 1 << 40)
    expected = [t.encode()[:p].decode() if p >= 0 else t for t, p in zip(TEXTS, pos)]
    assert at.prefixes(texts, cut).to_pylist() == expected
    assert at.prefixes(texts, np.full(len(TEXTS), 1 << 40)) is texts  # nothing cut: the same array
    sliced = texts.slice(1, 3)  # an array that is a slice
    assert at.prefixes(sliced, np.array([2, 0, 0])).to_pylist() == ["é", "", ""]


def test_anywhere_and_find_without_the_needle():
    texts = pa.array(["a", "b, op_id = 1"])
    assert at.anywhere(texts, b"op_id") and not at.anywhere(texts, b"sizes")
    assert at.find(texts, ", sizes = ").tolist() == [-1, -1]
    assert not at.anywhere(pa.array([], pa.string()), b"x")
    sliced = pa.array(["a, sizes = 1", "b\n", "c", "d, sizes = 2"]).slice(2, 1)  # only the slice's bytes count
    assert not at.anywhere(sliced, b"sizes") and not at.anywhere(sliced, b"\n")
    assert at.anywhere(sliced, b"c") and at.find(sliced, ", sizes = ").tolist() == [-1]


def test_ints_at_reads_what_python_int_reads():
    texts = pa.array(TEXTS)
    pos = at.find(texts, ", seq = ")
    value, digits = at.ints_at(texts, np.where(pos >= 0, pos + len(", seq = "), -1))
    for text, p, v, d in zip(TEXTS, pos, value, digits):
        if p < 0:
            assert d == 0
            continue
        rest = text.encode()[p + len(", seq = ") :]
        sign = rest[:1] == b"-"
        run = len(rest[sign:]) - len(rest[sign:].lstrip(b"0123456789"))
        assert d == min(run, at.MAX_DIGITS + 1), text
        assert at.number_at(texts, np.array([p + len(", seq = ") if t == text else -1 for t in TEXTS]))[
            TEXTS.index(text)
        ] == (run >= 1)
        if 1 <= run <= at.MAX_DIGITS:
            assert v == int(rest[: sign + run]), text


def test_pieces_take_the_spans_only():
    data = np.frombuffer("aé, seq = 1|xy|".encode(), dtype=np.uint8)
    start, stop = np.array([0, 0, 3, 13, 16]), np.array([0, 3, 3, 15, 16])  # empty spans, a gap, a multibyte char
    assert at.pieces(data, start, stop).to_pylist() == ["", "aé", "", "xy", ""]
    assert at.pieces(data, np.zeros(0, np.int64), np.zeros(0, np.int64)).to_pylist() == []
