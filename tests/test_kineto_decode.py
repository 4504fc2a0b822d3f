"""Decoding a Kineto trace in bounded memory: a mapped trace file gives its pages back as its chunks are
decoded, and the arguments are held as the rows that have them. The real traces (tests/data/kineto, and the
malformed one PyTorch wrote) read from their mapping in small chunks, so that chunk boundaries and page
releases cut through every trace, give the same frames as the gunzipped text read in one go."""

from __future__ import annotations

import gzip
import json
import mmap

import msgspec
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


# ---------------------------------------------------------------------------- decoding in parts side by side


def _plain(tmp_path, fixture):
    text = gzip.decompress(fixture.read_bytes())
    plain = tmp_path / fixture.name.removesuffix(".gz")
    plain.write_bytes(text)
    return plain, text


@pytest.mark.slow
@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.name)
def test_trace_decoded_in_parts_by_helper_processes_equals_one_pass(tmp_path, fixture):
    """Three parts, two of them decoded by helper processes at the same time, merged into the frames the
    one-pass read gives; the malformed trace's rewritten events send the parts from there to one pass."""
    plain, text = _plain(tmp_path, fixture)
    whole = read_kineto_trace(fixture)
    decoded = kd.decode(plain, chunk_bytes=max(len(text) // 40, 1 << 12), parts=3)
    valid = fixture.parent == data.KINETO
    assert decoded.columns.parts_decoded == 3 if valid else decoded.columns.parts_decoded < 3
    staged = build_trace(decoded)
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(staged, name), getattr(whole, name), check_exact=True, obj=name)
    assert staged.meta == whole.meta
    assert staged.warnings == [w.replace(str(fixture), str(plain)) for w in whole.warnings]


def _events_text(events: list) -> bytes:
    return json.dumps({"traceEvents": events, "schemaVersion": 1}, indent=1).encode()


def _names_and_times(columns) -> tuple[list, list]:
    return [columns.strings[c] if c >= 0 else None for c in columns.name], columns.ts.tolist()


def test_parts_merge_each_helpers_own_strings_and_sparse_rows(tmp_path):
    """Each part meets names, texts and raw arguments in its own order: merged, every event has the name,
    call stack, input dims and external id json.loads reads, whatever part decoded it."""
    events = []
    for i in range(600):
        args = {"External id": i} if i % 3 else {"Input Dims": [[i % 7, 2]], "Call stack": f"f{i % 11}.py"}
        events.append({"ph": "X", "cat": "cpu_op", "name": f"op{(i * 37) % 50}", "ts": i, "dur": 1, "args": args})
    path = tmp_path / "t.json"
    path.write_bytes(_events_text(events))
    for parts in (3,):
        columns = kd.decode(path, chunk_bytes=1 << 12, parts=parts).columns
        assert columns.parts_decoded == parts
        assert _names_and_times(columns) == ([e["name"] for e in events], [e["ts"] * 1000 for e in events])
        stacks = columns.args["call_stack"]
        dims = columns.args["input_dims"]
        assert [columns.strings[s] if s >= 0 else None for s in stacks] == [e["args"].get("Call stack") for e in events]
        assert [json.loads(columns.raws[d]) if d >= 0 else None for d in dims] == [
            e["args"].get("Input Dims") for e in events
        ]
        assert columns.args["external_id"].tolist() == [e["args"].get("External id", -1) for e in events]


def test_a_cut_inside_a_string_is_not_taken(tmp_path):
    """Names from some event on hold the `}, {` parts are cut at (json.dumps writes "name" last, so a cut
    there finds the one inside the name first): the part that ends at such a cut ends inside a string,
    does not decode, and it and the rest are read in one pass by this process."""
    path = tmp_path / "t.json"
    # parts=2: the cut halfway lies between events; parts=4: the last cut lies in a name, so the third
    # part (a helper's) fails and is read here; names with `}, {` from the first event: the first part's
    # own end lies in a name
    for parts, taken, braced in ((2, 2, 270), (4, 2, 270), (3, 1, 0)):
        events = [
            {"ph": "X", "ts": i, "dur": 1, "name": f'n{i}}}, {{"x": {i}' if i >= braced else f"n{i}"}
            for i in range(400)
        ]
        path.write_bytes(_events_text(events))
        columns = kd.decode(path, chunk_bytes=1 << 12, parts=parts).columns
        assert columns.parts_decoded == taken, parts
        assert _names_and_times(columns) == ([e["name"] for e in events], [e["ts"] * 1000 for e in events])


def test_a_helper_that_fails_leaves_its_part_to_this_process(tmp_path, monkeypatch):
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i % 9}", "ts": i, "dur": 2} for i in range(300)]
    path = tmp_path / "t.json"
    path.write_bytes(_events_text(events))
    monkeypatch.setattr(kd, "PART_PROGRAM", "dlprof_profiler.no_such_module")
    columns = kd.decode(path, chunk_bytes=1 << 12, parts=3).columns
    assert columns.parts_decoded == 1
    assert _names_and_times(columns) == ([e["name"] for e in events], [e["ts"] * 1000 for e in events])


def test_an_error_in_a_helpers_part_names_the_event_as_one_pass_does(tmp_path):
    events = [{"ph": "X", "name": "a", "ts": i, "dur": 1} for i in range(300)]
    events[250]["args"] = {"External id": [1, 2]}  # an array where a scalar is read
    path = tmp_path / "t.json"
    path.write_bytes(_events_text(events))
    with pytest.raises(kd.DLProfError) as one_pass:
        kd.decode(path, chunk_bytes=1 << 12, parts=1)
    with pytest.raises(kd.DLProfError) as in_parts:
        kd.decode(path, chunk_bytes=1 << 12, parts=3)
    assert "traceEvents[250]" in str(one_pass.value)
    assert str(in_parts.value) == str(one_pass.value)


def test_a_helper_refuses_a_file_that_changed(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(_events_text([{"ph": "X", "name": "a", "ts": 1, "dur": 1}]))
    stat = path.stat()
    messages = list(kd.decode_part(path, 0, 10, 1 << 12, None, (stat.st_size + 1, stat.st_mtime_ns)))
    assert messages == [("error", f"{path} changed while it was read")]


def test_a_large_plain_trace_is_cut_into_one_part_per_cpu(monkeypatch):
    text = bytearray(b'{"traceEvents": [' + b", ".join([b'{"ph": "X"}'] * 1000) + b"]}")
    first, end = text.index(b"["), len(text) - 2
    monkeypatch.setattr(kd, "PART_BYTES", (end - first) // 3)
    monkeypatch.setattr(kd.os, "sched_getaffinity", lambda pid: {0, 1})
    assert len(kd._part_cuts(text, first, end, None)) == 1  # two CPUs: this process and one helper
    monkeypatch.setattr(kd.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert len(kd._part_cuts(text, first, end, None)) == 2  # three shares of PART_BYTES
    monkeypatch.setattr(kd, "PART_BYTES", end - first + 1)
    assert kd._part_cuts(text, first, end, None) == []  # smaller than one share: one pass


@pytest.mark.parametrize(
    "text", [b'"aten::\xff\xfemm"', b'[{"name": "a\xffb", "ph": "X"}]', b'{"traceEvents": [], "x": "\xc3"}']
)
def test_text_that_is_not_utf8_is_refused_as_such(text):
    """msgspec 0.23 refuses it with a DecodeError that names no byte, earlier versions with a
    UnicodeDecodeError: the readers get the latter from either (else they take it for a cut chunk)."""
    with pytest.raises(UnicodeDecodeError):
        kd._ANY.decode(text)


def test_malformed_json_stays_a_decode_error_naming_its_byte():
    with pytest.raises(msgspec.DecodeError, match=r"\(byte \d+\)"):
        kd._SYNTAX.decode(b'[{"name": "a"} x')
