"""The fleet refit with numpy's BLAS limited to one thread vs the library's default.

``python -m bench blas [--duration 30] [--rounds 7] [--busy 1]``

The daemon limits the BLAS/OpenMP pools to ``pipeline.blas_threads`` (1) while it runs
(:mod:`coeffd.base.blas`): with one thread per core, on a machine whose cores are busy
(coeffd beside vLLM on 2 cores), the fleet refit's many small inverses ran ~20× slower.
This learns simfleet's ``fleet-shared`` fleet (12 configurations, as ``bench fleet``),
then times the daemon's refit (``FleetPublisher.refit``: the model from the registry and
its LOCO result) alternately under ``threadpool_limits(1)`` and with the pools as the
library sized them, while ``--busy`` processes spin on the cores (vLLM's busy loop; 0 =
only what else runs on the machine). Wall time, the median of each, and their ratio from
the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Sequence

import structlog
from threadpoolctl import threadpool_limits

from bench.fleet import learn
from coeffd.base.blas import blas_threads
from coeffd.daemon.fleet import FleetPublisher


def _spin() -> None:  # a core kept busy, as vLLM's engine loop keeps one
    while True:
        pass


def _refit_seconds(publisher: FleetPublisher, limit: int | None) -> float:
    with threadpool_limits(limits=limit):
        t0 = time.perf_counter()
        publisher.refit()
        return time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench blas", description=__doc__)
    p.add_argument("--duration", type=float, default=30.0, help="simulated learning seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7, help="refits of each kind, alternated")
    p.add_argument("--busy", type=int, default=1, help="processes spinning meanwhile")
    a = p.parse_args(list(argv or []))
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    learned = learn(a.duration, a.seed, 0.25)
    publisher = FleetPublisher(learned.registry)
    default = sorted(blas_threads())
    publisher.refit()  # warm-up: imports, caches
    spinners = [mp.Process(target=_spin, daemon=True) for _ in range(a.busy)]
    for s in spinners:
        s.start()
    one: list[float] = []
    lib: list[float] = []
    try:
        for _ in range(a.rounds):
            one.append(_refit_seconds(publisher, 1))
            lib.append(_refit_seconds(publisher, None))
    finally:
        for s in spinners:
            s.terminate()
            s.join()
    m1, md = statistics.median(one), statistics.median(lib)
    print(
        f"fleet refit over {len(publisher.model or ())} configurations, {a.rounds} rounds each, "
        f"{a.busy} busy process(es) on {os.cpu_count()} cores "
        f"(load average {os.getloadavg()[0]:.1f} after)"
    )
    print(f"  BLAS 1 thread (the daemon's default): median {m1 * 1e3:9.1f} ms")
    print(f"  BLAS default {default} thread(s):     median {md * 1e3:9.1f} ms")
    print(f"  default / 1 thread = {md / m1:.2f}×")
    return 0
