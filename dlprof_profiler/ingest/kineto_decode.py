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

import codecs
import json
import mmap
import os
import pickle
import re
import subprocess
import sys
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Literal, Optional, Union

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa

from dlprof_profiler.errors import DLProfError
from dlprof_profiler.process_memory import available_memory, release_unused_memory
from dlprof_profiler.ingest.kineto_repair import KIND_NAMES, UTF8, repair_event

GZIP_MAGIC = b"\x1f\x8b"
GZIP_RATIO_TRUSTED = 64  # Kineto JSON compresses 10-30x: the trailer's size is believed up to this
GZIP_RATIO_LIMIT = 256  # text beyond this many times the compressed bytes read is no trace
GZIP_SLACK = 64 << 20  # the first text bytes, allowed any ratio
WHITESPACE_RUN_LIMIT = 64 << 20  # no trace holds this much whitespace in one run
GUNZIP_PIECE = 16 << 20  # inflated at once: below glibc's largest mmap threshold, so the heap reuses it
GUNZIP_INPUT = 1 << 20  # compressed bytes handed to the inflater at once
CHUNK_BYTES = 8 << 20  # JSON text decoded at once
PART_BYTES = 64 << 20  # the least events text a helper process is started for (it costs ~0.5 s to start)
MAX_PARTS = 8
PART_PROGRAM = "dlprof_profiler.ingest.kineto_part"  # run as a program, so this module does not import it
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding dlprof_profiler/
HEAD_BYTES = 4 << 20  # how much of a file `looks_like_trace` reads
RAW_SEPARATOR = b"\x1f"  # cannot occur in JSON text outside strings, and never unescaped inside them
_NOT_SPACE = re.compile(rb"\S")
_NULS = re.compile(rb"\0*")

Scalar = Union[int, float, str, bool, None]
EMPTY = msgspec.Raw(b"")


class EventArgs(msgspec.Struct, gc=False):
    """The `args` fields dlprof reads (every other field is skipped by the decoder)."""

    external_id: Scalar = msgspec.field(default=None, name="External id")
    seq: Scalar = msgspec.field(default=None, name="Sequence number")
    fwd_tid: Scalar = msgspec.field(default=None, name="Fwd thread id")
    input_dims: msgspec.Raw = msgspec.field(default=EMPTY, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=EMPTY, name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=EMPTY, name="Concrete Inputs")
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
    total_reserved: Scalar = msgspec.field(default=None, name="Total Reserved")
    addr: Scalar = msgspec.field(default=None, name="Addr")
    alloc_bytes: Scalar = msgspec.field(default=None, name="Bytes")
    device_type: Scalar = msgspec.field(default=None, name="Device Type")
    device_id: Scalar = msgspec.field(default=None, name="Device Id")
    sync_kind: Scalar = msgspec.field(default=None, name="cuda_sync_kind")
    flops: Scalar = None  # the profiler's own FLOPs of an op call (torch.profiler with_flops, where written)


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
    "total_reserved": (MEMORY,),
    "addr": (MEMORY,),
    "alloc_bytes": (MEMORY,),
    "device_type": (MEMORY,),
    "device_id": (MEMORY,),
    "flops": (OP,),
}
TEXT_ARGS = {"call_stack": (OP,), "kind": (MEMCPY,), "name": (METADATA,), "labels": (METADATA,), "sync_kind": (SYNC,)}
RAW_ARGS = {
    "input_dims": (OP,),
    "input_type": (OP,),
    "concrete_inputs": (OP,),
    "grid": (KERNEL,),
    "block": (KERNEL,),
}
# raw arguments kept only for the ops named here (the others' values are skipped, not hashed): Concrete Inputs
# give the convolutions' stride, padding and dilation (their output shape, for their FLOPs)
RAW_ARG_OPS = {"concrete_inputs": ("aten::conv1d", "aten::conv2d", "aten::conv3d")}


class SparseArgs(Mapping):
    """The argument columns (`Columns.args`), held as the rows that have a value and their values: most events
    lack most arguments, so a column per argument over every event would cost ~150 bytes an event (1.5 GB
    at 10^7 events). Each lookup returns the whole column (-1 where absent), built then and not kept."""

    def __init__(self, count: int):
        self.count = count
        self.columns: dict = {}  # name -> (rows, values, dtype)

    def add(self, name: str, pieces: list, dtype) -> None:
        """An argument's (rows, values) pieces, rows ascending across pieces."""
        row_type = np.int32 if self.count < 2**31 else np.int64
        rows = np.concatenate([r for r, _ in pieces]).astype(row_type) if pieces else np.zeros(0, row_type)
        values = np.concatenate([v for _, v in pieces]).astype(dtype) if pieces else np.zeros(0, dtype)
        self.columns[name] = (rows, values, dtype)

    def __getitem__(self, name: str) -> np.ndarray:
        rows, values, dtype = self.columns[name]
        if rows.size == 0:  # absent from the whole trace: one read-only -1 broadcast, no memory
            return np.broadcast_to(np.array(-1, dtype=dtype), (self.count,))
        column = np.full(self.count, -1, dtype=dtype)
        column[rows] = values
        return column

    def at(self, name: str, rows: np.ndarray) -> np.ndarray:
        """The argument's values at `rows` (event positions, any order; -1 where absent), the same as
        `self[name][rows]` without building the whole column (80 MB a lookup at 10^7 events)."""
        held, values, dtype = self.columns[name]
        rows = np.asarray(rows, dtype=np.int64)
        out = np.full(rows.size, -1, dtype=dtype)
        if held.size == 0 or rows.size == 0:
            return out
        pos = np.minimum(np.searchsorted(held, rows), held.size - 1)
        hit = held[pos] == rows
        out[hit] = values[pos[hit]]
        return out

    def __iter__(self):
        return iter(self.columns)

    def __len__(self) -> int:
        return len(self.columns)


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
    args: Mapping = field(default_factory=dict)  # INT_ARGS -> int64, TEXT_ARGS / RAW_ARGS -> int32 codes (SparseArgs)
    strings: list = field(default_factory=list)
    raws: list = field(default_factory=list)
    repairs: dict = field(default_factory=dict)  # events whose JSON text was repaired, by kind (kineto_repair)
    repaired_events: int = 0
    parts_decoded: int = 1  # processes that decoded the events side by side

    def let_go(self, *names: str) -> None:
        """Drop columns no longer read (the frames are built from the others), so their memory goes back
        before the frames' own is taken (each per-event column is 40-80 MB at 10^7 events)."""
        for name in names:
            setattr(self, name, None)

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
        return _gunzip(packed, path)
    except (EOFError, zlib.error) as exc:
        raise DLProfError(f"{path}: damaged or truncated gzip data ({exc})") from None


def _gunzip(packed: bytearray, path: Path):
    """Inflate gzip members into one buffer (no second copy of the text), refusing text no trace holds
    before it is held (`_TextLimits`). The buffer is an anonymous mapping sized from the gzip trailer:
    its pages cost memory only once written, so a trailer that lies (a truncated file's last bytes) costs
    nothing; it grows in place (mremap) when the text is longer. Concatenated members are read as one
    text (as gunzip does) and NUL padding after the last one is ignored; anything else after the gzip data
    is an error."""
    guess = int.from_bytes(packed[-4:], "little") if len(packed) >= 18 else 0  # size mod 2**32
    size = max(min(guess, len(packed) * GZIP_RATIO_TRUSTED), GUNZIP_PIECE)
    try:
        out = mmap.mmap(-1, size)
    except (OSError, MemoryError, ValueError):
        raise DLProfError(f"{path}: out of memory holding the trace's text ({size / 2**20:,.0f} MB)") from None
    limits = _TextLimits(path)
    filled = pos = 0
    view = memoryview(packed)
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        tail = b""
        while not inflater.eof:
            if not tail:
                if pos >= len(packed):
                    raise EOFError("compressed file ended before the end-of-stream marker was reached")
                tail = view[pos : pos + GUNZIP_INPUT]
                pos += len(tail)
            piece = inflater.decompress(tail, GUNZIP_PIECE)
            tail = inflater.unconsumed_tail
            limits.check(piece, filled, pos - len(tail))
            if filled + len(piece) > len(out):
                out = _grown(out, filled + len(piece), path)
            out[filled : filled + len(piece)] = piece
            filled += len(piece)
        pos -= len(inflater.unused_data)  # the part of the last input piece after this member
        pos = _NULS.match(packed, pos).end()
        if pos >= len(packed):
            break
        if packed[pos : pos + 2] != GZIP_MAGIC:
            raise DLProfError(
                f"{path}: {len(packed) - pos:,} bytes follow the end of the gzip data (from byte {pos:,} of the "
                "file) and are not gzip: the file is damaged"
            )
    if filled == 0:
        return bytearray()
    out.resize(filled)
    return out


def _grown(out: mmap.mmap, size: int, path: Path) -> mmap.mmap:
    try:
        out.resize(max(size, len(out) + len(out) // 2))
    except (OSError, MemoryError, ValueError):
        raise DLProfError(f"{path}: out of memory holding the trace's text ({size / 2**20:,.0f} MB)") from None
    return out


class _TextLimits:
    """What no trace's text is, checked on each inflated piece before it is kept: more than
    GZIP_RATIO_LIMIT times the compressed bytes read so far (beyond the first GZIP_SLACK bytes; deflate's
    own limit is 1032, JSON traces compress 10-30 times), a run of WHITESPACE_RUN_LIMIT bytes of nothing
    but whitespace, more than the memory this process can have (then the plain .json file, read
    memory-mapped, is the way)."""

    def __init__(self, path: Path):
        self.path = path
        self.spaces = 0  # whitespace-only bytes at the end of the text so far (counted by whole pieces)
        room = available_memory()
        self.memory = None if room is None else room * 3 // 4  # (the decoding needs the rest)

    def check(self, piece: bytes, filled: int, consumed: int) -> None:
        total = filled + len(piece)
        if total > GZIP_RATIO_LIMIT * consumed + GZIP_SLACK:
            raise DLProfError(
                f"{self.path}: the gzip data expands more than {GZIP_RATIO_LIMIT} times ({total / 2**20:,.0f} MB "
                f"of text from {consumed / 2**20:,.1f} MB): not a trace (Kineto traces compress 10-30 times)"
            )
        if not piece:
            return
        self.spaces = self.spaces + len(piece) if _NOT_SPACE.search(piece) is None else 0
        if self.spaces > WHITESPACE_RUN_LIMIT:
            raise DLProfError(
                f"{self.path}: the text holds more than {WHITESPACE_RUN_LIMIT >> 20} MB of nothing but whitespace "
                f"(up to byte {total:,}): not a trace"
            )
        if self.memory is not None and total > self.memory:
            raise DLProfError(
                f"{self.path}: the trace's text is larger than the memory available ({self.memory / 2**30:.1f} GB); "
                "gunzip it and give the .json file, which is read memory-mapped"
            )


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


class _Decoder:
    """A msgspec JSON decoder whose refusal of text that is not UTF-8 is a UnicodeDecodeError, as
    msgspec raised it before 0.23: from 0.23 it is a DecodeError that does not say where, which the
    readers below would take for a cut chunk or malformed JSON. Where the bad byte is, they find."""

    def __init__(self, type=Any):
        self._decoder = msgspec.json.Decoder(type)

    def decode(self, text):
        try:
            return self._decoder.decode(text)
        except msgspec.DecodeError as exc:  # (a ValidationError too, whose message never starts so)
            if str(exc).startswith("Invalid UTF-8"):
                raise UnicodeDecodeError("utf-8", b"", 0, 0, str(exc)) from None
            raise


_TOP = _Decoder(dict[str, msgspec.Raw])
_SYNTAX = _Decoder(msgspec.Raw)  # checks JSON text, builds nothing
_EVENTS = _Decoder(list[Event])
_FAST_EVENTS = _Decoder(list[FastEvent])
_ANY = _Decoder()
_BETWEEN_EVENTS = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_ONE_VALUE = json.JSONDecoder()
TAIL_BYTES = 1 << 20  # where the last event is looked for (and its largest size)
TAIL_CANDIDATES = 16
FAST_PATH_RETRIES = 64
REPAIR_STARTS = 8  # event starts tried before the offset a malformed chunk was refused at
NESTING_REPORTED = 512  # the depth an error names (the decoders give up near Python's recursion limit)
_NEXT_EVENT = re.compile(rb"\s*(?:,\s*\{|\])")


def decode(path: Path, chunk_bytes: int = CHUNK_BYTES, parts: int | None = None) -> Decoded:
    """Decode a Kineto trace file; raises DLProfError with a one-line reason naming the file.

    The usual layout is read in one pass over the events: the traceEvents array is found by its key and
    its last event, the rest of the document is checked with the array left empty, and each chunk of
    events is checked as it decodes, which together validate the whole document. Events PyTorch wrote
    malformed are repaired on that pass (`kineto_repair`) and counted. Anything unusual (or wrong) sends
    the file through the validating path: one pass that checks the whole document first, then the events;
    a document that is not JSON is then checked event by event (`_repaired_outline`), so a repairable one
    is read and any other error names the first place that cannot be read.

    A large plain (not gzipped) file's events are cut into `parts` (default: one per CPU this process may
    use, each of at least PART_BYTES) decoded side by side, the first here and each other one by a helper
    process (`decode_part`); see `_columns_in_parts`."""
    path = Path(path)
    data = read_bytes(path)
    try:
        return _decode(data, path, chunk_bytes, _PageRelease.of(data, path), parts)
    except RecursionError:
        deep = _nesting_deeper_than(data, NESTING_REPORTED)
        where = f" (more than {NESTING_REPORTED} levels at byte {deep:,})" if deep is not None else ""
        raise DLProfError(f"{path}: the JSON nests too deeply to be read{where}: not a Kineto trace") from None
    except UnicodeDecodeError:
        bad = _first_invalid_utf8(data, 0, len(data))
        raise DLProfError(f"{path}: the JSON text is not UTF-8 (byte {bad:,}) where it cannot be repaired") from None
    finally:
        if isinstance(data, mmap.mmap):
            try:
                data.close()
            except BufferError:  # a view is still alive somewhere: the mapping goes with it
                pass
        del data


def _decode(data, path: Path, chunk_bytes: int, release=None, parts: int | None = None) -> Decoded:
    if not _NOT_SPACE.search(data):
        raise DLProfError(f"{path}: empty file, not a Kineto trace")
    outline = _outline(data)
    if outline is not None:
        first, end, meta = outline
        try:
            columns = _columns(data, first, end, chunk_bytes, path, FAST_PATH_RETRIES, release, parts)
            return Decoded(path, meta, columns)
        except DLProfError:
            pass
    try:
        first, end, meta = _validated_outline(data, path)
    except _NotJSON as exc:
        first, end, meta = _repaired_outline(data, path, exc)
    return Decoded(path, meta, _columns(data, first, end, chunk_bytes, path, release=release, parts=parts))


class _PageRelease:
    """Gives the pages of a mapped trace file back to the kernel once the chunks on them are decoded: a
    mapped page counts in the process's memory for as long as it stays mapped, so without this a trace
    decoded from its mapping costs its whole size on top of the columns (3.3 GB at 10^7 events). Only a
    mapping of the file itself: a dropped page is read again from the file if anything looks back (the
    validating pass after a failed fast one, an error's byte offset), and reads what it held, since every
    in-place edit (`_decode_region`'s brackets) is undone; an anonymous mapping (gunzipped text) would
    read zeros, so it is kept."""

    def __init__(self, data: mmap.mmap):
        self.data = data
        self.done = 0  # bytes from the start of the mapping already released

    @classmethod
    def of(cls, data, path: Path) -> "_PageRelease | None":
        if not isinstance(data, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED"):
            return None
        try:
            with open(path, "rb") as fh:
                if fh.read(2) == GZIP_MAGIC:
                    return None
        except OSError:
            return None
        return cls(data)

    def before(self, offset: int) -> None:
        """Release the whole pages before `offset` (the byte before it may still be edited in place)."""
        upto = (max(offset - 1, 0) // mmap.PAGESIZE) * mmap.PAGESIZE
        if upto > self.done:
            self.data.madvise(mmap.MADV_DONTNEED, self.done, upto - self.done)
            self.done = upto


class _NotJSON(DLProfError):
    """The document is not valid JSON (before any repair)."""


def _validated_outline(data, path: Path) -> tuple[int, int, dict]:
    """(first, end, meta): where the traceEvents array opens and closes, and the other top-level values,
    after checking the whole document (a full pass of the JSON parser over it)."""
    try:
        top = _TOP.decode(data)  # validates the whole document; values stay undecoded
    except msgspec.ValidationError:
        raise DLProfError(f"{path}: not a Kineto trace (the JSON is not an object with traceEvents)") from None
    except msgspec.DecodeError as exc:
        raise _NotJSON(f"{path}: not valid JSON ({_where(exc, len(data))})") from None
    if "traceEvents" not in top:
        raise DLProfError(f"{path}: not a Kineto trace (no traceEvents in the JSON object)")
    events_raw = memoryview(top.pop("traceEvents"))
    meta = {key: _meta_value(value) for key, value in top.items()}
    del top
    if bytes(events_raw[:1]) != b"[":
        raise DLProfError(f"{path}: not a Kineto trace (traceEvents is not an array)")
    first = _offset_in(events_raw, data)
    if first is None:
        raise AssertionError("msgspec returned a copy of the traceEvents text")  # pragma: no cover
    return first, first + len(events_raw) - 1, meta


def _repaired_outline(data, path: Path, error: _NotJSON) -> tuple[int, int, dict]:
    """(first, end, meta) of a document that is not valid JSON, if what is wrong lies in events PyTorch
    wrote malformed: the events array after the first `"traceEvents": [` is checked (msgspec, no values
    built) up to each place it refuses, where the event must be repairable, up to its closing bracket;
    the document without the events must then be an object. Else the one-line error naming the first
    place that cannot be read (`error` when there is no events key)."""
    key = _EVENTS_KEY.search(data)
    if key is None:
        raise error
    first = key.end() - 1
    view = memoryview(data)
    pos = first + 1
    while True:
        opening, data[pos - 1] = data[pos - 1], 0x5B  # "["
        try:
            _SYNTAX.decode(view[pos - 1 :])
            raise error  # the array closes at the very end of the text: the object does not
        except msgspec.DecodeError as exc:
            at = _AT_BYTE.search(str(exc))
            if at is None:
                raise DLProfError(f"{path}: not valid JSON ({_where(exc, len(data))})") from None
            offset = pos - 1 + int(at.group(1))
            reason = _AT_BYTE.sub("", str(exc))
        except UnicodeDecodeError:
            offset, reason = _first_invalid_utf8(data, pos, len(data)), "text that is not UTF-8"
        finally:
            data[pos - 1] = opening
        if reason.endswith("trailing characters"):
            end = data.rfind(b"]", pos - 1, offset)
            break
        for event_start, _ in _event_starts(data, pos, offset):
            repaired = repair_event(data, event_start)
            if repaired is not None:
                break
        else:
            raise DLProfError(
                f"{path}: not valid JSON ({reason} (byte {offset:,})); the event there cannot be repaired"
            ) from None
        after = _NEXT_EVENT.match(data, repaired.end)
        if data[after.end() - 1] == 0x5D:
            end = after.end() - 1
            break
        pos = after.end() - 1
    outer = bytes(data[: first + 1]) + bytes(data[end:])
    try:
        top = _TOP.decode(outer)
    except msgspec.MsgspecError:
        raise error from None
    top.pop("traceEvents", None)
    return first, end, {k: _meta_value(v) for k, v in top.items()}


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
    return first, end, {key: _meta_value(value) for key, value in top.items()}


def _meta_value(raw):
    """A top-level value other than the events (text that is not UTF-8 decoded with replacement)."""
    try:
        return _ANY.decode(raw)
    except UnicodeDecodeError:
        return _ANY.decode(bytes(raw).decode("utf-8", "replace").encode("utf-8"))


def _array_end(data, first: int) -> int | None:
    """The closing bracket of the events array opening at `first`: the last event starts at the last
    `}, {` of the file's tail (else it is the first event); Python's JSON decoder finds where that event
    ends (the repairing reader where PyTorch wrote it malformed), and only spaces may stand between it and
    the bracket."""
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
            stop = start + len(text[:stop].encode("utf-8", "surrogateescape"))
        except ValueError:
            repaired = repair_event(data, start)
            if repaired is None:
                continue
            stop = repaired.end
        after = _NOT_SPACE.search(data, stop)
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


def _columns(
    data,
    first: int,
    end: int,
    chunk_bytes: int,
    path: Path,
    retries: int | None = None,
    release=None,
    parts: int | None = None,
) -> Columns:
    """The columns of the events in data[first:end + 1] (`release`: a _PageRelease of the mapping, which
    only a plain file has: only then can helper processes map the same text and decode parts of it)."""
    cuts = _part_cuts(data, first, end, parts) if release is not None else []
    if cuts:
        columns = _columns_in_parts(data, first, end, cuts, chunk_bytes, path, retries, release)
        if columns is not None:
            return columns
    builder = _ColumnBuilder(path)
    _decode_into(builder, data, first, end, chunk_bytes, path, retries, release)
    return builder.finish()


def _decode_into(builder, data, first: int, end: int, chunk_bytes: int, path: Path, retries=None, release=None):
    for _ in _added_chunks(builder, data, first, end, chunk_bytes, path, retries, release):
        pass


def _added_chunks(builder, data, first: int, end: int, chunk_bytes: int, path: Path, retries=None, release=None):
    """Add the events of data[first:end + 1] to `builder` chunk by chunk, yielding after each (the pages
    before it released, when `release` is given)."""
    chunks = _chunks(data, first, end, chunk_bytes, path, builder, retries)
    try:
        for events in chunks:
            builder.add(events)
            del events
            if release is not None:
                release.before(builder.resume)
            yield
    finally:
        chunks.close()


def _part_cuts(data, first: int, end: int, parts: int | None) -> list:
    """Where the events array is cut into parts: a `}, {` match after each equal share of its text."""
    if parts is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        parts = min(cpus, MAX_PARTS, (end - first) // PART_BYTES)
    cuts = []
    for k in range(1, max(parts, 1)):
        share = first + (end - first) * k // parts
        match = _BETWEEN_EVENTS.search(data, max(share, cuts[-1].end() if cuts else 0), end)
        if match is None:
            break
        cuts.append(match)
    return cuts


def _columns_in_parts(data, first, end, cuts, chunk_bytes, path, retries, release) -> Columns | None:
    """The columns with the events cut into parts at `cuts` (`}, {` matches), the first part decoded here
    and every other by a helper process at the same time; None when the first part must be decoded again
    in one pass with the rest.

    A part is taken only when every part before it ended cleanly (no error, no event whose text had to be
    rewritten): a cut inside a JSON string would leave the text before it ending inside that string, which
    does not decode, so a clean end proves the cut lies between two events, and the next part then holds
    exactly the events the one-pass decoder would have read there. From the first part not taken, this
    process decodes the rest itself (where the error, if any, names the right event)."""
    spans = [(m.end() - 2, (cuts[i + 1].start() + 1) if i + 1 < len(cuts) else end) for i, m in enumerate(cuts)]
    helpers: list = []
    builder = _ColumnBuilder(path)
    try:
        try:
            for start, stop in spans:
                helpers.append(_PartProcess(path, start, stop, chunk_bytes, retries))
        except OSError:  # no process can be started here: one pass
            return None
        try:
            _decode_into(builder, data, first, cuts[0].start() + 1, chunk_bytes, path, retries, release)
        except DLProfError:
            return None
        if builder.rewritten:
            return None
        for helper, (start, _) in zip(helpers, spans):
            outcome = helper.outcome()
            if outcome is None:  # failed, or rewrote events: from here on in this process
                _decode_into(builder, data, start, end, chunk_bytes, path, retries, release)
                break
            messages, (kinds, events) = outcome
            foreign = NO_CODES
            while messages:
                foreign = builder.merge(messages.pop(0), foreign)
            builder.repaired_kinds(kinds, events)
            builder.parts_decoded += 1
        return builder.finish()
    finally:
        for helper in helpers:
            helper.stop()


class _PartProcess:
    """A helper process decoding one part of the events (`decode_part`), its messages read as they come
    (a thread, so that the process never waits on a full pipe)."""

    def __init__(self, path: Path, start: int, stop: int, chunk_bytes: int, retries: int | None):
        stat = os.stat(path)
        self.messages: list = []
        self.ended = None
        # the helper imports this package from where this process did, whatever its own path would say
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen(
            [sys.executable, "-m", PART_PROGRAM, str(path), str(start), str(stop), str(chunk_bytes)]
            + [str(-1 if retries is None else retries), str(stat.st_size), str(stat.st_mtime_ns)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            while True:
                kind, payload = pickle.load(self.process.stdout)
                if kind != "part":
                    self.ended = (kind, payload)
                    return
                self.messages.append(payload)
        except Exception as exc:  # the process ended without saying so (killed, crashed)
            self.ended = ("failed", str(exc))

    def outcome(self):
        """(its messages, its repairs) once it has decoded its part cleanly, else None."""
        self.reader.join()
        self.process.wait()
        kind, payload = self.ended
        if kind != "done" or self.process.returncode != 0 or payload["rewritten"]:
            return None
        messages, self.messages = self.messages, []
        return messages, payload["repairs"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.reader.join()
        self.process.stdout.close()


def decode_part(path: Path, start: int, stop: int, chunk_bytes: int, retries: int | None, identity: tuple):
    """The messages of a helper process decoding data[start + 1:stop] of a trace file (events from the
    `{` after `start` to the `}` before `stop`; `retries` as `_chunks` takes them): ("part", what each
    chunk added), then ("done", its repairs), or ("error", why). `identity` (size, mtime_ns) is the file
    the parent read."""
    stat = os.stat(path)
    if (stat.st_size, stat.st_mtime_ns) != identity:
        yield "error", f"{path} changed while it was read"
        return
    data = read_bytes(path)
    release = _PageRelease.of(data, path)
    if release is not None:
        release.done = (start // mmap.PAGESIZE) * mmap.PAGESIZE
    builder = _ColumnBuilder(path)
    for _ in _added_chunks(builder, data, start, stop, chunk_bytes, path, retries, release):
        yield "part", builder.take_new()
    yield "done", {"rewritten": builder.rewritten, "repairs": (builder.repairs, builder.repaired_events)}


def _chunks(data, first: int, end: int, chunk_bytes: int, path: Path, builder, retries: int | None = None):
    """The events of data[first:end + 1] (the traceEvents array) as lists of structs, about chunk_bytes of
    JSON at a time. A chunk is decoded in place: the separators around it (the array's own bracket or
    the `,` and spaces between two events) are overwritten with `[` and `]` while it decodes. `retries`
    bounds the cuts tried per chunk (when the document was not validated first, a chunk that does not
    decode may be damaged rather than cut inside a string). A chunk the decoder refuses at some offset
    holds a malformed event: it is repaired (`_repaired_events`)."""
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
            resume = match.end() - 1 if match else end
            try:
                events = _decode_region(data, view, start, stop)
            except msgspec.ValidationError as exc:
                raise _content_error(path, exc, builder.count) from None
            except _Cut:
                if match is None:
                    raise DLProfError(f"{path}: traceEvents could not be decoded") from None
                cut = match.start() + 1
                continue
            except _Malformed as bad:
                events, resume = _repaired_events(data, view, start, (stop, resume), end, bad, path, builder)
            break
        start = builder.resume = resume
        yield events


class _Cut(Exception):
    """The text given to the decoder ends inside a value: the cut between events was inside a string."""


class _Malformed(Exception):
    """The decoder refused the text at an offset (of the whole buffer)."""

    def __init__(self, offset: int, reason: str):
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


_AT_BYTE = re.compile(r"\s*\(byte (\d+)\)$")


def _decode_region(data, view, start: int, stop: int) -> list:
    """The events of data[start:stop] (from the `{` of one event to just past the `}` of another), decoded
    in place between temporary brackets. Raises _Cut, _Malformed or msgspec.ValidationError."""
    opening, closing = data[start - 1], data[stop]
    data[start - 1], data[stop] = 0x5B, 0x5D  # "[", "]"
    try:
        return _decode_events(view[start - 1 : stop + 1])
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError as exc:
        at = _AT_BYTE.search(str(exc))
        if at is None:
            raise _Cut() from None
        raise _Malformed(start - 1 + int(at.group(1)), _AT_BYTE.sub("", str(exc))) from None
    except UnicodeDecodeError:
        raise _Malformed(_first_invalid_utf8(data, start, stop), "text that is not UTF-8") from None
    finally:
        data[start - 1], data[stop] = opening, closing


def _repaired_events(data, view, start: int, cut: tuple, end: int, bad: _Malformed, path: Path, builder):
    """(events, where the next chunk starts) for a chunk data[start:stop] that holds malformed events:
    the events before each one are decoded as usual, the malformed one is read by `repair_event` (its
    start is the last `}, {` before the offset the decoder refused, else an earlier one: that `}, {` may
    lie inside the broken string), and decoding goes on after it. A repaired event may run past the
    cut; the chunk then ends after it."""
    stop, resume = cut
    events: list = []
    pos = start
    while True:
        for event_start, prefix_stop in _event_starts(data, pos, bad.offset):
            try:
                before = _decode_region(data, view, pos, prefix_stop) if prefix_stop is not None else []
            except (_Cut, _Malformed, msgspec.ValidationError):
                continue  # this `}, {` lies inside a string: an earlier event is the broken one
            repaired = repair_event(data, event_start, end)
            if repaired is not None:
                break
        else:
            raise DLProfError(
                f"{path}: not valid JSON ({bad.reason} (byte {bad.offset:,})); the event there cannot be repaired"
            ) from None
        events += before
        try:
            events += _decode_events(b"[" + repaired.text + b"]")
        except msgspec.ValidationError as exc:
            raise _content_error(path, exc, builder.count + len(events)) from None
        builder.repaired(repaired.kinds)
        builder.rewritten += 1
        after = _NEXT_EVENT.match(data, repaired.end)
        pos = after.end() - 1  # the next event's "{", or the array's "]"
        if pos >= end:
            return events, end
        while pos < stop:
            try:
                events += _decode_region(data, view, pos, stop)
                return events, resume
            except msgspec.ValidationError as exc:
                raise _content_error(path, exc, builder.count + len(events)) from None
            except _Cut:  # the cut lies inside a string after the repaired event: cut at the next "}, {"
                match = _BETWEEN_EVENTS.search(data, stop, end)
                stop, resume = (match.start() + 1, match.end() - 1) if match else (end, end)
            except _Malformed as again:
                bad = again
                break
        else:
            return events, pos


def _event_starts(data, pos: int, offset: int):
    """Where the event holding `offset` may start, latest first, with where the events before it end:
    (the `{` after each `}, {` between pos and offset, the `}` + 1 before it); last the first event's."""
    window = 1 << 12
    while True:
        low = max(pos, offset - window)
        found = [(m.end() - 1, m.start() + 1) for m in _BETWEEN_EVENTS.finditer(data, low, offset + 1)]
        if len(found) >= REPAIR_STARTS or low == pos:
            break
        window *= 16
    starts = found[::-1][:REPAIR_STARTS]
    if low == pos and len(starts) < REPAIR_STARTS:
        starts.append((_NOT_SPACE.search(data, pos).start(), None))  # the region's first event
    return starts


def _content_error(path: Path, exc: msgspec.ValidationError, offset: int) -> DLProfError:
    return DLProfError(f"{path}: unexpected event content ({_shift_path(str(exc), offset)})")


def _where(exc: msgspec.DecodeError, size: int) -> str:
    """msgspec's reason with the byte offset it names (the end of the text when it ran out)."""
    reason = str(exc)
    at = _AT_BYTE.search(reason)
    if at is None:
        return f"{reason}: the text ends at byte {size:,}"
    return f"{_AT_BYTE.sub('', reason)} (byte {int(at.group(1)):,})"


def _first_invalid_utf8(data, start: int, stop: int) -> int:
    """The offset of the first byte of data[start:stop] that is not UTF-8 (start when there is none)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    for low in range(start, stop, CHUNK_BYTES):
        high = min(stop, low + CHUNK_BYTES)
        try:
            decoder.decode(data[low:high], final=high == stop)
        except UnicodeDecodeError as exc:
            return low - len(exc.object) + (high - low) + exc.start
    return start


def _nesting_deeper_than(data, limit: int) -> int | None:
    """The offset where the JSON text first nests more than `limit` arrays and objects deep (brackets
    inside strings are not counted), or None. For the error message only: a vectorised pass in windows."""
    depth = quotes = backslashes = 0  # carried across windows: depth, quotes seen, backslash run at the end
    for low in range(0, len(data), TAIL_BYTES):
        w = np.frombuffer(data[low : low + TAIL_BYTES], dtype=np.uint8)
        index = np.arange(w.size)
        is_backslash = w == 0x5C
        last_other = np.maximum.accumulate(np.where(is_backslash, -1, index))
        run_before = np.empty(w.size, dtype=np.int64)  # backslashes just before each byte
        run_before[0] = backslashes
        run_before[1:] = np.where(last_other[:-1] < 0, index[1:] + backslashes, index[1:] - 1 - last_other[:-1])
        quote = (w == 0x22) & (run_before % 2 == 0)
        inside = (quotes + np.cumsum(quote) - quote) % 2 == 1
        step = np.where(inside, 0, (w == 0x5B) | (w == 0x7B)).astype(np.int64)
        step -= np.where(inside, 0, (w == 0x5D) | (w == 0x7D))
        level = depth + np.cumsum(step)
        over = np.flatnonzero(level > limit)
        if over.size:
            return low + int(over[0])
        depth, quotes = int(level[-1]), quotes + int(quote.sum())
        backslashes = int(run_before[-1] + 1) if is_backslash[-1] else 0
    return None


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
        mapping[:-1] = self.global_codes(uniques)
        local = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        return mapping[local]

    def global_codes(self, values: list) -> np.ndarray:
        """This table's codes for distinct values of another table, appending those it lacks in order."""
        out = np.empty(len(values), dtype=np.int64)
        for i, value in enumerate(values):
            code = self.index.get(value)
            if code is None:
                code = len(self.values)
                self.index[value] = code
                self.values.append(value)
            out[i] = code
        return out

    def raw_codes(self, raws: list, decode) -> tuple[np.ndarray, np.ndarray | None]:
        """Global codes (int32) for raw JSON values (msgspec Raw; empty when absent -> -1): the bytes are
        hashed in Arrow, and `decode` turns each distinct one of the chunk into the value kept (None -> -1)
        and whether its text had to be repaired; with the mask of the values repaired (None: none)."""
        encoded = _arrow_texts(*_end_to_end(raws), pa.large_binary()).dictionary_encode()
        uniques = encoded.dictionary.to_pylist()
        mapping = np.empty(len(uniques) + 1, dtype=np.int32)
        mapping[-1] = -1
        repaired = []
        for i, raw in enumerate(uniques):
            value, bad = decode(raw)
            if bad:
                repaired.append(i)
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
        return mapping[local], (np.isin(local, repaired) if repaired else None)


NO_CODES = (np.zeros(0, np.int64), np.zeros(0, np.int64))  # a builder not merged from yet: its codes -> none


class _ColumnBuilder:
    def __init__(self, path: Path):
        self.path = path
        self.strings = _TextTable()
        self.raws = _TextTable()
        self.parts: list[dict] = []
        # columns most events lack (args, flow ids): (rows, values) pieces, scattered once at the end
        self.sparse: dict = {name: [] for name in ["flow_id"] + list(INT_ARGS) + list(TEXT_ARGS) + list(RAW_ARGS)}
        self.count = 0
        self.resume = 0  # where the chunk after the last one added starts (see _chunks)
        self.repairs: dict = {}  # events repaired, by kind (kineto_repair.QUOTE ...)
        self.repaired_events = 0
        self.rewritten = 0  # events whose JSON text was rewritten to be read (kineto_repair.repair_event)
        self.parts_decoded = 1  # processes that decoded the events (see _columns_in_parts)
        self.sent = (0, 0, 0)  # strings, raw texts and events already in a message (take_new)

    def repaired(self, kinds: int, events: int = 1) -> None:
        """Count events whose JSON text was repaired (kinds: kineto_repair's bits)."""
        if kinds and events:
            self.repaired_events += events
            for kind in KIND_NAMES:
                if kinds & kind:
                    self.repairs[kind] = self.repairs.get(kind, 0) + events

    def add(self, events: list) -> None:
        n = len(events)
        part = {}
        for name in ("ph", "cat"):
            part[name] = self.strings.few_codes(list(map(attrgetter(name), events)))
        part["name"], not_utf8 = self.strings.raw_codes(list(map(attrgetter("name"), events)), self._name)
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
                if name in RAW_ARG_OPS:
                    wanted = np.zeros(len(self.strings.values) + 1, dtype=bool)  # by name code; -1: the last
                    wanted[[self.strings.index[n] for n in RAW_ARG_OPS[name] if n in self.strings.index]] = True
                    keep = np.flatnonzero(wanted[part["name"][rows]])
                    rows, sub = rows[keep], _take(sub, keep)
                if rows.size == 0:
                    continue
                values = list(map(attrgetter(name), sub))
                if kind == "int":
                    codes = to_int(values)
                elif kind == "text":
                    codes = self.strings.codes(values)
                else:
                    codes, bad = self.raws.raw_codes(values, _utf8)
                    if bad is not None:
                        not_utf8 = np.zeros(n, dtype=bool) if not_utf8 is None else not_utf8
                        not_utf8[rows[bad]] = True
                self.sparse[name].append((rows + self.count, codes))  # only the rows of the groups that have it
        if not_utf8 is not None:  # names and raw arguments the chunk decoder passes through undecoded
            self.repaired(UTF8, int(not_utf8.sum()))
        self.parts.append(part)
        self.count += n

    def take_new(self) -> dict:
        """What the chunks added since the last call, for the process that merges it (`merge`): the
        columns (codes into this builder's tables), the sparse pieces (rows from the message's first
        event), the strings and raw texts new to the tables, and the count of events."""
        strings, raws, events = self.sent
        message = {
            "parts": self.parts,
            "sparse": {
                name: [(rows - events, v) for rows, v in pieces] for name, pieces in self.sparse.items() if pieces
            },
            "strings": self.strings.values[strings:],
            "raws": self.raws.values[raws:],
            "count": self.count - events,
        }
        self.parts = []
        self.sparse = {name: [] for name in self.sparse}
        self.sent = (len(self.strings.values), len(self.raws.values), self.count)
        return message

    def merge(self, message: dict, foreign: tuple = NO_CODES) -> tuple:
        """Append another builder's `take_new()`: its codes are translated into this builder's tables
        (new strings and raw texts appended in the order the other met them) and its rows shifted.
        `foreign`: what the last merge from the same builder returned (its codes -> these)."""
        strings = np.concatenate([foreign[0], self.strings.global_codes(message["strings"])])
        raws = np.concatenate([foreign[1], self.raws.global_codes(message["raws"])])

        # indexed by the other's codes, which are >= -1: the appended -1 keeps "none" as it is
        lookups = {"strings": np.append(strings, -1), "raws": np.append(raws, -1)}
        for part in message["parts"]:
            for name in ("ph", "cat", "name"):
                part[name] = lookups["strings"][part[name]].astype(part[name].dtype)
            for name in ("pid", "tid"):
                named = ~part[name + "_numeric"]
                if named.any():
                    part[name][named] = strings[part[name][named]]
            self.parts.append(part)
        for name, pieces in message["sparse"].items():
            table = lookups["strings"] if name in TEXT_ARGS else lookups["raws"] if name in RAW_ARGS else None
            for rows, values in pieces:
                values = values if table is None else table[values].astype(values.dtype)
                self.sparse[name].append((rows + self.count, values))
        self.count += message["count"]
        return strings, raws

    def repaired_kinds(self, kinds: dict, events: int) -> None:
        """Add another builder's repair counts (its `repairs` and `repaired_events`)."""
        for kind, count in kinds.items():
            self.repairs[kind] = self.repairs.get(kind, 0) + count
        self.repaired_events += events

    def _name(self, raw: bytes) -> tuple:
        """An event's name from its JSON text (a text, a number or boolean as text, None for null), and
        whether it was not UTF-8 (then decoded with replacement)."""
        try:
            value, bad = _ANY.decode(raw), False
        except UnicodeDecodeError:
            value, bad = _ANY.decode(raw.decode("utf-8", "replace").encode("utf-8")), True
        if isinstance(value, (list, dict)):
            raise DLProfError(
                f"{self.path}: unexpected event content (an event name is "
                f"{'an array' if isinstance(value, list) else 'an object'}, not a text)"
            )
        return (value if value is None or isinstance(value, str) else str(value)), bad

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
        # each column's pieces are let go once it is whole, and handed back to the system (the heap keeps
        # them otherwise: the columns were then held twice, 1 GB more at 10^7 events), so the columns are held
        # about once
        def cat(name, dtype):
            arrays = [p.pop(name) for p in self.parts]
            column = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)
            del arrays
            release_unused_memory()
            return column

        def scatter(name, dtype):
            pieces, self.sparse[name] = self.sparse[name], []
            if not pieces:  # absent from the whole trace: one read-only -1 broadcast, no memory
                return np.broadcast_to(np.array(-1, dtype=dtype), (self.count,))
            column = np.full(self.count, -1, dtype=dtype)
            for rows, values in pieces:
                column[rows] = values
            return column

        args = SparseArgs(self.count)
        for names, dtype in ((INT_ARGS, np.int64), (list(TEXT_ARGS) + list(RAW_ARGS), np.int32)):
            for name in names:
                pieces, self.sparse[name] = self.sparse[name], []
                args.add(name, pieces, dtype)
                del pieces
                release_unused_memory()
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
            repairs=self.repairs,
            repaired_events=self.repaired_events,
            parts_decoded=self.parts_decoded,
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


def _utf8(raw: bytes) -> tuple:
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace"), True


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
