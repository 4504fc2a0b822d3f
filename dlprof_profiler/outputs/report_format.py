"""Report tables as text: DLProf 1.8's CSV value formats (reference/dlprof_outputs.md §3) and the JSON
layout of our reports, written in bulk a chunk of rows at a time.

Every column is formatted by its kind, never row by row in Python: integers and floats with vectorized
Arrow/NumPy arithmetic, text columns through their dictionary of distinct strings (quoted or JSON-escaped
once per distinct value, then taken by code), and whole lines joined by Arrow compute; the bytes of a chunk
go to the file straight from the Arrow buffer. A table's rows come either as whole columns or as an
iterable of chunks, so a report of any length is written in memory bounded by the chunk size.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

# Column formats: q = always-quoted text, t = bare text (quoted only when CSV needs it), i = integer,
# a = average (one decimal), p = percentage (one decimal), y = yes/no.
TEXT_FORMATS = ("q", "t")
# n, m: integer / average, blank (JSON null) when missing; r: a rate with three decimals (TFLOP/s), likewise
FORMATS = ("q", "t", "i", "a", "p", "y", "n", "m", "r")
CHUNK_ROWS = 65_536  # rows formatted at a time: the memory of writing does not grow with the table
CSV, JSON = "csv", "json"

# One-decimal values below this magnitude print as `<integer part>.<digit>` (a rounded value k/10 is the
# double nearest to that decimal, which then is both its shortest repr and its "{:.1f}" text); larger or
# non-finite values are formatted by Python itself.
_FAST_DECIMAL_LIMIT = 1e14
_NEEDS_QUOTES = '[",\n\r]'
_LOCAL_DICTIONARY_FACTOR = 4  # a dictionary this many times longer than a chunk is formatted per chunk


@dataclass
class Table:
    """One titled section. Rows come as whole columns (`data`: column name -> array-like) or as `chunks`:
    an iterable of row chunks (or a function returning one, so the table can be written more than once),
    each a dict {column name: values} or an Arrow RecordBatch/Table with the table's column names.
    Column values may be NumPy/pandas/Arrow arrays or lists; text columns may be coded (pandas
    Categorical, or Arrow DictionaryArray whose dictionary is shared by every chunk: its distinct values
    are formatted once per write); consecutive coded columns built on one indices array are formatted
    together, one string per distinct row of theirs."""

    title: str
    columns: list[str]
    formats: list[str]
    data: dict | None = None
    header_prefix: str | None = ""  # None: no header line (label/value sections); summary headers start ","
    bare: bool = False  # the summary file quotes nothing
    chunks: Iterable | Callable[[], Iterable] | None = None

    def __post_init__(self):
        if len(self.columns) != len(self.formats):
            raise ValueError(f"table {self.title!r}: {len(self.columns)} columns but {len(self.formats)} formats")
        unknown = set(self.formats) - set(FORMATS)
        if unknown:
            raise ValueError(f"table {self.title!r}: unknown column format(s) {sorted(unknown)}")
        if (self.data is None) == (self.chunks is None):
            raise ValueError(f"table {self.title!r}: give either whole columns (data) or chunks")
        self._consumed = False

    @property
    def n_rows(self) -> int:
        """Rows of a whole-column table (the first column given decides, as DLProf's writer did)."""
        if self.data is None:
            raise TypeError(f"table {self.title!r} is streamed: its row count is known only once written")
        return len(next(iter(self.data.values()))) if self.data else 0

    def iter_chunks(self) -> Iterator[dict]:
        """The rows as dicts {column name: values} of at most CHUNK_ROWS rows each."""
        if self.data is not None:
            yield from _split({c: self.data[c] for c in self.columns}, self.n_rows)
            return
        source = self.chunks() if callable(self.chunks) else self.chunks
        if source is self.chunks and iter(source) is source:  # a one-shot iterator
            if self._consumed:
                raise RuntimeError(
                    f"table {self.title!r}: its chunk iterator was already consumed; "
                    "give a function returning the chunks to write it again"
                )
            self._consumed = True
        for chunk in source:
            for part in _chunk_parts(chunk):
                missing = [c for c in self.columns if c not in part]
                if missing:
                    raise KeyError(f"table {self.title!r}: chunk without column(s) {missing}")
                yield from _split({c: part[c] for c in self.columns}, len(part[self.columns[0]]))


def _chunk_parts(chunk) -> Iterator[dict]:
    if isinstance(chunk, pa.Table):
        for batch in chunk.to_batches():
            yield {name: batch.column(name) for name in batch.schema.names}
    elif isinstance(chunk, pa.RecordBatch):
        yield {name: chunk.column(name) for name in chunk.schema.names}
    else:
        yield chunk


def _split(columns: dict, n: int) -> Iterator[dict]:
    if n == 0:
        return
    if n <= CHUNK_ROWS:
        yield columns
        return
    for lo in range(0, n, CHUNK_ROWS):
        yield {c: _slice(v, lo, lo + CHUNK_ROWS) for c, v in columns.items()}


def _slice(values, lo: int, hi: int):
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values.slice(lo, hi - lo)
    if isinstance(values, (pd.Series, pd.Index)):
        return pd.Series(values).iloc[lo:hi]
    if isinstance(values, pd.Categorical):
        return values[lo:hi]
    if isinstance(values, np.ndarray):
        return values[lo:hi]
    return list(values)[lo:hi]


# ---------------------------------------------------------------------------- cells of one column


@dataclass
class _Coded:
    """Cells as a formatted dictionary (its last entry is the cell of a missing value) taken by codes."""

    dictionary: pa.Array  # formatted strings
    codes: np.ndarray  # positions in `dictionary`
    group: tuple | None = None  # columns with the same group share `codes` and merge before the take
    stable: bool = False  # the same dictionary object in every chunk (derived strings are remembered)


def _cells_as_array(cells) -> pa.Array:
    return cells.dictionary.take(pa.array(cells.codes)) if isinstance(cells, _Coded) else cells


class _Formatter:
    """Formats the columns of one table for one target (csv or json); remembers formatted dictionaries,
    so a dictionary shared by every chunk is formatted once per table."""

    def __init__(self, target: str, bare: bool):
        self.target = target
        self.bare = bare
        self.cache: dict = {}

    # -- text
    def text_dictionary(self, key, source, strings: Callable[[], list | pa.Array], fmt: str) -> pa.Array:
        """Formatted distinct strings plus the missing-value cell; `source` is kept alive with its cache
        entry so `key` (built from its identity) cannot be reused by another object."""
        entry = self.cache.get((key, fmt))
        if entry is None:
            entry = (source, self._format_text(strings(), fmt))
            self.cache[(key, fmt)] = entry
        return entry[1]

    def _format_text(self, strings, fmt: str) -> pa.Array:
        arr = pa.array(strings, type=pa.string()) if not isinstance(strings, pa.Array) else strings
        if not pa.types.is_string(arr.type):
            arr = arr.cast(pa.string())
        arr = pa.concat_arrays([pc.fill_null(arr, ""), pa.array([""], type=pa.string())])  # + the missing cell
        if self.target == JSON:
            return pa.array([encode_basestring_ascii(s) for s in arr.to_pylist()], type=pa.string())
        quoted = pc.binary_join_element_wise('"', pc.replace_substring(arr, '"', '""'), '"', "")
        if fmt == "q" and not self.bare:
            return quoted
        return pc.if_else(pc.match_substring_regex(arr, _NEEDS_QUOTES), quoted, arr)

    def text(self, values, fmt: str):
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if isinstance(values, pa.Array):
            if pa.types.is_dictionary(values.type):
                return self._arrow_coded(values, fmt)
            if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
                return self._arrow_coded(values.dictionary_encode(), fmt, cache=False)
            values = values.to_pandas()
        s = values if isinstance(values, pd.Series) else pd.Series(values)
        if isinstance(s.dtype, pd.CategoricalDtype):
            cats = s.cat.categories
            return _Coded(
                self.text_dictionary(("categories", id(cats)), cats, lambda: _as_strings(cats), fmt),
                _with_missing_slot(s.cat.codes.to_numpy(), len(cats)),
                stable=True,
            )
        raw = s.to_numpy(dtype=object)
        if pd.api.types.infer_dtype(raw, skipna=True) not in ("string", "empty"):
            # not only strings: the text of each value, as DLProf's writer did (small tables only)
            raw = s.astype(object).where(s.notna(), "").astype(str).to_numpy(dtype=object)
        codes, uniques = pd.factorize(raw, use_na_sentinel=True)
        return _Coded(self._format_text(uniques, fmt), _with_missing_slot(codes, len(uniques)))

    def _arrow_coded(self, values: pa.DictionaryArray, fmt: str, cache: bool = True) -> _Coded:
        dictionary, indices = values.dictionary, values.indices
        codes = (
            indices.to_numpy(zero_copy_only=False) if indices.null_count == 0 else pc.fill_null(indices, -1).to_numpy()
        )
        group = ("indices", _buffers_key(indices))
        if len(dictionary) > _LOCAL_DICTIONARY_FACTOR * len(codes) + CHUNK_ROWS:
            # a large string table (of the whole engine, say): format only what this chunk uses
            codes, used = pd.factorize(codes)
            formatted = self._format_text(dictionary.take(pa.array(used, mask=used < 0)), fmt)
            return _Coded(formatted, codes, group=group)
        if cache:
            formatted = self.text_dictionary(("arrow", _buffers_key(dictionary)), dictionary, lambda: dictionary, fmt)
        else:
            formatted = self._format_text(dictionary, fmt)
        return _Coded(formatted, _with_missing_slot(codes, len(dictionary)), group=group, stable=cache)

    # -- numbers
    def integers(self, values):
        ints = _integer_values(values)
        if ints.size == 0:
            return pa.array([], type=pa.string())
        lo, hi = int(ints.min()), int(ints.max())
        if hi - lo < max(4096, ints.size // 2):  # few distinct values: format the range once, take
            lut = pa.array(np.arange(lo, hi + 1, dtype=np.int64)).cast(pa.string())
            return _Coded(lut, ints - lo)
        return pa.array(ints).cast(pa.string())

    def decimals(self, values):
        return _one_decimal(_float_values(values), self.target)

    def flags(self, values):
        yes = _flag_values(values)
        key = ("yes/no", self.target)
        if key not in self.cache:
            self.cache[key] = (None, pa.array(['"no"', '"yes"'] if self.target == JSON else ["no", "yes"]))
        return _Coded(self.cache[key][1], yes.astype(np.int8), stable=True)

    def column(self, values, fmt: str, shared: dict | None = None, position: int = 0):
        """The cells of one column of a chunk. `shared`: one dict per chunk for every target, keeping by
        column position what is the same in CSV and JSON (integers and where numbers are missing), so the
        second target does not format them again."""
        if fmt in TEXT_FORMATS:
            return self.text(values, fmt)
        if fmt == "i":
            return _shared(shared, position, lambda: self.integers(values))
        if fmt == "n":
            return self._blanked(*_shared(shared, position, lambda: self._numbers(values, fmt)))
        if fmt in ("m", "r"):
            return self._blanked(*self._numbers(values, fmt))
        if fmt in ("a", "p"):
            return self.decimals(values)
        return self.flags(values)

    def _numbers(self, values, fmt: str) -> tuple:
        """(cells, where missing) of numbers that may be missing (NaN/None: blank in CSV, null in JSON)."""
        s = _numeric_series(values)
        numeric = pd.to_numeric(s, errors="coerce")
        missing = numeric.isna().to_numpy()
        if fmt == "r":
            return _three_decimals(numeric.to_numpy(np.float64, na_value=0.0), self.target), missing
        return (self.integers(s) if fmt == "n" else self.decimals(s)), missing

    def _blanked(self, cells, missing: np.ndarray):
        if not missing.any():
            return cells
        blank = "null" if self.target == JSON else ""
        if isinstance(cells, _Coded):  # the blank cell appended to the distinct ones, so the column stays coded
            dictionary = pa.concat_arrays([cells.dictionary, pa.array([blank], type=pa.string())])
            return _Coded(dictionary, np.where(missing, len(cells.dictionary), cells.codes))
        return pc.if_else(pa.array(missing), pa.scalar(blank, pa.string()), cells)


def _shared(shared: dict | None, key, make: Callable):
    """`make()`, remembered in `shared` under `key` (made anew without `shared`)."""
    if shared is None:
        return make()
    if key not in shared:
        shared[key] = make()
    return shared[key]


def _buffers_key(arr: pa.Array) -> tuple:
    """Identity of an Arrow array's data (arrays built on the same buffers compare equal)."""
    return (arr.type, arr.offset, len(arr)) + tuple(b.address if b is not None else 0 for b in arr.buffers())


def _with_missing_slot(codes: np.ndarray, missing: int) -> np.ndarray:
    codes = np.asarray(codes)
    return np.where(codes < 0, missing, codes) if codes.size and codes.min() < 0 else codes


def _as_strings(values) -> list:
    return [v if isinstance(v, str) else str(v) for v in list(values)]


def _numeric_series(values) -> pd.Series:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if pa.types.is_dictionary(values.type):
            values = values.cast(values.type.value_type)
        return pd.Series(values.to_numpy(zero_copy_only=False))
    if isinstance(values, pd.Series):
        return values.reset_index(drop=True)
    return pd.Series(values)


def _integer_values(values) -> np.ndarray:
    """int64 as DLProf's writer: missing -> 0, floats rounded half to even."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return values.astype(np.int64, copy=False)
    s = _numeric_series(values)
    if isinstance(s.dtype, pd.api.extensions.ExtensionDtype) and s.dtype.kind in "iu":  # Int64: <NA> -> 0
        return s.fillna(0).to_numpy(np.int64)
    kind = s.dtype.kind if isinstance(s.dtype, np.dtype) else ""
    if kind in "iu":
        return s.to_numpy().astype(np.int64, copy=False)
    if kind == "b":
        return s.to_numpy().astype(np.int64)
    if kind == "f":
        x = s.to_numpy(dtype=np.float64)
        return np.round(np.where(np.isnan(x), 0.0, x)).astype(np.int64)
    return pd.to_numeric(s, errors="coerce").fillna(0).round().astype(np.int64).to_numpy()


def _float_values(values) -> np.ndarray:
    """float64 rounded to one decimal as DLProf's writer (missing -> 0.0)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        x = values.astype(np.float64, copy=False)
    else:
        s = _numeric_series(values)
        if isinstance(s.dtype, np.dtype) and s.dtype.kind in "iufb":
            x = s.to_numpy().astype(np.float64, copy=False)
        else:
            x = pd.to_numeric(s, errors="coerce").fillna(0.0).astype(np.float64).to_numpy()
    x = np.where(np.isnan(x), 0.0, x)
    return np.round(x, 1)


def _flag_values(values) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == bool:
        return values
    s = _numeric_series(values)
    return s.fillna(False).astype(bool).to_numpy()


_DIGITS = pa.array([f".{d}" for d in range(10)])
_SIGNS = pa.array(["", "-"])


def _one_decimal(v: np.ndarray, target: str) -> pa.Array:
    """Text of values already rounded to one decimal: "{:.1f}" (CSV) or repr (JSON); equal where fast."""
    if v.size == 0:
        return pa.array([], type=pa.string())
    finite = np.isfinite(v) & (np.abs(v) < _FAST_DECIMAL_LIMIT)
    if not finite.all():
        slow = "{:.1f}".format if target == CSV else json.dumps
        return pa.array([slow(x) for x in v.tolist()], type=pa.string())
    tenths = np.rint(np.abs(v) * 10.0).astype(np.int64)
    whole = pa.array(tenths // 10).cast(pa.string())
    sign = _SIGNS.take(pa.array(np.signbit(v).astype(np.int8)))
    return pc.binary_join_element_wise(sign, whole, _DIGITS.take(pa.array(tenths % 10)), "")


def _three_decimals(v: np.ndarray, target: str) -> pa.Array:
    """Text of rates: "{:.3f}" (CSV) or the JSON number of the value rounded to three decimals (few rows:
    the op tables)."""
    v = np.where(np.isfinite(v), v, 0.0)
    if target == CSV:
        return pa.array(np.char.mod("%.3f", v).tolist(), type=pa.string())
    return pa.array([json.dumps(x) for x in np.round(v, 3).tolist()], type=pa.string())


# ---------------------------------------------------------------------------- lines of one chunk

# Adjacent coded columns are merged into one coded column (one formatted string per distinct combination)
# while their distinct combinations in the chunk are at most this share of its rows.
_MERGE_SHARE = 0.5


class _ChunkWriter:
    """Writes the rows of one table to one open binary file, chunk after chunk: a CSV line per row, or the
    rows of a JSON array (`[...]` separated by ", ")."""

    def __init__(self, fh, target: str, bare: bool):
        self.fh = fh
        self.target = target
        self.formatter = _Formatter(target, bare)
        self.sep = "," if target == CSV else ", "
        self.prefix, self.suffix = ("", "\n") if target == CSV else (", [", "]")
        self.skip_first = 0 if target == CSV else len(", ")  # the first row of a JSON table has no ", " before it
        self.rows = 0
        self.joined: dict = {}

    def write(self, columns: list, formats: list[str], shared: dict | None = None) -> None:
        """One chunk's rows; `shared`: the chunk's cells common to every target (_Formatter.column)."""
        n = len(columns[0]) if columns else 0
        if n == 0:
            return
        cells = [self.formatter.column(v, f, shared, i) for i, (v, f) in enumerate(zip(columns, formats))]
        cells = self._merge(cells, n)
        cells[0] = self._affix(cells[0], self.prefix, "")
        cells[-1] = self._affix(cells[-1], "", self.suffix)
        arrays = [_cells_as_array(c) for c in cells]
        line = arrays[0] if len(arrays) == 1 else pc.binary_join_element_wise(*arrays, self.sep)
        _write_string_bytes(self.fh, line, skip=self.skip_first if self.rows == 0 else 0)
        self.rows += n

    def _affix(self, cells, prefix: str, suffix: str):
        if not prefix and not suffix:
            return cells
        if isinstance(cells, _Coded):  # on the distinct strings only
            parts = (pa.scalar(prefix), cells.dictionary, pa.scalar(suffix))
            return _Coded(self._joined(parts, "", cells.stable), cells.codes, cells.group, cells.stable)
        return pc.binary_join_element_wise(pa.scalar(prefix), cells, pa.scalar(suffix), "")

    def _joined(self, parts: tuple, sep: str, stable: bool) -> pa.Array:
        """Element-wise join of formatted dictionaries (and scalars); remembered when they are the same
        objects in every chunk."""
        if not stable:
            return pc.binary_join_element_wise(*parts, sep)
        key = tuple(_buffers_key(p) if isinstance(p, pa.Array) else p.as_py() for p in parts) + (sep,)
        entry = self.joined.get(key)
        if entry is None:
            entry = (parts, pc.binary_join_element_wise(*parts, sep))
            self.joined[key] = entry
        return entry[1]

    def _merge(self, cells: list, n: int) -> list:
        """Merge runs of adjacent coded columns: those on one indices array (the op columns of a launch)
        through their joined dictionaries, others while their distinct combinations stay few."""
        out = [cells[0]]
        for c in cells[1:]:
            last = out[-1]
            merged = self._pair(last, c, n) if isinstance(last, _Coded) and isinstance(c, _Coded) else None
            if merged is None:
                out.append(c)
            else:
                out[-1] = merged
        return out

    def _pair(self, a: _Coded, b: _Coded, n: int) -> _Coded | None:
        stable = a.stable and b.stable
        if a.group is not None and a.group == b.group and len(a.dictionary) == len(b.dictionary):
            return _Coded(self._joined((a.dictionary, b.dictionary), self.sep, stable), a.codes, a.group, stable)
        # a column of one cell (a constant grid size, an empty text): the other's codes as they are
        if len(b.dictionary) == 1:
            return _Coded(self._joined((a.dictionary, b.dictionary[0]), self.sep, stable), a.codes, a.group, stable)
        if len(a.dictionary) == 1:
            return _Coded(self._joined((a.dictionary[0], b.dictionary), self.sep, stable), b.codes, b.group, stable)
        width = len(b.dictionary)
        combinations = len(a.dictionary) * width
        if combinations >= 2**62:
            return None
        pair = a.codes.astype(np.int64) * width + b.codes
        if combinations <= 4 * n:  # few possible pairs: mark the ones present instead of hashing
            present = np.zeros(combinations, dtype=bool)
            present[pair] = True
            distinct = np.flatnonzero(present)
            if distinct.size > _MERGE_SHARE * n:
                return None
            position = np.cumsum(present) - 1
            codes = position[pair]
        else:
            codes, distinct = pd.factorize(pair)
            if distinct.size > _MERGE_SHARE * n:
                return None
        dictionary = pc.binary_join_element_wise(
            a.dictionary.take(pa.array(distinct // width)), b.dictionary.take(pa.array(distinct % width)), self.sep
        )
        return _Coded(dictionary, codes)


def _write_string_bytes(fh, arr: pa.Array, skip: int = 0) -> None:
    """The characters of every string of `arr`, back to back, straight from its data buffer."""
    if isinstance(arr, pa.ChunkedArray):
        for part in arr.chunks:
            _write_string_bytes(fh, part, skip)
            skip = 0
        return
    if len(arr) == 0:
        return
    width = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=width, count=len(arr) + 1, offset=arr.offset * width().itemsize)
    data = arr.buffers()[2]
    if data is None:
        return
    fh.write(memoryview(data)[int(offsets[0]) + skip : int(offsets[-1])])


# ---------------------------------------------------------------------------- sections and files


def header_line(table: Table) -> str | None:
    """`prefix` + column names, each quoted only if CSV needs it; None for label/value sections."""
    if table.header_prefix is None:
        return None
    return table.header_prefix + ",".join(_quote_if_needed(c) for c in table.columns)


def _quote_if_needed(text: str) -> str:
    if any(ch in text for ch in '",\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


class SectionWriters:
    """Writes the sections of one report to several open binary files (one per format) in one pass over
    each table's rows, so a streamed table is produced once whatever the number of formats."""

    def __init__(self, files: dict, report_name: str, version: str):
        self.files = files  # format ("csv" / "json") -> binary file object
        self.report_name = report_name
        self.version = version
        self.sections = 0

    def begin(self) -> None:
        if JSON in self.files:
            self.files[JSON].write(
                (
                    '{"report": '
                    + json.dumps(self.report_name)
                    + ', "dlprof_version": '
                    + json.dumps(self.version)
                    + ', "sections": ['
                ).encode("utf-8")
            )

    def table(self, table: Table) -> None:
        first = self.sections == 0
        self.sections += 1
        writers = {}
        if CSV in self.files:
            fh = self.files[CSV]
            head = ("" if first else "\n") + table.title + "\n"
            header = header_line(table)
            if header is not None:
                head += header + "\n"
            fh.write(head.encode("utf-8"))
            writers[CSV] = _ChunkWriter(fh, CSV, table.bare)
        if JSON in self.files:
            fh = self.files[JSON]
            fh.write(
                (
                    ("" if first else ",\n")
                    + '{"title": '
                    + json.dumps(table.title)
                    + ', "columns": '
                    + json.dumps(table.columns)
                    + ', "rows": ['
                ).encode("utf-8")
            )
            writers[JSON] = _ChunkWriter(fh, JSON, table.bare)
        for chunk in table.iter_chunks():
            columns = [chunk[c] for c in table.columns]
            shared: dict = {}  # what every format's writer takes alike from this chunk
            for writer in writers.values():
                writer.write(columns, table.formats, shared)
        if JSON in self.files:
            self.files[JSON].write(b"]}")

    def end(self) -> None:
        if JSON in self.files:
            self.files[JSON].write(b"]}\n")
