"""Reading the malformed JSON PyTorch writes (issue 21.2): each event with an unescaped quote or backslash, a
raw control character or bytes that are not UTF-8 is read with the name its writer meant (hand-written
here), counted by kind in one warning; what is not such an event keeps the one-line error with its byte."""

from __future__ import annotations

import gzip
import json

import pytest

from dlprof_profiler.ingest import formats as ingest
from dlprof_profiler.ingest import kineto_decode as kd
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest.kineto import read_kineto_trace
from dlprof_profiler.ingest.kineto_repair import BACKSLASH, CONTROL, QUOTE, UTF8, repair_event
from tests import data
from tests.kineto_builder import KinetoTrace

MAIN = 10
# (the name's bytes as PyTorch writes them, between the quotes; the name it meant; what is repaired)
BROKEN = [
    (b'aten::m"m', 'aten::m"m', QUOTE),
    (b"C:\\x\\cuda\\mm", "C:\\x\\cuda\\mm", BACKSLASH),  # \x and \c are no JSON escapes
    (b"aten::\tm\nm\x01", "aten::\tm\nm\x01", CONTROL),
    (b"aten::\xff\xfemm", "aten::\ufffd\ufffdmm", UTF8),
    # pytorch/pytorch#113001 and the fixture: a Python frame whose source line is a docstring
    (b'torch/profiler/_cupti_monitor.py(0):     """', 'torch/profiler/_cupti_monitor.py(0):     """', QUOTE),
    (
        b'_test_lib_impl = torch.library.Library("_inductor_test", "IMPL")\n(1): <module>',
        '_test_lib_impl = torch.library.Library("_inductor_test", "IMPL")\n(1): <module>',
        QUOTE | CONTROL,
    ),
    # pytorch/kineto#1459: a dict-like co_filename, with `", "key":` inside
    (b'{"device": "cpu", "dtype": "float32"}(12): run', '{"device": "cpu", "dtype": "float32"}(12): run', QUOTE),
    # pytorch/pytorch#98432 (Windows): \n is a JSON escape, \m is not: the whole name is raw text
    (
        b"C:\\new\\torch\\nn\\modules\\module.py(1): _call_impl",
        "C:\\new\\torch\\nn\\modules\\module.py(1): _call_impl",
        BACKSLASH,
    ),
    (b"C:\\dir\\", "C:\\dir\\", BACKSLASH),  # a path ending in a backslash: \" is no escape here
]
VALID = ["weird}, {name", 'quoted "x"', "aten::mm"]  # valid JSON names, read as json.loads does


def broken_trace(names: list[bytes], python: bool = False) -> bytes:
    """A trace whose i-th event is an op (or a Python frame) named names[i] as written, between valid events."""
    k = KinetoTrace()
    for i in range(len(names)):
        k.cpu_op(MAIN, i * 10_000, 1000, VALID[i % len(VALID)], seq=i)
        (k.python if python else k.cpu_op)(MAIN, i * 10_000 + 2000, 1000, f"@@{i}@@")
    text = k.text().encode()
    for i, name in enumerate(names):
        text = text.replace(b'"@@%d@@"' % i, b'"' + name + b'"')
    return text


def names_of(decoded) -> list:
    c = decoded.columns
    return [c.strings[code] for code in c.name]


def test_repair_event_reads_the_name_its_writer_meant():
    for written, meant, kinds in BROKEN:
        text = b'[{"ph": "X", "name": "' + written + b'", "pid": 1, "ts": 1.5, "args": {"a": "b"}}, {"ph": "X"}]'
        repaired = repair_event(text, 1, len(text) - 1)
        assert repaired is not None, written
        assert json.loads(repaired.text) == {"ph": "X", "name": meant, "pid": 1, "ts": 1.5, "args": {"a": "b"}}
        assert repaired.kinds == kinds and text[repaired.end - 1 : repaired.end] == b"}", written


@pytest.mark.parametrize("chunk_bytes", [kd.CHUNK_BYTES, 1, 300])
def test_broken_names_are_repaired_and_counted(tmp_path, chunk_bytes):
    """Every broken name of the table, in one trace, also when the chunks are cut at every event or inside
    broken names: the names are those meant, the valid ones those json.loads reads, each repair counted."""
    path = tmp_path / "broken.json"
    path.write_bytes(broken_trace([w for w, _, _ in BROKEN]))
    decoded = kd.decode(path, chunk_bytes=chunk_bytes)
    want = []
    for i, (_, meant, _) in enumerate(BROKEN):
        want += [VALID[i % len(VALID)], meant]
    assert names_of(decoded) == want
    assert decoded.columns.repaired_events == len(BROKEN)
    assert decoded.columns.repairs == {QUOTE: 4, BACKSLASH: 3, CONTROL: 2, UTF8: 1}
    assert decoded.columns.ts.tolist() == [i * 10_000 + d for i in range(len(BROKEN)) for d in (0, 2000)]


def test_one_warning_counts_every_repaired_event(tmp_path):
    path = tmp_path / "broken.json"
    path.write_bytes(broken_trace([w for w, _, _ in BROKEN], python=True))
    trace = read_kineto_trace(path)
    repaired = [w for w in trace.warnings if "repaired" in w]
    assert repaired == [
        f"{path}: 9 events written as invalid JSON were repaired and read (4 with unescaped quotes, 3 with "
        "unescaped backslashes, 2 with raw control characters, 1 with bytes that are not UTF-8)"
    ]
    assert len(trace.ranges) == len(BROKEN)  # the ops; the Python frames give stack traces only


def test_repairs_in_a_layout_the_one_pass_reading_does_not_expect(tmp_path):
    """`}, {` after the events array sends the file through the validating path; the document is not JSON
    there, and is then read event by event with the same repairs."""
    text = broken_trace([w for w, _, _ in BROKEN[:3]])
    text = text.replace(b"]}", b'], "deviceProperties": [{"id": 0}, {"id": 1}]}')
    path = tmp_path / "layout.json"
    path.write_bytes(text)
    decoded = kd.decode(path, chunk_bytes=200)
    assert names_of(decoded)[1::2] == [meant for _, meant, _ in BROKEN[:3]]
    assert decoded.columns.repaired_events == 3 and decoded.meta["deviceProperties"] == [{"id": 0}, {"id": 1}]


def test_texts_in_args_are_repaired_too(tmp_path):
    """2021 traces carry the Python stack as an args text (`Call stack`), written unescaped on Windows."""
    k = KinetoTrace()
    k.cpu_op(MAIN, 0, 1000, "aten::mm", seq=1, stack="@@stack@@")
    k.cpu_op(MAIN, 2000, 1000, "aten::add", seq=2)
    path = tmp_path / "stack.json"
    path.write_bytes(k.text().encode().replace(b'"@@stack@@"', b'"C:\\work\\train.py(12): step;C:\\work\\m.py(3): f"'))
    decoded = kd.decode(path)
    stack = decoded.columns.args["call_stack"][0]
    assert decoded.columns.strings[stack] == "C:\\work\\train.py(12): step;C:\\work\\m.py(3): f"
    assert decoded.columns.repairs == {BACKSLASH: 1} and names_of(decoded) == ["aten::mm", "aten::add"]


def test_repair_only_where_a_string_is_broken():
    """Other strings are not read raw, keys never are, a repair never swallows an event key or merges two
    events, and a well-formed event followed by what cannot follow one is not repaired."""
    cases = [
        b'[{"ph": "X", "cat": "cpu"op", "name": "a"}]',  # the category is not written unescaped
        b'[{"ph": "X", "na"me": "a"}]',  # nor are keys
        b'[{"ph": "X", "name": "a", "pid" 1}]',  # a structural error is no string to repair
        b'[{"ph": "X", "name": "a"}], "traceEvents": [{"ph": "X", "name": "b"}]',  # well-formed, then not an event
    ]
    for text in cases:
        assert repair_event(text, 1, len(text) - 1) is None, text
    # the quote after `a` can end the name only if "pid" stays a key of the event
    text = b'[{"ph": "X", "name": "a"b", "pid": 1, "tid": "c"}]'
    assert json.loads(repair_event(text, 1, len(text) - 1).text)["name"] == 'a"b'
    # a name cannot reach into the next event
    text = b'[{"ph": "X", "name": "a}, {"ph": "X", "name": "b"}]'
    assert repair_event(text, 1, len(text) - 1) is None


def test_real_trace_with_the_unescaped_name():
    """The PyTorch 2.13 fixture: one event, a Python frame, repaired; every other event as a simple
    independent repair of its name lines reads them."""
    path = data.KINETO_MALFORMED / "pytorch2.13_cpu_unescaped_name.pt.trace.json.gz"
    decoded = kd.decode(path)
    doc = json.loads(independently_repaired(gzip.decompress(path.read_bytes()).decode()))
    assert decoded.columns.repaired_events == 1 and decoded.columns.repairs == {QUOTE: 1}
    assert names_of(decoded) == [e.get("name") for e in doc["traceEvents"]]
    assert 'torch/profiler/_cupti_monitor.py(0):     """' in names_of(decoded)


def independently_repaired(text: str) -> str:
    """Kineto writes `"name": "..."` on a line of its own: a name line that is not JSON gets its text escaped."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        head, sep, rest = line.partition('"name": "')
        if not sep or not rest.rstrip(",").endswith('"'):
            continue
        body = rest.rstrip(",")[:-1]
        try:
            json.loads('"' + body + '"')
        except ValueError:
            lines[i] = head + '"name": ' + json.dumps(body) + rest[len(rest.rstrip(",")) :]
    return "\n".join(lines)


@pytest.mark.slow
def test_valid_fixtures_need_no_repair():
    for path in sorted(data.KINETO.glob("*.json*")):
        assert kd.decode(path).columns.repaired_events == 0, path.name


# ---------------------------------------------------------------------------- what cannot be repaired


def error_of(path) -> str:
    with pytest.raises(DLProfError) as err:
        ingest.read_trace(path)
    text = str(err.value)
    assert str(path) in text and "\n" not in text
    return text


def test_garbage_inside_an_event_is_named_with_its_byte(tmp_path):
    text = broken_trace([b'aten::m"m', b"aten::ok"])
    damaged = text.replace(b', "pid": 4242, "tid": 10, "ts": 10.000', b', #pid@ 4242, "tid": 10, "ts": 10.000', 1)
    assert damaged != text
    path = tmp_path / "garbage.json"
    path.write_bytes(damaged)
    at = damaged.index(b"#pid@")
    message = error_of(path)
    assert message.startswith(f"{path}: not valid JSON (JSON is malformed: "), message
    assert message.endswith(f" (byte {at:,})); the event there cannot be repaired"), message


def test_truncated_array_names_the_end(tmp_path):
    text = broken_trace([b'aten::m"m', b"aten::ok", b"aten::ok"])
    path = tmp_path / "cut.json"
    path.write_bytes(text[: len(text) * 2 // 3])
    message = error_of(path)
    assert "not valid JSON" in message and f"the text ends at byte {len(text) * 2 // 3:,}" in message


def test_random_bytes_after_the_key_are_an_error(tmp_path):
    path = tmp_path / "random.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "a"}, ' + bytes(range(256)) * 4 + b"]}")
    assert "not valid JSON" in error_of(path)
