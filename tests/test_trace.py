"""Shared frame helpers: combined_codes numbers the distinct tuples of its columns in order of first
appearance, whichever way it computes them (a table, one hashed key, or column by column)."""

import numpy as np
import pytest

from dlprof_profiler.engine.trace import combined_codes


def first_appearance(*columns) -> list[int]:
    seen = {}
    return [seen.setdefault(row, len(seen)) for row in zip(*[list(c) for c in columns])]


@pytest.mark.parametrize(
    "columns",
    [
        (np.array([3, 1, 3, 2, 1]), np.array([0, 0, 0, 1, 0])),  # small range: a table
        (np.array([-5, 7, -5, 2**40]), np.array([True, False, True, True])),  # far-apart values: numbered
        (np.random.default_rng(2).integers(0, 10**6, 5000), np.random.default_rng(3).integers(0, 10**6, 5000)),
        # ^ many distinct pairs: one hashed key
        (np.array([2**62, -(2**62), 2**62]), np.array([1, 2, 1]), np.array([9, 9, 9])),  # would overflow: stepwise
        (np.array(["b", "a", "b", "c"], dtype=object), np.array([1, 1, 1, 2])),
        (np.random.default_rng(0).integers(0, 40, 5000), np.random.default_rng(1).integers(-3, 3, 5000)),
        (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)),
    ],
)
def test_codes_in_order_of_first_appearance(columns):
    codes = combined_codes(*columns)
    assert codes.dtype == np.int64
    assert codes.tolist() == first_appearance(*columns)


def test_missing_values_as_factorize_gives_them():
    """pd.factorize codes None as -1: stepwise combining keeps that (the fast key is not used)."""
    codes = combined_codes(np.array(["a", None, "a"], dtype=object), np.array([1, 1, 1]))
    assert codes[0] == codes[2] and codes[1] != codes[0]
