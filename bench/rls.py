"""Cost of one RLS update at d = 11, against River's BayesianLinearRegression, same run.

``python -m bench rls [--n 20000] [--repeat 3]``

Both estimators see the same stream. River's ``BayesianLinearRegression(alpha, beta,
smoothing=λ)`` is exponentially weighted RLS with a decaying prior of precision
``1/(α(1−λ)β)`` and mean 0 (see ``tests/learners/test_rls.py``), so ours is configured
the same way (``forget_prior=True``, plain weights, no Huber) and the coefficients must
agree to 1e-8 relative (before any non-negative projection). Reported: µs per update
(best of ``--repeat``), the speed ratio, the agreement, and — for information — the cost
of the production configuration (relative weights, Huber, ADWIN) and of a full
prequential step (predict the published non-negative vector, then learn).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import structlog

from coeffd.learners.config import LearnersConfig
from coeffd.learners.drift import DriftMonitor
from coeffd.learners.rls import RLSRegressor

D = 11


def _best(fn: Callable[[], None], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench rls", description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--forgetting", type=float, default=0.99)
    args = ap.parse_args(argv)
    from river import linear_model

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    n, lam, repeat = args.n, args.forgetting, args.repeat
    alpha, beta = 1.0, 1.0
    rng = np.random.default_rng(0)
    names = [f"x{i}" for i in range(D)]
    x = rng.uniform(0.1, 2.0, (n, D))
    y = x @ rng.uniform(0, 3, D) + rng.normal(0, 0.1, n)
    rows = [dict(zip(names, r, strict=True)) for r in x.tolist()]
    ys = y.tolist()
    prec = 1.0 / (alpha * (1 - lam) * beta)

    def ours_factory() -> RLSRegressor:
        return RLSRegressor(names, forgetting=lam, prior_precision=prec, forget_prior=True)

    state: dict[str, object] = {}

    def run_ours() -> None:
        m = ours_factory()
        for r, t in zip(rows, ys, strict=True):
            m.learn_one(r, t)
        _ = m.coef  # include the final fold/solve
        state["ours"] = m

    def run_ours_many() -> None:
        m = ours_factory()
        m.learn_many(x, y)
        _ = m.coef
        state["many"] = m

    def run_river() -> None:
        m = linear_model.BayesianLinearRegression(alpha=alpha, beta=beta, smoothing=lam)
        for r, t in zip(rows, ys, strict=True):
            m.learn_one(r, t)
        m.predict_one(rows[0])
        state["river"] = m

    cfg = LearnersConfig()

    def run_production() -> None:
        m = RLSRegressor(
            names,
            forgetting=cfg.forgetting,
            prior_precision=1e-2,
            weighting=cfg.weighting,
            huber=cfg.huber,
            drift=DriftMonitor(),
        )
        for r, t in zip(rows, ys, strict=True):
            m.learn_one(r, t)
        _ = m.coef

    def run_prequential() -> None:
        m = RLSRegressor(
            names,
            forgetting=cfg.forgetting,
            prior_precision=1e-2,
            weighting=cfg.weighting,
            huber=cfg.huber,
        )
        for r, t in zip(rows, ys, strict=True):
            m.predict_one(r)
            m.learn_one(r, t)

    t_ours = _best(run_ours, repeat) / n * 1e6
    t_many = _best(run_ours_many, repeat) / n * 1e6
    t_river = _best(run_river, repeat) / n * 1e6
    t_prod = _best(run_production, repeat) / n * 1e6
    t_preq = _best(run_prequential, 1) / n * 1e6

    river = state["river"]
    ours = state["ours"]
    many = state["many"]
    assert isinstance(ours, RLSRegressor) and isinstance(many, RLSRegressor)
    river._ensure_m()  # type: ignore[attr-defined]
    ref = np.array([river._m_arr[river._idx[f]] for f in names])  # type: ignore[attr-defined]
    agree = float(np.max(np.abs(ours.coef - ref) / np.abs(ref)))
    agree_many = float(np.max(np.abs(many.coef - ref) / np.abs(ref)))

    print(f"RLS update cost, d = {D}, n = {n}, λ = {lam}, best of {repeat}")
    print(
        f"  River BayesianLinearRegression(smoothing=λ).learn_one : {t_river:8.2f} µs/update (baseline)"
    )
    print(
        f"  RLSRegressor.learn_one (dict rows)                     : {t_ours:8.2f} µs/update  ({t_river / t_ours:.1f}× faster)"
    )
    print(
        f"  RLSRegressor.learn_many (array)                        : {t_many:8.2f} µs/update  ({t_river / t_many:.1f}× faster)"
    )
    print(
        f"  production learn_one (relative, Huber, ADWIN)          : {t_prod:8.2f} µs/update  (info)"
    )
    print(
        f"  prequential predict_one + learn_one (relative, Huber)  : {t_preq:8.2f} µs/obs     (info)"
    )
    print(
        f"  max relative coefficient difference vs River: learn_one {agree:.2e}, learn_many {agree_many:.2e}"
    )
    checks = [
        ("learn_one ≤ 5 µs/update", t_ours <= 5.0),
        ("≥ 3× faster than River", t_river / t_ours >= 3.0),
        ("agreement ≤ 1e-8 relative", max(agree, agree_many) <= 1e-8),
    ]
    for name, ok in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
