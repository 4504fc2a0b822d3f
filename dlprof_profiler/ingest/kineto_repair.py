"""Repair the JSON text of one Kineto event that PyTorch wrote malformed.

PyTorch writes event names without escaping them (pytorch/pytorch#113001, #98432, #136180): a Python frame
whose source line holds quotes (`torch/profiler/_cupti_monitor.py(0):` and a docstring's three quotes), a
Windows path with backslashes (`torch\\cuda\\__init__.py(219): _lazy_init`), a raw newline or control
character, bytes that are not UTF-8.
Such a file is not JSON, but each broken string is still the writer's raw text between its opening quote
and a closing quote, and the rest of the event is intact. `repair_event` reads one event object that way:

- a string is first read as JSON (escapes kept) with raw control characters escaped and invalid UTF-8
  replaced by U+FFFD; when that reading cannot be right and the string is the event's `name` or a text
  in its `args` (what PyTorch writes unescaped), it is read as raw text (backslashes and quotes literal)
  ending at one of the later quotes;
- a quote can end a string only where what follows can follow a value there (`}` or `, "key":` in an
  object, `]` or `,` in an array); keys are never repaired (Kineto writes them itself);
- the readings are tried in order, backtracking, until the whole event parses and is followed by what
  may follow an event (`, {` or the end of the array); when a quote was reinterpreted, the event's own
  keys must be Chrome-trace event keys, no object may repeat a key, and no string read raw may hold an
  event boundary (`}, {"`) or an event's own key (`", "pid":`), so a repair never merges two events or
  swallows a field; a well-formed event followed by what cannot follow an event is not repaired.

Only events the fast decoder refused come here (a Python parser, but for the rare broken event only).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

QUOTE, BACKSLASH, CONTROL, UTF8 = 1, 2, 4, 8
KIND_NAMES = {
    QUOTE: "unescaped quotes",
    BACKSLASH: "unescaped backslashes",
    CONTROL: "raw control characters",
    UTF8: "bytes that are not UTF-8",
}
EVENT_KEYS = frozenset(
    b'"%s"' % k
    for k in (
        b"name",
        b"cat",
        b"ph",
        b"ts",
        b"tts",
        b"pid",
        b"tid",
        b"dur",
        b"tdur",
        b"args",
        b"id",
        b"id2",
        b"bp",
        b"s",
        b"cname",
        b"scope",
        b"sf",
        b"stack",
        b"esf",
        b"estack",
        b"bind_id",
        b"flow_in",
        b"flow_out",
    )
)
MAX_DEPTH = 64  # Kineto events nest 3 levels
MAX_STRING = 1 << 20  # a broken string longer than this is not repaired
MAX_STEPS = 20_000  # readings tried per event

_WS = re.compile(rb"[ \t\n\r]*")
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERAL = re.compile(rb"true|false|null")
_KEY = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
# a string read as JSON: any character but `"` and `\`, or a valid escape (control characters are fixed after)
_ESCAPED_BODY = re.compile(rb'(?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
_KEY_AHEAD = re.compile(rb'[ \t\n\r]*,[ \t\n\r]*"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"[ \t\n\r]*:')
_NEXT_EVENT = re.compile(rb"[ \t\n\r]*(?:,[ \t\n\r]*\{|\])")
_EVENT_BOUNDARY = re.compile(rb'\}[ \t\n\r]*,[ \t\n\r]*\{[ \t\n\r]*"')
_EVENT_KEY_INSIDE = re.compile(rb'"[ \t\n\r]*,[ \t\n\r]*"(?:name|cat|ph|ts|pid|tid|dur|args|id)"[ \t\n\r]*:')
_CONTROL = re.compile(rb"[\x00-\x1f]")
_OBJECT, _ARRAY = 0, 1  # what a string's value sits in
_EVENT, _ARGS, _OTHER = 0, 1, 2  # what an object is


@dataclass
class Repaired:
    """One event's repaired JSON text, the offset just past it in the buffer, and what was repaired."""

    text: bytes
    end: int
    kinds: int


class _GiveUp(Exception):
    pass


def repair_event(data, start: int, end: int | None = None) -> Repaired | None:
    """The event object at data[start] (a `{`) read leniently, or None when no reading makes it an event.
    `end`: the offset of the array's closing `]` (the event must be followed by `, {` or by that bracket);
    None: any `]` may close the array."""
    parser = _Parser(data, end)
    try:
        for stop, text, kinds in parser.object(start, 0, _EVENT):
            after = _NEXT_EVENT.match(data, stop)
            if after is None or (end is not None and data[after.end() - 1] == 0x5D and after.end() - 1 != end):
                if not kinds:  # a well-formed event followed by what cannot follow one: no string to repair
                    return None
                continue
            return Repaired(text, stop, kinds)
    except (_GiveUp, IndexError, RecursionError):
        return None
    return None


def describe(kinds: dict) -> str:
    """`3 with unescaped quotes, 1 with raw control characters` from {kind: events}."""
    return ", ".join(f"{n:,} with {KIND_NAMES[k]}" for k, n in sorted(kinds.items()) if n)


class _Parser:
    def __init__(self, data, end: int | None):
        self.data = data
        self.limit = len(data) if end is None else end
        self.steps = 0

    def _step(self):
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _GiveUp

    def _ws(self, i: int) -> int:
        return _WS.match(self.data, i).end()

    def value(self, i: int, context: int, depth: int, raw: bool = False, within: int = _OTHER):
        """(end, text, kinds) for each reading of the value at i; `raw`: a string may be read as raw text;
        `within`: what an object there is (its string values may be read raw inside the args)."""
        c = self.data[i]
        if c == 0x7B:  # {
            self._step()
            yield from self.object(i, depth + 1, within)
        elif c == 0x5B:  # [
            self._step()
            yield from self.array(i, depth + 1)
        elif c == 0x22 and raw:  # "
            yield from self.string(i, context)
        else:
            single = self._scalar(i, context)
            if single is not None:
                yield single

    def object(self, i: int, depth: int, within: int = _OTHER):
        if depth > MAX_DEPTH:
            return
        j = self._ws(i + 1)
        if self.data[j] == 0x7D:  # }
            yield j + 1, b"{}", 0
            return
        yield from self._members(j, [], 0, depth, [], within)

    def _members(self, i: int, parts: list, kinds: int, depth: int, keys: list, within: int):
        """The readings of an object's members from data[i] on (a loop while each value has one reading)."""
        data = self.data
        while True:
            key = _KEY.match(data, i)
            if key is None or key.group() in keys:
                return
            name = key.group()
            j = self._ws(key.end())
            if data[j] != 0x3A:  # :
                return
            j = self._ws(j + 1)
            # PyTorch writes the event's name and its args' texts unescaped; every other string is its own
            raw = (within == _EVENT and name == b'"name"') or within == _ARGS
            if data[j] in (0x7B, 0x5B) or (raw and data[j] == 0x22):
                break  # a value with several readings: each one, recursively, below
            single = self._scalar(j, _OBJECT)
            if single is None:
                return
            stop, text, more = single
            k = self._ws(stop)
            parts += [name, b":", text]
            kinds |= more
            keys.append(name)
            if data[k] == 0x2C:  # ,
                parts.append(b",")
                i = self._ws(k + 1)
            elif data[k] == 0x7D and self._complete(kinds, keys, within):  # }
                yield k + 1, b"{" + b"".join(parts) + b"}", kinds
                return
            else:
                return
        inner = _ARGS if within == _EVENT and name == b'"args"' else _OTHER
        for stop, text, more in self.value(j, _OBJECT, depth, raw, inner):
            k = self._ws(stop)
            pieces = parts + [name, b":", text]
            if data[k] == 0x2C:
                yield from self._members(self._ws(k + 1), pieces + [b","], kinds | more, depth, keys + [name], within)
            elif data[k] == 0x7D and self._complete(kinds | more, keys + [name], within):
                yield k + 1, b"{" + b"".join(pieces) + b"}", kinds | more

    @staticmethod
    def _complete(kinds: int, keys: list, within: int) -> bool:
        """Whether an object may end here: when a quote was reinterpreted, an event has only event keys."""
        return within != _EVENT or not kinds & QUOTE or all(k in EVENT_KEYS for k in keys)

    def _scalar(self, i: int, context: int):
        """The one reading of a number, literal or string that is not read raw: (end, text, kinds) or None."""
        self._step()
        data = self.data
        if data[i] == 0x22:
            strict = _ESCAPED_BODY.match(data, i + 1)
            if strict is None or strict.end() > self.limit or not self._may_end(strict.end(), context):
                return None
            return (strict.end(), *_fixed(bytes(data[i + 1 : strict.end() - 1])))
        m = _NUMBER.match(data, i) or _LITERAL.match(data, i)
        if m is None or m.end() > self.limit:
            return None
        return m.end(), m.group(), 0

    def array(self, i: int, depth: int):
        if depth > MAX_DEPTH:
            return
        j = self._ws(i + 1)
        if self.data[j] == 0x5D:  # ]
            yield j + 1, b"[]", 0
            return
        yield from self._elements(j, [], 0, depth)

    def _elements(self, i: int, parts: list, kinds: int, depth: int):
        for stop, text, more in self.value(i, _ARRAY, depth):
            k = self._ws(stop)
            c = self.data[k]
            if c == 0x2C:
                yield from self._elements(self._ws(k + 1), parts + [text, b","], kinds | more, depth)
            elif c == 0x5D:
                yield k + 1, b"[" + b"".join(parts + [text]) + b"]", kinds | more

    def _may_end(self, j: int, context: int) -> bool:
        """Whether a string may end just before data[j]: what follows can follow a value there."""
        k = self._ws(j)
        if k >= self.limit:
            return False
        c = self.data[k]
        if context == _OBJECT:
            return c == 0x7D or (c == 0x2C and _KEY_AHEAD.match(self.data, j) is not None)
        return c in (0x5D, 0x2C)

    def string(self, i: int, context: int):
        """The readings of a string PyTorch may have written unescaped: as JSON, then as raw text."""
        data = self.data
        first = self._scalar(i, context)
        if first is not None:
            yield first
            first = first[0]
        # the writer did not escape: the raw text up to one of the quotes after it
        q = i
        while True:
            self._step()
            q = data.find(b'"', q + 1, min(self.limit, i + 1 + MAX_STRING))
            if q < 0:
                return
            if q + 1 == first or not self._may_end(q + 1, context):
                continue
            body = bytes(data[i + 1 : q])
            if _EVENT_BOUNDARY.search(body) or _EVENT_KEY_INSIDE.search(body):
                return
            yield q + 1, *_raw(body)


def _fixed(body: bytes) -> tuple[bytes, int]:
    """A string body read as JSON: raw control characters escaped, invalid UTF-8 replaced."""
    kinds = 0
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        body = body.decode("utf-8", "replace").encode("utf-8")
        kinds |= UTF8
    if _CONTROL.search(body):
        body = _CONTROL.sub(lambda m: b"\\u%04x" % m.group(0)[0], body)
        kinds |= CONTROL
    return b'"' + body + b'"', kinds


def _raw(body: bytes) -> tuple[bytes, int]:
    """A string body read as the writer's raw text, as a JSON string."""
    kinds = (QUOTE if b'"' in body else 0) | (BACKSLASH if b"\\" in body else 0)
    kinds |= CONTROL if _CONTROL.search(body) else 0
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("utf-8", "replace")
        kinds |= UTF8
    return json.dumps(text, ensure_ascii=False).encode("utf-8"), kinds
