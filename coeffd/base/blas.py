"""The process' BLAS/OpenMP thread pools, limited while a daemon runs.

numpy's BLAS (OpenBLAS in the wheels) starts one thread per core for every matrix
product and inverse. On a machine whose cores are busy (a vLLM pod's 2 cores), those
threads wait on each other: the fleet model's refit (small inverses, many of them) ran
~20× slower than single-threaded. :func:`limit_blas_threads` caps every pool the
process has loaded.

Why threadpoolctl rather than ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS``: those
variables are read once, when the library loads, so they would have to be set before
anything imports numpy (the CLI, the tests, an embedding program all import it first)
and they differ per library (OpenBLAS, MKL, BLIS, OpenMP). threadpoolctl calls each
loaded library's own ``set_num_threads`` at run time, covers all of them, and restores
the previous sizes when the daemon stops, so an embedding process gets its pools back.

>>> release = limit_blas_threads(1)
>>> blas_threads() <= {1}
True
>>> release()
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy  # noqa: F401  (loads the BLAS it bundles, so that there is a pool to limit)
from threadpoolctl import threadpool_info, threadpool_limits

__all__ = ["blas_threads", "limit_blas_threads"]

_lock = threading.Lock()
_holders = 0
_limiter: Any = None  # threadpoolctl's ThreadpoolLimiter of the first holder


def limit_blas_threads(threads: int) -> Callable[[], None]:
    """Cap every loaded BLAS/OpenMP pool at ``threads``; return the release function.

    ``threads = 0`` leaves the libraries' own sizes (release does nothing). Several
    holders (apps in one test process) may overlap: each applies its limit, and the
    sizes found before the first are restored when the last one releases.
    """
    if threads <= 0:
        return _nothing
    global _holders, _limiter
    with _lock:
        if _holders == 0:
            _limiter = threadpool_limits(limits=threads)
        else:
            threadpool_limits(limits=threads)
        _holders += 1
    released = False  # read and set under _lock only

    def release() -> None:
        global _holders, _limiter
        nonlocal released
        with _lock:
            if released:
                return
            released = True
            _holders -= 1
            if _holders == 0 and _limiter is not None:
                _limiter.restore_original_limits()
                _limiter = None

    return release


def blas_threads() -> set[int]:
    """The thread counts of the loaded BLAS pools (``{1}`` under a limit of 1)."""
    return {int(p["num_threads"]) for p in threadpool_info() if p["user_api"] == "blas"}


def _nothing() -> None:
    return None
