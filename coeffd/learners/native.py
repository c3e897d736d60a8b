"""The compiled fold (``_fold.c``), when it is built and not switched off.

``_fold.fold`` does one fold of an :class:`~learners.rls.RLSRegressor` — the chunk's
robust weights, residual scale and drift residuals, and the rank-m update of its
information ``(A, b)`` — in C: at d = 11 and 16 rows the arithmetic is a few µs, the ~25
numpy calls and per-row Python loops of the pure path several times that, and the
learning consumer folds three learners per 16 step observations (issue 34). The
pure-Python/numpy fold stays the reference: it is used when the extension did not build
or import, when ``COEFFD_PURE_FOLD=1`` is set, and for the rare folds the compiled one
hands back (the first chunk, whose scale is a median; a row that overflows once
squared). The steady pair's per-row error comparison is there too, ``compare`` (the
arithmetic of :meth:`learners.steady.SteadyEstimator._compare_rows`: ~2 µs for 16 rows
instead of ~10). A batch's statistics (``features.rows._stats_tokens``) were tried
and left out: reading ~8 requests' attributes from C was no faster than the loop.
``tests/learners/test_native_fold.py`` runs both paths on the same streams.

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
