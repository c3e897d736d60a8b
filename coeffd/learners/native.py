"""The compiled fold (``_fold.c``), when it is built and not switched off.

``_fold.fold`` does one fold of an :class:`~learners.rls.RLSRegressor` — the chunk's
robust weights, residual scale and drift residuals, its prequential predictions and the
rank-m update of its information ``(A, b)`` — in C: at d = 11 and 16 rows the arithmetic
is a few µs, the ~25 numpy calls and per-row Python loops of the pure path several times
that, and the learning consumer folds three learners per 16 step observations (issue
34). ``solve`` forms a learner's total information and solves it (Cholesky), ``nnls``
is :func:`learners.nnls.nnls_information`'s Lawson–Hanson, ``refit`` the batch
refit's block and NNLS (:class:`learners.evaluation.WindowedRefit`), ``compare`` the
steady pair's per-row error comparison (:meth:`learners.steady.SteadyEstimator._compare_rows`)
and ``feed`` a drift detector's update over a fold's residuals.

The pure-Python/numpy path stays the reference: it is used when the extension did not
build or import, when ``COEFFD_PURE_FOLD=1`` is set (``use_native = False`` on a learner
for its fold and solves), and for what the compiled one hands back (the first chunk,
whose scale is a median; a row that overflows once squared; a system that is not
positive definite). The two agree within 1e-9 relative, not bit for bit: the compiled
fold sums its products and solves in its own order, BLAS and LAPACK in theirs
(``tests/learners/test_native_fold.py`` runs both on the same streams). A batch's
statistics (``features.rows._stats_tokens``) were tried and left out: reading ~8
requests' attributes from C was no faster than the loop.

>>> isinstance(AVAILABLE, bool) and (AVAILABLE or bool(UNAVAILABLE))
True
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["AVAILABLE", "UNAVAILABLE", "compare", "feed", "fold", "nnls", "refit", "solve"]

#: ``_fold.fold``, or None.
fold: Any = None
#: ``_fold.compare``, or None.
compare: Any = None
#: ``_fold.solve`` (a learner's total information and its Cholesky solve), or None.
solve: Any = None
#: ``_fold.nnls`` (:func:`learners.nnls.nnls_information` in C), or None.
nnls: Any = None
#: ``_fold.feed`` (a drift detector's update over a fold's residuals), or None.
feed: Any = None
#: ``_fold.refit`` (the batch refit's block and NNLS), or None.
refit: Any = None
#: Why the extension is not used ("" when it is).
UNAVAILABLE = ""

if os.environ.get("COEFFD_PURE_FOLD", "") not in ("", "0"):
    UNAVAILABLE = "COEFFD_PURE_FOLD is set"
else:
    try:
        from coeffd.learners import _fold  # type: ignore[attr-defined]

        fold, compare, solve, nnls = _fold.fold, _fold.compare, _fold.solve, _fold.nnls
        feed, refit = _fold.feed, _fold.refit
    except ImportError as e:  # not built (no compiler at install time) or another ABI
        UNAVAILABLE = f"compiled fold not importable: {e}"

AVAILABLE = fold is not None
