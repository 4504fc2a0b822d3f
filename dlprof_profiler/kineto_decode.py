"""Decode a Kineto (torch.profiler) Chrome-trace JSON file into flat event columns, fast and exact.

The file is read once (gunzipped in memory when it is gzip), split into its top-level keys and its
`traceEvents` elements without being parsed (msgspec `Raw`), then decoded in chunks of events into typed
msgspec structs: only the fields dlprof uses are materialised, unknown fields are skipped inside the
decoder. Each chunk is turned into numpy columns (names as integer codes into one table of distinct
strings) and its structs are dropped, so the memory held at once is the file, one chunk of structs and
the columns.

Times: Chrome traces give `ts` and `dur` in microseconds as JSON decimals (`1712195495519695.8`,
`4.928`). Parsed as binary floats they would be off by up to 0.25 us at today's epoch values, so they are
kept as the raw JSON text and converted to integer nanoseconds by a vectorised decimal parser
(`decimal_ns`): exact for any decimal text, with round-half-away-from-zero below 1 ns.

No Python code runs per event: per-event work happens inside msgspec, numpy, pandas and Arrow, and the
struct fields are read with C-level `map(attrgetter(...))`.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import zlib
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Literal, Optional, Union

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa

from dlprof_profiler.errors import DLProfError

GZIP_MAGIC = b"\x1f\x8b"
GZIP_RATIO_TRUSTED = 64  # Kineto JSON compresses 10-30x
GUNZIP_PIECE = 16 << 20  # inflated at once: below glibc's largest mmap threshold, so the heap reuses it
CHUNK_BYTES = 8 << 20  # JSON text decoded at once
HEAD_BYTES = 4 << 20  # how much of a file `looks_like_trace` reads
RAW_SEPARATOR = b"\x1f"  # cannot occur in JSON text outside strings, and never unescaped inside them

Scalar = Union[int, float, str, bool, None]
EMPTY = msgspec.Raw(b"")


class EventArgs(msgspec.Struct, gc=False):
    """The `args` fields dlprof reads (every other field is skipped by the decoder)."""

    external_id: Scalar = msgspec.field(default=None, name="External id")
    seq: Scalar = msgspec.field(default=None, name="Sequence number")
    fwd_tid: Scalar = msgspec.field(default=None, name="Fwd thread id")
    input_dims: msgspec.Raw = msgspec.field(default=EMPTY, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=EMPTY, name="Input type")
    call_stack: Scalar = msgspec.field(default=None, name="Call stack")
    correlation: Scalar = None
    device: Scalar = None
    stream: Scalar = None
    context: Scalar = None
    grid: msgspec.Raw = EMPTY
    block: msgspec.Raw = EMPTY
    registers: Scalar = msgspec.field(default=None, name="registers per thread")
    shared_memory: Scalar = msgspec.field(default=None, name="shared memory")
    bytes: Scalar = None
    kind: Scalar = None
    name: Scalar = None  # process_name / thread_name metadata
    labels: Scalar = None  # process_labels metadata ("CPU", "GPU 0")
    total_allocated: Scalar = msgspec.field(default=None, name="Total Allocated")
    alloc_bytes: Scalar = msgspec.field(default=None, name="Bytes")
    device_type: Scalar = msgspec.field(default=None, name="Device Type")
    device_id: Scalar = msgspec.field(default=None, name="Device Id")
    sync_kind: Scalar = msgspec.field(default=None, name="cuda_sync_kind")


class Event(msgspec.Struct, gc=False):
    ph: Scalar = None
    cat: Scalar = None
    name: msgspec.Raw = EMPTY  # decoded once per distinct name (a str per event costs more)
    pid: Scalar = None
    tid: Scalar = None
    ts: msgspec.Raw = EMPTY
    dur: msgspec.Raw = EMPTY
    id: Scalar = None
    args: Optional[EventArgs] = None  # Optional: msgspec evaluates it, also on Python 3.9


PHASES = tuple(chr(c) for c in range(33, 127))  # every one-character Chrome trace phase
KNOWN_CATEGORIES = (
    "cpu_op",
    "Operator",
    "user_annotation",
    "python_function",
    "cuda_runtime",
    "Runtime",
    "cuda_driver",
    "kernel",
    "Kernel",
    "gpu_memcpy",
    "Memcpy",
    "gpu_memset",
    "Memset",
    "ac2g",
    "async",
    "async_cpu_to_gpu",
    "fwdbwd",
    "Trace",
    "gpu_user_annotation",
    "cpu_instant_event",
    "overhead",
    "cuda_sync",
    "mtia_runtime",
    "mtia_ccp_events",
    "xpu_runtime",
    "xpu_driver",
    "privateuse1_runtime",
    "privateuse1_driver",
    "cuda_profiler_range",
    "external_correlation",
    "collective_comm",
    "gpu_pm_counter",
    "glow_runtime",
)


class FastEvent(Event, gc=False):
    """Event whose phase and category decode to shared string objects (no string per event): used when
    every category of a chunk is a known one."""

    ph: Optional[Literal[PHASES]] = None
    cat: Optional[Literal[KNOWN_CATEGORIES]] = None


NO_ARGS = EventArgs()

# Event groups by category (Kineto's names from 2021 to 2026, compared lower-cased; ROCm and other devices
# use the same categories). Each group decodes only the args fields it needs.
OP, ANNOTATION, PYTHON, API, KERNEL, MEMCPY, MEMSET, SYNC, FLOW, SPAN, IGNORED, UNKNOWN, METADATA, MEMORY, NONE = range(
    15
)
CATEGORY_GROUPS = {
    "cpu_op": OP,
    "operator": OP,
    "user_annotation": ANNOTATION,
    "python_function": PYTHON,
    "cuda_runtime": API,
    "runtime": API,
    "cuda_driver": API,
    "driver": API,
    "mtia_runtime": API,
    "xpu_runtime": API,
    "xpu_driver": API,
    "privateuse1_runtime": API,
    "privateuse1_driver": API,
    "glow_runtime": API,
    "kernel": KERNEL,
    "mtia_ccp_events": KERNEL,
    "gpu_memcpy": MEMCPY,
    "memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "memset": MEMSET,
    "cuda_sync": SYNC,
    "ac2g": FLOW,
    "async": FLOW,
    "async_cpu_to_gpu": FLOW,
    "fwdbwd": FLOW,
    "trace": SPAN,
    "gpu_user_annotation": IGNORED,
    "cpu_instant_event": IGNORED,
    "overhead": IGNORED,
    "cuda_profiler_range": IGNORED,
    "external_correlation": IGNORED,
    "collective_comm": IGNORED,
    "gpu_pm_counter": IGNORED,
}
GPU_GROUPS = (KERNEL, MEMCPY, MEMSET)

# Numeric args (int64, -1 when absent or not a number), text args (codes into the string table) and raw
# JSON args (codes into the raw-text table), with the groups that read each.
INT_ARGS = {
    "external_id": (OP,),
    "seq": (OP,),
    "correlation": (API, KERNEL, MEMCPY, MEMSET, SYNC),
    "device": (KERNEL, MEMCPY, MEMSET, SYNC),
    "stream": (KERNEL, MEMCPY, MEMSET, SYNC),
    "context": (KERNEL, MEMCPY, MEMSET),
    "registers": (KERNEL,),
    "shared_memory": (KERNEL,),
    "bytes": (MEMCPY, MEMSET),
    "total_allocated": (MEMORY,),
    "alloc_bytes": (MEMORY,),
    "device_type": (MEMORY,),
    "device_id": (MEMORY,),
}
TEXT_ARGS = {"call_stack": (OP,), "kind": (MEMCPY,), "name": (METADATA,), "labels": (METADATA,), "sync_kind": (SYNC,)}
RAW_ARGS = {"input_dims": (OP,), "input_type": (OP,), "grid": (KERNEL,), "block": (KERNEL,)}


@dataclass
class Columns:
    """Every event of the trace as columns; strings as codes into `strings`, raw JSON into `raws`."""

    n: int
    ph: np.ndarray  # int32 codes
    cat: np.ndarray  # int32 codes
    name: np.ndarray  # int32 codes
    group: np.ndarray  # int8: OP, API, KERNEL ... (UNKNOWN for unknown categories)
    pid: np.ndarray  # int64: the number, or the string code of a text pid ("Spans")
    tid: np.ndarray  # int64: likewise ("stream 7")
    pid_numeric: np.ndarray  # bool: pid is a number
    tid_numeric: np.ndarray  # bool: tid is a number
    ts: np.ndarray  # int64 ns, exact
    ts_ok: np.ndarray  # bool: ts was a number
    dur: np.ndarray  # int64 ns, exact
    dur_ok: np.ndarray  # bool: dur was a number
    flow_id: np.ndarray  # int64 (flow events only)
    args: dict = field(default_factory=dict)  # INT_ARGS -> int64, TEXT_ARGS / RAW_ARGS -> int32 codes
    strings: list = field(default_factory=list)
    raws: list = field(default_factory=list)

    def string_array(self) -> np.ndarray:
        out = np.empty(len(self.strings), dtype=object)
        out[:] = self.strings
        return out

    def raw_array(self) -> np.ndarray:
        out = np.empty(len(self.raws), dtype=object)
        out[:] = self.raws
        return out


@dataclass
class Decoded:
    """A decoded trace file: its top-level metadata and its event columns."""

    path: Path
    meta: dict
    columns: Columns


# ---------------------------------------------------------------------------- reading the file


def read_bytes(path: Path):
    """The file's JSON text in one writable buffer (the decoder cuts it into chunks in place): the file
    mapped copy-on-write (nothing is copied, the file is never changed), or its gunzipped text. A
    one-line error naming the file when it cannot be read."""
    path = Path(path)
    if not path.exists():
        raise DLProfError(f"{path}: no such file")
    if path.is_dir():
        raise DLProfError(f"{path}: is a directory, not a trace file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            if head == GZIP_MAGIC:
                fh.seek(0)
                packed = bytearray(os.fstat(fh.fileno()).st_size)
                del packed[fh.readinto(packed) :]
            elif os.fstat(fh.fileno()).st_size == 0:
                return bytearray()
            else:
                return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError) as exc:
        raise DLProfError(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        return _gunzip(packed)
    except (EOFError, OSError, zlib.error) as exc:
        raise DLProfError(f"{path}: damaged or truncated gzip data ({exc})") from None


def _gunzip(packed: bytearray) -> bytearray:
    """Inflate gzip members into one buffer sized from the gzip trailer (no second copy of the text). The
    trailer of a truncated file is whatever bytes it ends with: the size it claims is believed only up to
    a ratio JSON does not exceed in practice (a larger text grows the buffer as it comes)."""
    guess = int.from_bytes(packed[-4:], "little") if len(packed) >= 18 else 0  # size mod 2**32
    out = bytearray(max(min(guess, len(packed) * GZIP_RATIO_TRUSTED), 1))
    filled = 0
    view = memoryview(packed)
    while view:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending = view
        while pending:
            piece = inflater.decompress(pending, GUNZIP_PIECE)
            pending = inflater.unconsumed_tail
            if filled + len(piece) > len(out):
                out.extend(bytes(filled + len(piece) - len(out)))
            out[filled : filled + len(piece)] = piece
            filled += len(piece)
            if inflater.eof:
                break
        if not inflater.eof:
            raise EOFError("compressed file ended before the end-of-stream marker was reached")
        rest = inflater.unused_data.lstrip(b"\0")
        view = memoryview(rest) if rest.startswith(GZIP_MAGIC) else memoryview(b"")  # another member
    del out[filled:]
    return out


def looks_like_trace(path: Path) -> bool:
    """Whether a file is Chrome-trace JSON by content: (gzipped) JSON text opening an object that has a
    `traceEvents` key near its start. A gzip file whose start cannot be inflated counts as a trace, so
    that reading it reports the damage."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError:
        return False
    if head.startswith(GZIP_MAGIC):
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, HEAD_BYTES)
        except zlib.error:
            return True
    text = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    return text.startswith(b"{") and b'"traceEvents"' in text


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[Event])
_FAST_EVENTS = msgspec.json.Decoder(list[FastEvent])
_BETWEEN_EVENTS = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_ONE_VALUE = json.JSONDecoder()
TAIL_BYTES = 1 << 20  # where the last event is looked for (and its largest size)
TAIL_CANDIDATES = 16
FAST_PATH_RETRIES = 64
_NOT_SPACE = re.compile(rb"\S")


def decode(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Decoded:
    """Decode a Kineto trace file; raises DLProfError with a one-line reason naming the file.

    The usual layout is read in one pass over the events: the traceEvents array is found by its key and
    its last event, the rest of the document is checked with the array left empty, and each chunk of
    events is checked as it decodes, which together validate the whole document. Anything unusual (or
    wrong) sends the file through the validating path: one pass that checks the whole document first,
    then the events, so every error is the one that path reports."""
    path = Path(path)
    data = read_bytes(path)
    try:
        if not _NOT_SPACE.search(data):
            raise DLProfError(f"{path}: empty file, not a Kineto trace")
        columns = None
        outline = _outline(data)
        if outline is not None:
            first, end, meta = outline
            try:
                columns = _columns(data, first, end, chunk_bytes, path, retries=FAST_PATH_RETRIES)
            except DLProfError:
                columns = None
        if columns is None:
            first, end, meta = _validated_outline(data, path)
            columns = _columns(data, first, end, chunk_bytes, path)
    finally:
        if isinstance(data, mmap.mmap):
            try:
                data.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with it
                pass
        del data
    return Decoded(path=path, meta=meta, columns=columns)


def _validated_outline(data, path: Path) -> tuple[int, int, dict]:
    """(first, end, meta): where the traceEvents array opens and closes, and the other top-level values,
    after checking the whole document (a full pass of the JSON parser over it)."""
    try:
        top = _TOP.decode(data)  # validates the whole document; values stay undecoded
    except msgspec.ValidationError:
        raise DLProfError(f"{path}: not a Kineto trace (the JSON is not an object with traceEvents)") from None
    except msgspec.DecodeError as exc:
        raise DLProfError(f"{path}: not valid JSON ({exc})") from None
    if "traceEvents" not in top:
        raise DLProfError(f"{path}: not a Kineto trace (no traceEvents in the JSON object)")
    events_raw = memoryview(top.pop("traceEvents"))
    meta = {key: msgspec.json.decode(value) for key, value in top.items()}
    del top
    if bytes(events_raw[:1]) != b"[":
        raise DLProfError(f"{path}: not a Kineto trace (traceEvents is not an array)")
    first = _offset_in(events_raw, data)
    if first is None:
        raise AssertionError("msgspec returned a copy of the traceEvents text")  # pragma: no cover
    return first, first + len(events_raw) - 1, meta


def _outline(data) -> tuple[int, int, dict] | None:
    """(first, end, meta) as `_validated_outline` gives them, without a pass over the events: the array
    is where the first `"traceEvents": [` is, it closes after the event that follows the last `}, {` of
    the file's tail, and the document without the events must be an object whose top-level traceEvents
    is that (now empty) array. None when any of this does not hold."""
    key = _EVENTS_KEY.search(data)
    if key is None:
        return None
    first = key.end() - 1
    end = _array_end(data, first)
    if end is None:
        return None
    outer = bytes(data[: first + 1]) + bytes(data[end:])
    try:
        top = _TOP.decode(outer)
    except msgspec.MsgspecError:
        return None
    events_raw = top.pop("traceEvents", None)
    if events_raw is None or bytes(events_raw) != b"[]" or _offset_in(memoryview(events_raw), outer) != first:
        return None  # not the top-level key (or not its only occurrence)
    return first, end, {key: msgspec.json.decode(value) for key, value in top.items()}


def _array_end(data, first: int) -> int | None:
    """The closing bracket of the events array opening at `first`: the last event starts at the last
    `}, {` of the file's tail (else it is the first event); Python's JSON decoder finds where that event
    ends, and only spaces may stand between it and the bracket."""
    opening = _NOT_SPACE.search(data, first + 1)
    if opening is None:
        return None
    if data[opening.start()] == 0x5D:  # "]": no events
        return opening.start()
    tail = max(first + 1, len(data) - TAIL_BYTES)
    starts = [m.end() - 1 for m in _BETWEEN_EVENTS.finditer(data, tail)]
    if tail == first + 1:
        starts.insert(0, opening.start())
    for start in reversed(starts[-TAIL_CANDIDATES:]):  # a match inside a string after the array: go back
        text = bytes(data[start : start + TAIL_BYTES]).decode("utf-8", "surrogateescape")
        try:
            _, stop = _ONE_VALUE.raw_decode(text)
        except ValueError:
            continue
        after = _NOT_SPACE.search(data, start + len(text[:stop].encode("utf-8", "surrogateescape")))
        return after.start() if after is not None and data[after.start()] == 0x5D else None
    return None


def _offset_in(part: memoryview, whole) -> int | None:
    """Where a msgspec Raw value (a JSON array) lies in the buffer it was decoded from; None when it is
    not a view of that buffer."""
    address = np.frombuffer(part, dtype=np.uint8).ctypes.data if len(part) else 0
    base = np.frombuffer(whole, dtype=np.uint8).ctypes.data
    offset = address - base
    if not 0 <= offset <= len(whole) - len(part) or whole[offset : offset + 1] != b"[":
        return None
    return offset


def _columns(data, first: int, end: int, chunk_bytes: int, path: Path, retries: int | None = None) -> Columns:
    """The columns of the events in data[first:end + 1]."""
    builder = _ColumnBuilder(path)
    chunks = _chunks(data, first, end, chunk_bytes, path, builder, retries)
    try:
        for events in chunks:
            builder.add(events)
            del events
    finally:
        chunks.close()
    return builder.finish()


def _chunks(data, first: int, end: int, chunk_bytes: int, path: Path, builder, retries: int | None = None):
    """The events of data[first:end + 1] (the traceEvents array) as lists of structs, about chunk_bytes of
    JSON at a time. A chunk is decoded in place: the separators around it (the array's own bracket or
    the `,` and spaces between two events) are overwritten with `[` and `]` while it decodes. `retries`
    bounds the cuts tried per chunk (when the document was not validated first, a chunk that does not
    decode may be damaged rather than cut inside a string)."""
    view = memoryview(data)
    start = first + 1
    while start < end:
        # Cut after about chunk_bytes at a "}, {" between two events; a match inside a JSON string is
        # caught because the text before it then ends inside the string and does not decode.
        cut = start + chunk_bytes
        tried = 0
        while True:
            tried += 1
            if retries is not None and tried > retries:
                raise DLProfError(f"{path}: traceEvents could not be cut into chunks")
            match = _BETWEEN_EVENTS.search(data, cut, end) if cut < end else None
            stop = match.start() + 1 if match else end
            opening, closing = data[start - 1], data[stop]
            data[start - 1], data[stop] = 0x5B, 0x5D  # "[", "]"
            try:
                events = _decode_events(view[start - 1 : stop + 1])
            except msgspec.ValidationError as exc:
                raise DLProfError(
                    f"{path}: unexpected event content ({_shift_path(str(exc), builder.count)})"
                ) from None
            except msgspec.DecodeError:
                if match is None:
                    raise DLProfError(f"{path}: traceEvents could not be decoded") from None
                cut = match.start() + 1
                continue
            finally:
                data[start - 1], data[stop] = opening, closing
            break
        start = match.end() - 1 if match else end
        yield events


def _decode_events(text) -> list:
    """Structs for a JSON array of events: phases and categories as shared objects when all are known
    ones, else (an unknown category) as plain strings."""
    try:
        return _FAST_EVENTS.decode(text)
    except msgspec.ValidationError:
        return _EVENTS.decode(text)


def _shift_path(message: str, offset: int) -> str:
    """msgspec reports `$[i]` inside the chunk: name the event's index in the whole traceEvents array."""
    return re.sub(r"\$\[(\d+)\]", lambda m: f"traceEvents[{int(m.group(1)) + offset}]", message, count=1)


# ---------------------------------------------------------------------------- chunks -> columns


class _TextTable:
    """Distinct values of text columns across chunks: per-chunk codes become global codes."""

    def __init__(self):
        self.values: list = []
        self.index: dict = {}
        self.few: dict = {None: -1}

    def few_codes(self, values: list) -> np.ndarray:
        """Global codes (int32) for a list of texts with few distinct values (phases, categories): one
        dict lookup per value (the decoder gives them as shared objects, whose hashes are cached)."""
        lookup = self.few.__getitem__
        try:
            return np.fromiter(map(lookup, values), dtype=np.int32, count=len(values))
        except (KeyError, TypeError):
            try:
                distinct = set(values)
            except TypeError:  # an array or object where a text was expected
                distinct = set(map(_hashable, values))
            for value in distinct:
                if value not in self.few:
                    self.few[value] = -1 if value is None else int(self.codes([value])[0])
            return np.fromiter(map(lookup, map(_hashable, values)), dtype=np.int32, count=len(values))

    def codes(self, values: list) -> np.ndarray:
        """Global codes (int32) for a list of texts; None -> -1. Hashing runs in Arrow, and Python
        touches each distinct value of the chunk once."""
        try:
            array = pa.array(values, type=pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a number where a text was expected
            array = pa.array([v if v is None or isinstance(v, str) else str(v) for v in values], type=pa.string())
        encoded = array.dictionary_encode()
        uniques = encoded.dictionary.to_pylist()
        mapping = np.empty(len(uniques) + 1, dtype=np.int32)
        mapping[-1] = -1
        for i, value in enumerate(uniques):
            code = self.index.get(value)
            if code is None:
                code = len(self.values)
                self.index[value] = code
                self.values.append(value)
            mapping[i] = code
        local = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        return mapping[local]

    def raw_codes(self, raws: list, decode) -> np.ndarray:
        """Global codes (int32) for raw JSON values (msgspec Raw; empty when absent -> -1): the bytes are
        hashed in Arrow, and `decode` turns each distinct one of the chunk into the value kept (None -> -1)."""
        encoded = _arrow_texts(*_end_to_end(raws), pa.large_binary()).dictionary_encode()
        uniques = encoded.dictionary.to_pylist()
        mapping = np.empty(len(uniques) + 1, dtype=np.int32)
        mapping[-1] = -1
        for i, raw in enumerate(uniques):
            value = decode(raw)
            if value is None:
                mapping[i] = -1
                continue
            code = self.index.get(value)
            if code is None:
                code = len(self.values)
                self.index[value] = code
                self.values.append(value)
            mapping[i] = code
        local = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        return mapping[local]


class _ColumnBuilder:
    def __init__(self, path: Path):
        self.path = path
        self.strings = _TextTable()
        self.raws = _TextTable()
        self.parts: list[dict] = []
        # columns most events lack (args, flow ids): (rows, values) pieces, scattered once at the end
        self.sparse: dict = {name: [] for name in ["flow_id"] + list(INT_ARGS) + list(TEXT_ARGS) + list(RAW_ARGS)}
        self.count = 0

    def add(self, events: list) -> None:
        n = len(events)
        part = {}
        for name in ("ph", "cat"):
            part[name] = self.strings.few_codes(list(map(attrgetter(name), events)))
        part["name"] = self.strings.raw_codes(list(map(attrgetter("name"), events)), self._name)
        part["group"] = group = self._groups(part["ph"], part["cat"], part["name"])
        for name in ("pid", "tid"):
            part[name], part[name + "_numeric"] = self._ids(list(map(attrgetter(name), events)))
        part["ts"], part["ts_ok"] = decimal_ns(list(map(attrgetter("ts"), events)))
        part["dur"], part["dur_ok"] = decimal_ns(list(map(attrgetter("dur"), events)))
        flows = np.flatnonzero(group == FLOW)
        if flows.size:
            self.sparse["flow_id"].append(
                (flows + self.count, to_int(list(map(attrgetter("id"), _take(events, flows)))))
            )
        args = list(map(attrgetter("args"), events))
        members = {g: np.flatnonzero(group == g) for g in np.unique(group).tolist()}
        subsets = {}
        for table, kind in ((INT_ARGS, "int"), (TEXT_ARGS, "text"), (RAW_ARGS, "raw")):
            for name, groups in table.items():
                key = tuple(groups)
                if key not in subsets:
                    rows = np.sort(np.concatenate([members.get(g, np.zeros(0, np.int64)) for g in groups]))
                    subsets[key] = (rows, _present(_take(args, rows)))
                rows, sub = subsets[key]
                if rows.size == 0:
                    continue
                values = list(map(attrgetter(name), sub))
                if kind == "int":
                    codes = to_int(values)
                elif kind == "text":
                    codes = self.strings.codes(values)
                else:
                    codes = self.raws.raw_codes(values, _utf8)
                self.sparse[name].append((rows + self.count, codes))  # only the rows of the groups that have it
        self.parts.append(part)
        self.count += n

    def _name(self, raw: bytes):
        """An event's name from its JSON text: a text, a number or boolean as text, None for null."""
        value = msgspec.json.decode(raw)
        if isinstance(value, (list, dict)):
            raise DLProfError(
                f"{self.path}: unexpected event content (an event name is "
                f"{'an array' if isinstance(value, list) else 'an object'}, not a text)"
            )
        return value if value is None or isinstance(value, str) else str(value)

    def _groups(self, ph: np.ndarray, cat: np.ndarray, name: np.ndarray) -> np.ndarray:
        """Group per event from its phase and category (decided once per distinct pair)."""
        radix = len(self.strings.values) + 1
        key = (ph.astype(np.int64) + 1) * radix + (cat + 1)  # codes are >= -1
        uniques, inverse = np.unique(key, return_inverse=True)
        groups = np.empty(uniques.size, dtype=np.int8)
        for i, k in enumerate(uniques.tolist()):  # once per distinct (phase, category)
            p, c = divmod(k, radix)
            groups[i] = _group(self.strings.values[p - 1] if p > 0 else "", self.strings.values[c - 1] if c > 0 else "")
        out = groups[inverse.reshape(-1)]
        memory_code = self.strings.index.get("[memory]")
        if memory_code is not None:
            out[(name == memory_code) & (out != METADATA)] = MEMORY
        return out

    def _ids(self, values: list) -> tuple[np.ndarray, np.ndarray]:
        """Numeric ids as int64 (Kineto writes truncated thread ids, so they may be negative) with a mask;
        text ids ("Spans", "stream 7") get the code of their text and a False mask."""
        lowest = np.iinfo(np.int64).min
        out = to_int(values, default=lowest)
        text = out == lowest
        if text.any():
            out[text] = self.strings.codes([values[i] for i in np.flatnonzero(text)])  # rare: device rows
        return out, ~text

    def finish(self) -> Columns:
        def cat(name, dtype):
            arrays = [p[name] for p in self.parts]
            return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)

        def scatter(name, dtype):
            if not self.sparse[name]:  # absent from the whole trace: one read-only -1 broadcast, no memory
                return np.broadcast_to(np.array(-1, dtype=dtype), (self.count,))
            column = np.full(self.count, -1, dtype=dtype)
            for rows, values in self.sparse[name]:
                column[rows] = values
            return column

        args = {name: scatter(name, np.int64) for name in INT_ARGS}
        args.update({name: scatter(name, np.int32) for name in list(TEXT_ARGS) + list(RAW_ARGS)})
        ts = cat("ts", np.int64)
        return Columns(
            n=ts.size,
            ph=cat("ph", np.int32),
            cat=cat("cat", np.int32),
            name=cat("name", np.int32),
            group=cat("group", np.int8),
            pid=cat("pid", np.int64),
            tid=cat("tid", np.int64),
            pid_numeric=cat("pid_numeric", bool),
            tid_numeric=cat("tid_numeric", bool),
            ts=ts,
            ts_ok=cat("ts_ok", bool),
            dur=cat("dur", np.int64),
            dur_ok=cat("dur_ok", bool),
            flow_id=scatter("flow_id", np.int64),
            args=args,
            strings=self.strings.values,
            raws=self.raws.values,
        )


def _group(ph: str, cat: str) -> int:
    if ph == "M":
        return METADATA
    if ph in ("s", "f", "t"):
        return FLOW
    if not cat:
        return NONE
    return CATEGORY_GROUPS.get(cat.lower(), UNKNOWN)


def _take(items: list, rows: np.ndarray) -> list:
    """items[rows] for a list (C-level gather)."""
    if rows.size == 0:
        return []
    if rows.size == 1:
        return [items[int(rows[0])]]
    return list(itemgetter(*rows.tolist())(items))


def _hashable(value):
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def _present(args: list) -> list:
    """args with a missing `args` object replaced by an empty one."""
    if None in args:
        return [NO_ARGS if a is None else a for a in args]  # rare: an event of these kinds without args
    return args


def to_int(values, default: int = -1) -> np.ndarray:
    """Integers from an object array of JSON scalars (ints, floats, numeric text); others -> default."""
    if isinstance(values, list):
        try:
            return np.fromiter(values, dtype=np.int64, count=len(values))  # all plain integers
        except (TypeError, ValueError, OverflowError):
            pass
        # mostly integers and a few others ("Spans" pids of the profiler's own rows): only those go the slow way
        plain = np.equal(np.fromiter(map(type, values), dtype=object, count=len(values)), int)
        if plain.any() and not plain.all():
            try:
                ints = np.fromiter(compress(values, plain), dtype=np.int64, count=int(plain.sum()))
            except OverflowError:
                ints = None
            if ints is not None:
                out = np.empty(len(values), dtype=np.int64)
                out[plain] = ints
                out[~plain] = to_int(list(compress(values, ~plain)), default)
                return out
    values = np.asarray(values, dtype=object)
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    try:
        numbers = np.array(values, dtype=np.float64)  # None -> nan; "12" -> 12.0
    except (TypeError, ValueError):
        numbers = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(np.float64)
    out = np.full(values.size, default, dtype=np.int64)
    ok = np.isfinite(numbers) & (np.abs(numbers) < 2.0**62)
    out[ok] = numbers[ok].astype(np.int64)
    # integers beyond float precision (2^53) are taken exactly from the Python ints themselves
    big = ok & (np.abs(numbers) >= 2.0**53)
    if big.any():
        out[big] = [int(v) if isinstance(v, int) else int(float(v)) for v in values[big]]
    return out


def _end_to_end(raws: list) -> tuple[bytes, np.ndarray]:
    """The raw values' bytes laid end to end, and their lengths. Joined with a separator JSON text cannot
    hold unescaped, which numpy then finds and removes (cheaper than asking each value its length)."""
    joined = np.frombuffer(RAW_SEPARATOR.join(raws + [EMPTY]), dtype=np.uint8)  # a separator after each
    is_separator = joined == RAW_SEPARATOR[0]
    ends = np.flatnonzero(is_separator)
    lengths = np.diff(ends, prepend=-1) - 1
    return joined[~is_separator].tobytes(), lengths


def _arrow_texts(text: bytes, lengths: np.ndarray, kind: pa.DataType) -> pa.Array:
    """The values laid end to end in `text` (of these lengths) as an Arrow string or binary array over
    the same bytes (no copy); empty values are nulls."""
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    valid = np.packbits(lengths > 0, bitorder="little")
    return pa.Array.from_buffers(kind, lengths.size, [pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(text)])


def _utf8(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


# ---------------------------------------------------------------------------- exact decimal parsing

_POW10 = np.array([10**k for k in range(19)], dtype=np.int64)
# character classes: 0 other, 1 digit, 2 '.', 3 'e'/'E', 4 '-', 5 '+', 6 the separator
_CLASS = np.zeros(256, dtype=np.uint8)
_CLASS[ord("0") : ord("9") + 1] = 1
_CLASS[ord(".")] = 2
_CLASS[[ord("e"), ord("E")]] = 3
_CLASS[ord("-")] = 4
_CLASS[ord("+")] = 5
_CLASS[RAW_SEPARATOR[0]] = 6


def decimal_ns(raws: list, scale: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Decimal JSON numbers (raw texts, e.g. microseconds) times 10**scale as exact int64 values, with a
    validity mask (False for missing values, non-numbers and values beyond int64).

    Kineto writes plain decimals with at most three fractional digits (`1712195495519695.800`, `4.928`,
    integers in old traces): Arrow's exact string -> decimal cast reads those in C. Anything else (an
    exponent, more digits than the scale keeps, which needs rounding, a value that is not a number) goes
    to the character-level parser, which handles every JSON number."""
    n = len(raws)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    text, lengths = _end_to_end(raws)
    if text.find(b"e") < 0 and text.find(b"E") < 0:  # no exponent (nor `true`/`false`)
        fast = _plain_decimals(text, lengths, scale)
        if fast is not None:
            return fast
    return _decimal_ns_by_characters(raws, scale)


def _plain_decimals(text: bytes, lengths: np.ndarray, scale: int) -> tuple[np.ndarray, np.ndarray] | None:
    """decimal_ns for values without exponent through Arrow's decimal128 cast (the unscaled 128-bit
    integer is the result); None when a value does not cast exactly (too many digits, not a number)."""
    n = lengths.size
    present = lengths > 0
    strings = _arrow_texts(text, lengths, pa.large_string())
    try:
        decimals = strings.cast(pa.decimal128(38, scale))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    words = np.frombuffer(decimals.buffers()[1], dtype=np.int64, count=2 * (decimals.offset + n))[2 * decimals.offset :]
    low, high = words[0::2], words[1::2]  # little-endian two's complement halves
    ok = present & (high == (low >> 63)) & (low != np.iinfo(np.int64).min)
    return np.where(ok, low, 0), ok


def _decimal_ns_by_characters(raws: list, scale: int) -> tuple[np.ndarray, np.ndarray]:
    """decimal_ns for any JSON value.

    Vectorised over the characters of all values at once: each digit contributes digit * 10**place,
    its place counted from the decimal point and shifted by the exponent and the scale; the first digit
    below the units of the result rounds half away from zero. The raws are valid JSON values (msgspec
    checked them), so a value made only of digits, '.', 'e', 'E', '+' and '-' is a number."""
    n = len(raws)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    buf = np.frombuffer(RAW_SEPARATOR.join(raws) + RAW_SEPARATOR, dtype=np.uint8)
    klass = _CLASS[buf]
    ends = np.flatnonzero(klass == 6)  # one separator after each value
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    is_digit = klass == 1
    valid = ~np.logical_or.reduceat(klass == 0, starts) & np.logical_or.reduceat(is_digit, starts)
    lengths = (ends - starts + 1).astype(np.int32)
    index = np.arange(buf.size, dtype=np.int32)
    digit = buf.astype(np.int64) - 48
    # the mantissa ends at the 'e' (else at the separator); its decimal point is there when it has none
    mantissa_end = ends.astype(np.int32)
    shift = np.full(n, scale, dtype=np.int32)
    is_e = klass == 3
    if is_e.any():
        e_at = np.flatnonzero(is_e).astype(np.int32)
        mantissa_end[np.searchsorted(ends, e_at)] = e_at
        in_exponent = index > np.repeat(mantissa_end, lengths)
        exp_digit = is_digit & in_exponent
        places = np.repeat(ends.astype(np.int32), lengths) - index - 1
        exponent = np.add.reduceat(np.where(exp_digit & (places < 4), digit * _POW10[np.clip(places, 0, 3)], 0), starts)
        valid &= ~np.logical_or.reduceat(exp_digit & (places >= 4), starts)  # |exponent| > 9999
        negative_exp = buf[np.minimum(mantissa_end + 1, buf.size - 1)] == ord("-")
        exponent = np.where(negative_exp & (mantissa_end < ends), -exponent, exponent)
        shift = (shift + exponent).astype(np.int32)
        is_digit = is_digit & ~in_exponent
    point = mantissa_end.copy()
    dots = np.flatnonzero(klass == 2).astype(np.int32)
    point[np.searchsorted(ends, dots)] = dots
    ref = np.repeat(point, lengths)
    place = ref - index - (index < ref) + np.repeat(shift, lengths)
    kept = is_digit & (place >= 0) & (place <= 18)
    magnitude = np.add.reduceat(np.where(kept, digit * _POW10[np.clip(place, 0, 18)], 0), starts)
    round_up = np.logical_or.reduceat(is_digit & (place == -1) & (digit >= 5), starts)
    valid &= ~np.logical_or.reduceat(is_digit & (place > 18) & (digit > 0), starts)
    with np.errstate(over="ignore"):
        magnitude = magnitude + round_up
    valid &= magnitude >= 0  # a sum past int64 (values near 10**19) wraps negative
    value = np.where(buf[starts] == ord("-"), -magnitude, magnitude)
    return np.where(valid, value, 0), valid
