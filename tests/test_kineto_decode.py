"""Decoding a Kineto trace in bounded memory: a mapped trace file gives its pages back as its chunks are
decoded, and the arguments are held as the rows that have them. The real traces (tests/data/kineto, and the
malformed one PyTorch wrote) read from their mapping in small chunks, so that chunk boundaries and page
releases cut through every trace, give the same frames as the gunzipped text read in one go."""

from __future__ import annotations

import gzip
import json
import mmap

import numpy as np
import pandas as pd
import pytest

from dlprof_profiler.ingest import kineto_decode as kd
from dlprof_profiler.ingest.kineto import build_trace, read_kineto_trace
from tests import data

FIXTURES = sorted(data.KINETO.glob("*.json.gz")) + sorted(data.KINETO_MALFORMED.glob("*.json.gz"))
FRAMES = ("ranges", "api_calls", "gpu", "syncs", "devices", "processes", "threads", "memory")


def _releases(monkeypatch) -> list:
    """The _PageRelease of each decode, kept for the test to look at."""
    made = []
    real = kd._PageRelease.of

    def of(data_, path):
        release = real(data_, path)
        made.append(release)
        return release

    monkeypatch.setattr(kd._PageRelease, "of", of)
    return made


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
def test_mapped_trace_read_in_small_chunks_equals_the_gunzipped_one(tmp_path, monkeypatch, fixture):
    text = gzip.decompress(fixture.read_bytes())
    plain = tmp_path / fixture.name.removesuffix(".gz")
    plain.write_bytes(text)
    whole = read_kineto_trace(fixture)  # gunzipped into memory: nothing is released
    releases = _releases(monkeypatch)
    chunk = max(len(text) // 50, 1 << 12)  # ~50 chunks: a boundary every few pages
    staged = build_trace(kd.decode(plain, chunk_bytes=chunk))
    # the pages before the last chunk went back (only a mapping of the file is released)
    assert releases and releases[-1] is not None
    assert releases[-1].done >= len(text) - 2 * chunk - 2 * mmap.PAGESIZE
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(staged, name), getattr(whole, name), check_exact=True, obj=name)
    assert staged.meta == whole.meta and staged.system == whole.system
    assert staged.warnings == [w.replace(str(fixture), str(plain)) for w in whole.warnings]
    # and the events are those json.loads reads (independently of the decoder), where the text is valid JSON
    try:
        events = json.loads(text)["traceEvents"]
    except ValueError:
        return  # the malformed trace: its repairs are checked in test_kineto_repair.py
    decoded = kd.decode(plain, chunk_bytes=chunk).columns
    assert decoded.n == len(events)
    assert [decoded.strings[c] if c >= 0 else None for c in decoded.name] == [e.get("name") for e in events]


def test_gunzipped_text_is_never_released(tmp_path):
    """An anonymous mapping (the gunzipped text) would read zeros once released: it is kept."""
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}]}'))
    data_ = kd.read_bytes(path)
    assert kd._PageRelease.of(data_, path) is None
    plain = tmp_path / "t.json"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    mapped = kd.read_bytes(plain)
    assert isinstance(kd._PageRelease.of(mapped, plain), kd._PageRelease)
    mapped.close()


def test_arguments_are_whole_columns_with_minus_one_where_absent(tmp_path):
    """SparseArgs gives each argument as a column over every event, as the builders index it."""
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 1,
            "dur": 1,
            "args": {"Sequence number": 7},
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 3, "dur": 1},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mul",
            "pid": 1,
            "tid": 1,
            "ts": 5,
            "dur": 1,
            "args": {"Sequence number": 9},
        },
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    args = kd.decode(path, chunk_bytes=1).columns.args
    assert args["seq"].tolist() == [7, -1, 9]
    assert args["seq"] is not args["seq"]  # built per lookup: a builder may change its copy
    assert args["correlation"].tolist() == [-1, -1, -1] and not args["correlation"].flags.writeable
    assert set(args) == set(kd.INT_ARGS) | set(kd.TEXT_ARGS) | set(kd.RAW_ARGS)
    assert args["call_stack"].dtype == np.int32 and args["seq"].dtype == np.int64


def test_argument_values_at_rows_without_the_whole_column():
    """SparseArgs.at: the values at event positions in any order, -1 where the event lacks the argument,
    in the argument's own dtype; an argument absent from the whole trace gives -1 everywhere."""
    args = kd.SparseArgs(10)
    args.add("seq", [(np.array([1, 4]), np.array([10, 40])), (np.array([7]), np.array([70]))], np.int64)
    args.add("call_stack", [(np.array([9]), np.array([3]))], np.int32)
    args.add("flops", [], np.int64)
    at = args.at("seq", np.array([7, 0, 4, 9, 1, 8]))
    assert at.tolist() == [70, -1, 40, -1, 10, -1] and at.dtype == np.int64
    stacks = args.at("call_stack", np.array([9, 8, 0]))
    assert stacks.tolist() == [3, -1, -1] and stacks.dtype == np.int32
    assert args.at("flops", np.array([0, 5])).tolist() == [-1, -1]
    assert args.at("seq", np.zeros(0, dtype=np.int64)).tolist() == []
