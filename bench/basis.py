"""``python -m bench basis``: cost of the BLIS basis per step observation.

Measures, in one run, the bit-exact path (:meth:`BlisBasis.terms`, the baseline) against the
streaming paths the learners use: the linear fast path on per-request batches
(:meth:`BlisBasis.fast_terms` / :func:`step_features`), the BATCH_SUMMARY approximation
(:meth:`BlisBasis.terms_from_aggregates`) and the vectorised :meth:`BlisBasis.terms_many`.
Figures are µs per observation and ratios to the baseline measured in the same run; the
target for the streaming path is ≤ 5 µs per observation.

It also reports the error of the aggregate approximation against the exact terms on
realistic vLLM-like batches (decode-only, mixed with a 2048-token chunked-prefill budget,
prefill-only), as the relative error of the step time ``S`` under BLIS's bundled β.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence

import numpy as np

from coeffd.learners.features.basis import BLIS_DEFAULT_BETA, BlisBasis, batch_stats
from coeffd.learners.features.catalog import load_model
from coeffd.learners.features.hardware import load_hardware
from coeffd.learners.features.observe import aggregates_from_requests, step_features
from coeffd.records.events import Source
from coeffd.records.observations import (
    BatchRequest,
    Composition,
    PeriodMethod,
    StepObservation,
)

__all__ = ["main", "realistic_batch"]


def realistic_batch(rng: random.Random, kind: str, budget: int = 2048) -> list[BatchRequest]:
    """A vLLM-like scheduled batch: ``decode``, ``mixed`` (chunked prefill) or ``prefill``."""
    reqs: list[BatchRequest] = []
    n_dec = rng.randint(1, 128) if kind != "prefill" else 0
    for _ in range(n_dec):
        i, g = rng.randint(50, 4000), rng.randint(1, 1000)
        reqs.append(BatchRequest(i, i + g - 1, 1, g + rng.randint(1, 200)))
    left = budget - n_dec
    while kind != "decode" and left > 0:
        i = rng.randint(50, 8000)
        p = rng.choice([0, 0, 0, rng.randint(0, i - 1)])
        t = min(i - p, left)
        reqs.append(BatchRequest(i, p, t, 100))
        left -= t
        if rng.random() < 0.5:
            break
    return reqs


_SRC = Source(id="bench", attributes=())


def _obs(batch: list[BatchRequest], composition: Composition) -> StepObservation:
    return StepObservation(
        source=_SRC,
        step=0,
        start_mono_ns=0,
        period_us=0.0,
        period_method=PeriodMethod.CONSECUTIVE_SUMMARIES,
        period_uncertainty_us=0.0,
        scheduler_duration_us=0,
        composition=composition,
        requests=tuple(batch) if composition is not Composition.AGGREGATES else (),
        aggregates=aggregates_from_requests(batch),
        async_scheduling=False,
    )


def _per_call_us(fn: Callable[[], object], n: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def _bench_config(basis: BlisBasis, batches: list[list[BatchRequest]], n: int) -> None:
    snaps = [_obs(b, Composition.SNAPSHOTS) for b in batches]
    aggs = [_obs(b, Composition.AGGREGATES) for b in batches]
    k = len(batches)
    idx = iter(range(10**12))

    def cyc() -> int:
        return next(idx) % k

    mean_req = sum(len(b) for b in batches) / k
    base = _per_call_us(lambda: basis.terms(batches[cyc()]), n)
    rows = [
        ("exact terms(requests) [baseline]", base),
        ("fast_terms(requests)", _per_call_us(lambda: basis.fast_terms(batches[cyc()]), n)),
        (
            "step_features(SNAPSHOTS obs)",
            _per_call_us(lambda: step_features(snaps[cyc()], basis), n),
        ),
        (
            "terms_from_aggregates(agg)",
            _per_call_us(lambda: basis.terms_from_aggregates(aggs[cyc()].aggregates), n),
        ),
        (
            "step_features(AGGREGATES obs)",
            _per_call_us(lambda: step_features(aggs[cyc()], basis), n),
        ),
    ]
    stats = np.stack([batch_stats(b) for b in batches])
    many = _per_call_us(lambda: basis.terms_many(stats), max(1, n // k)) / k
    rows.append((f"terms_many(stats) per row ({k} rows)", many))
    print(f"\n{basis!r}  (mean {mean_req:.1f} requests per batch)")
    print(f"  {'path':44s} {'us/obs':>9s} {'vs baseline':>12s}")
    for name, us in rows:
        print(f"  {name:44s} {us:9.2f} {us / base:11.3f}x")


def _aggregate_error(basis: BlisBasis, rng: random.Random, n: int) -> None:
    beta = np.array(BLIS_DEFAULT_BETA)
    print(f"\naggregate approximation error, {basis!r}, {n} batches per kind")
    print(
        f"  {'batch kind':10s} {'S mean':>8s} {'S p95':>8s} {'S max':>8s} {'T_pf_compute mean':>18s}"
    )
    for kind in ("decode", "mixed", "prefill"):
        s_err, pf_err = [], []
        for _ in range(n):
            b = realistic_batch(rng, kind)
            ex = basis.terms(b)
            ap = basis.terms_from_aggregates(aggregates_from_requests(b))
            s_err.append(abs(float(beta @ ap) - float(beta @ ex)) / float(beta @ ex))
            if ex[0] > 0:
                pf_err.append(abs(ap[0] - ex[0]) / ex[0])
        pf = f"{np.mean(pf_err) * 100:17.2f}%" if pf_err else f"{'-':>18s}"
        print(
            f"  {kind:10s} {np.mean(s_err) * 100:7.2f}% {np.percentile(s_err, 95) * 100:7.2f}% "
            f"{np.max(s_err) * 100:7.2f}% {pf}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; ``--quick`` for a short smoke run."""
    ap = argparse.ArgumentParser(prog="python -m bench basis", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(list(argv) if argv is not None else None)
    n = 300 if args.quick else 5000
    rng = random.Random(args.seed)
    h100 = load_hardware("H100")
    configs = [
        BlisBasis(load_model("llama-3.1-8b-instruct"), h100, 1),
        BlisBasis(load_model("mixtral-8x7b-v0.1"), h100, 2, 2, "deepep_low_latency"),
    ]
    print("coeffd bench basis: cost per step observation (best of 5 runs)")
    for basis in configs:
        for kind in ("decode", "mixed"):
            batches = [realistic_batch(rng, kind) for _ in range(64)]
            print(f"\n-- {kind} batches")
            _bench_config(basis, batches, n)
    for basis in configs:
        _aggregate_error(basis, rng, 100 if args.quick else 1000)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
