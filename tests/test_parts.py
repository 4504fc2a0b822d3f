"""Tables kept on disk as Arrow IPC parts (store/parts.py): compressed or not, they read back alike."""

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from dlprof_profiler.store import parts
from dlprof_profiler.store.parts import COMPRESSED, PartTable

SCHEMA = pa.schema([("start", pa.int64()), ("flag", pa.int8()), ("code", pa.int32())])
real_read_part = parts.read_part


def filled(folder, compression):
    """Three parts of increasing starts: mostly repeated flags and codes, as the staged tables hold."""
    rng = np.random.default_rng(7)
    table = PartTable(folder, "t", SCHEMA, keys=("start",), compression=compression)
    first = 0
    for n in (50_000, 1, 20_000):
        start = first + np.cumsum(rng.integers(1, 50, n))
        first = int(start[-1]) + 1
        table.append({"start": start, "flag": (start % 7 == 0).astype(np.int8), "code": np.full(n, -1, np.int32)})
    return table


@pytest.mark.parametrize("compression", [None, COMPRESSED])
def test_parts_read_back_what_was_written(tmp_path, compression):
    plain, other = filled(tmp_path / "plain", None), filled(tmp_path / "other", compression)
    assert other.read().equals(plain.read())
    lo, hi = int(plain.read().column("start")[10_000].as_py()), int(plain.read().column("start")[60_000].as_py())
    a, b = plain.read_range(lo, hi), other.read_range(lo, hi)
    assert a.keys() == b.keys() and all(np.array_equal(a[c], b[c]) for c in a)
    assert a["start"].size == 50_000 and a["start"][0] == lo  # [lo, hi): the 50,000 rows from row 10,000
    keys = plain.read().column("start").to_numpy()[[5, 49_999, 50_000, 70_000]]
    assert np.array_equal(
        other.lookup(keys, ["flag"])["flag"], plain.read().column("flag").to_numpy()[[5, 49_999, 50_000, 70_000]]
    )
    con = duckdb.connect()
    other.register(con)
    assert con.execute("SELECT count(*), sum(flag), min(code) FROM t").fetchone() == (
        70_001,
        int(plain.read().column("flag").to_numpy().sum()),
        -1,
    )


def test_compressed_parts_take_a_fraction_of_the_bytes(tmp_path):
    def size(table):
        return sum(p.path.stat().st_size for p in table.parts)

    # 13 bytes a row uncompressed: the flags and codes all but vanish, the increasing starts shrink too
    assert size(filled(tmp_path / "c", COMPRESSED)) < size(filled(tmp_path / "p", None)) / 2


@pytest.mark.parametrize("compression", [None, COMPRESSED])
def test_small_batches_read_just_the_batches_a_range_meets(tmp_path, compression, monkeypatch):
    """Ranges as nsys writes them (as they end): starts mostly increasing, a few long ones starting far back.
    Whatever [lo, hi), read_range gives the rows with lo <= start < hi in writing order, as a plain filter does,
    and a narrow range decodes only some of a part's batches."""
    rng = np.random.default_rng(11)
    n = 10_000
    start = np.cumsum(rng.integers(1, 20, n))
    start[rng.choice(n, 12, replace=False)] = rng.integers(0, 1000, 12)  # long ranges that started early
    flag = (start % 3 == 0).astype(np.int8)
    code = rng.integers(-1, 5, n).astype(np.int32)
    table = PartTable(tmp_path, "r", SCHEMA, keys=("start",), compression=compression, batch_rows=1000)
    table.append({"start": start[:6000], "flag": flag[:6000], "code": code[:6000]})
    table.append({"start": start[6000:], "flag": flag[6000:], "code": code[6000:]})
    assert [p.batch_bounds["start"][0].size for p in table.parts] == [6, 4]
    read = []

    def read_part(path, columns=None, schema=None, batches=None):
        if batches is not None:
            read.append(list(batches))
        return real_read_part(path, columns, schema, batches)

    monkeypatch.setattr(parts, "read_part", read_part)
    for lo, hi in [(0, 500), (40_000, 41_000), (int(start[5990]), int(start[6010])), (0, 10**9), (10**9, 10**9 + 1)]:
        got = table.read_range(lo, hi)
        keep = (start >= lo) & (start < hi)
        assert np.array_equal(got["start"], start[keep]) and np.array_equal(got["code"], code[keep])
        assert np.array_equal(got["flag"], flag[keep])
    assert read and all(len(batches) < 6 for batches in read)
