"""The analyzer's robust statistics against numpy's reference implementations, on
generated arrays (NaN, ±inf, ties, all-NaN slices)."""

from __future__ import annotations

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tracealyze.analyzer.stats.robust import nanmedian

# Finite values below 1e300: beyond ~9e307 numpy's own median of one value overflows to inf
# (it averages the value with itself); ours returns the value. ±inf and NaN are in.
VALUES = st.one_of(st.floats(min_value=-1e300, max_value=1e300),
                   st.sampled_from([np.nan, np.inf, -np.inf, 0.0, 1.0, -1.0]))


@settings(max_examples=400, deadline=None)
@given(a=hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=12),
                    elements=VALUES), axis=st.sampled_from([0, 1]))
def test_nanmedian_is_numpys(a: np.ndarray, axis: int) -> None:
    with warnings.catch_warnings():  # (numpy's all-NaN warning, for the reference only)
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.nanmedian(a, axis=axis)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ours never warns
        got = nanmedian(a, axis)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_nanmedian_of_huge_values_does_not_overflow() -> None:
    a = np.array([[8.98846567e307], [np.nan]])
    assert nanmedian(a, 0)[0] == 8.98846567e307
