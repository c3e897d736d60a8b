"""Cholesky solves of the learners' small systems at LAPACK's cost, not numpy.linalg's.

Why: every fold of every learner solves one 11×11 (or smaller) system, and the NNLS of
the published vector a few more. ``np.linalg.cholesky`` and ``np.linalg.solve`` spend
~10 µs each on argument checks and error-state bookkeeping around a ~1 µs LAPACK call;
at d = 11 that was most of a learner's cost per fold. :func:`spd_solve` makes the very
same gufunc calls numpy.linalg makes (so the results are bit-identical) inside one error
state, and falls back to numpy.linalg if numpy's private gufunc module ever moves.

>>> import numpy as np
>>> a = np.array([[4.0, 2.0], [2.0, 3.0]])
>>> spd_solve(a, np.array([2.0, 1.0])).round(12).tolist()
[0.5, 0.0]
>>> spd_solve(np.array([[1.0, 2.0], [2.0, 1.0]]), np.ones(2)) is None  # not definite
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

_CHOLESKY: Any = None
_SOLVE1: Any = None
try:  # the gufuncs behind np.linalg.cholesky / np.linalg.solve (numpy 1.x and 2.x)
    from numpy.linalg import _umath_linalg

    _CHOLESKY = _umath_linalg.cholesky_lo
    _SOLVE1 = _umath_linalg.solve1
except (ImportError, AttributeError):  # pragma: no cover - a numpy without them
    pass

__all__ = ["spd_solve"]

FloatArray = npt.NDArray[np.float64]


def spd_solve(a: FloatArray, b: FloatArray) -> FloatArray | None:
    """``x`` with ``a x = b`` for a symmetric positive definite float64 ``a`` (d×d) and
    ``b`` (d,), by Cholesky — ``np.linalg.solve(c.T, np.linalg.solve(c, b))`` with ``c =
    np.linalg.cholesky(a)``, bit for bit; None when ``a`` is not positive definite."""
    if _CHOLESKY is None or _SOLVE1 is None or a.shape[0] == 0:  # pragma: no cover
        try:
            c = np.linalg.cholesky(a)
        except np.linalg.LinAlgError:
            return None
        return np.asarray(np.linalg.solve(c.T, np.linalg.solve(c, b)), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore", under="ignore"):
        # LAPACK's failure fills the factor with NaN (numpy.linalg raises on that flag)
        c = _CHOLESKY(a, signature="d->d")
        if c[0, 0] != c[0, 0]:
            return None
        out: FloatArray = _SOLVE1(c.T, _SOLVE1(c, b, signature="dd->d"), signature="dd->d")
    return out
