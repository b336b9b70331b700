"""Value checks of data just read, cheap enough to run on every sample (see ``benchmarks/finite_checks.py``).

:func:`all_finite` answers "is every value finite?" for a float array with one BLAS pass and no temporary:
a NaN or an infinity makes a dot product NaN or infinite (``np.isfinite(a).all()`` writes a boolean array
of the input's size first, about twice the time). Up to :data:`SMALL` values the dot is with a vector of
2^-64 (a scaled sum, which finite values cannot overflow, so the answer is exact at once and there is no
``np.errstate`` to enter, which costs as much as the dot there; numpy warns only for data holding both
infinities, which is refused anyway); above, with the values themselves under ``np.errstate``, and only
when that dot is not finite does it look closer, because finite values' squares can overflow it too.
Integer arrays are finite by construction.
"""
from __future__ import annotations

import functools
import math

import numpy as np


#: at most this many values are summed (a dot with 2^-64, no ``np.errstate``); above, the errstate's cost is
#: small beside the pass (2-core EPYC, float32: 8,000 values 1.05 us summed, 2.09 us ``np.isfinite(a).all()``,
#: 2.72 us errstate + dot of squares; 32,768: 2.8 / 3.9 / 4.1 us; 100,000: 8.8 / 9.5 / 8.2 us)
SMALL = 32768


@functools.cache
def _tiny(dtype: np.dtype) -> np.ndarray:
    """SMALL copies of 2^-64 (a normal number in float32 and float64), read-only."""
    tiny = np.full(SMALL, 2.0 ** -64, dtype=dtype)
    tiny.flags.writeable = False
    return tiny


def all_finite(a: np.ndarray) -> bool:
    """True when every value of ``a`` is finite (no NaN, no +-inf)."""
    if a.dtype.kind != "f" or a.size == 0:
        return True
    flat = a.reshape(-1) if a.flags.c_contiguous else np.ravel(a)
    if a.dtype.itemsize < 4 or a.dtype.itemsize > 8:  # float16: BLAS has no half dot; long double neither
        return bool(np.isfinite(flat).all())
    if a.size <= SMALL:  # exact: 2^-64 times at most SMALL finite values cannot reach the float range
        return math.isfinite(flat.dot(_tiny(flat.dtype)[:a.size]))
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.dot(flat, flat)):
            return True
    return bool(np.isfinite(flat).all())  # a NaN/inf, or only the squares overflowed


def first_non_finite(a: np.ndarray) -> tuple[tuple[int, ...], float] | None:
    """The index and value of the first non-finite element of ``a`` (C order), or None."""
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad.reshape(-1))), a.shape))
    return idx, float(a[idx])
