"""``all_finite`` (one BLAS pass) agrees with ``np.isfinite(a).all()`` on every kind of input, including
finite values whose squares overflow, and ``first_non_finite`` names the first bad element."""
from __future__ import annotations

import numpy as np
import pytest

from hpcbench.common.data.values import all_finite, first_non_finite


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_all_finite_agrees_with_numpy(dtype: type) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 5, 3)).astype(dtype)
    assert all_finite(a) and first_non_finite(a) is None
    big = a.copy()
    big[0, 0, 0] = np.finfo(dtype).max  # finite, but its square overflows
    assert all_finite(big)
    for bad in (np.nan, np.inf, -np.inf):
        b = a.copy()
        b[4, 2, 1] = bad
        assert not all_finite(b)
        assert not all_finite(b[:, ::2])  # a strided view
        idx, v = first_non_finite(b)
        assert idx == (4, 2, 1) and (np.isnan(v) if np.isnan(bad) else v == bad)


def test_integers_and_empty_arrays_are_finite() -> None:
    assert all_finite(np.arange(10, dtype=np.int16)) and all_finite(np.empty((0, 3), np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 1000, 32768, 32769, 200_000])
def test_extreme_finite_values_are_finite_without_a_warning(dtype: type, n: int) -> None:
    """Finite values at the float range's limits, whose sum and whose squares overflow, at sizes on both
    sides of the small-array path: finite, and numpy prints no overflow warning; one NaN or infinity
    anywhere is found."""
    import warnings

    top = np.finfo(dtype).max
    a = np.full(n, top, dtype=dtype)
    a[::2] = -top if n > 2 else top
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert all_finite(a)
        for bad in (np.nan, np.inf, -np.inf):
            b = a.copy()
            b[n // 2] = bad
            assert not all_finite(b)
