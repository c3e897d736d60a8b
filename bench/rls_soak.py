"""RLS soak: a million updates with a feature idle for a tenth of them.

``python -m bench rls_soak [--chunks 10] [--chunk 100000]``

Moved out of ``tests/learners/test_rls.py`` (15 s of the suite), which keeps the same
check at 10⁵ updates (``test_stable_with_a_feature_idle``: the idle phase there is still
50 forgetting memories long, enough for an unregularised covariance to wind up). Here,
over 10⁶ updates (feature ``c`` exactly zero for the sixth tenth), after every chunk:
the information matrix stays finite, symmetric and positive definite; the covariance
never exceeds the prior's (no wind-up); every coefficient is within 6 posterior standard
deviations of the truth (the idle one only relaxes, finite). Prints the per-update cost
(process CPU) for information; exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from coeffd.learners.rls import RLSRegressor

FEATS5 = ["a", "b", "c", "d", "e"]


def soak(chunks: int, chunk: int, seed: int = 4) -> list[str]:
    """Run the soak; returns the failed checks (empty: all held)."""
    rng = np.random.default_rng(seed)
    theta = np.array([1.0, 2.0, 3.0, 0.5, 4.0])
    prior = 1e-2
    m = RLSRegressor(
        FEATS5, forgetting=0.995, prior_precision=prior, weighting="relative", huber=3.0
    )
    idle = chunks // 2
    failed: list[str] = []
    for k in range(chunks):
        x = rng.uniform(0.5, 2.0, (chunk, 5))
        if k == idle:
            x[:, 2] = 0.0
        y = (x @ theta) * np.exp(rng.normal(-0.5 * 0.02**2, 0.02, chunk))
        m.learn_many(x, y)
        a, b = m.information()
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            failed.append(f"chunk {k}: information not finite")
            continue
        if not np.array_equal(a, a.T):
            failed.append(f"chunk {k}: information not symmetric")
        if np.linalg.eigvalsh(a).min() <= 0:
            failed.append(f"chunk {k}: information not positive definite")
        cov = np.linalg.inv(a)
        if not np.all(np.diag(cov) <= 1.0 / prior * (1 + 1e-9)):
            failed.append(f"chunk {k}: covariance above the prior's (wind-up)")
        ok = np.abs(m.coef - theta) < 6 * m.coef_std()
        if k == idle:
            ok = np.delete(ok, 2)
            if not np.isfinite(m.coef[2]):
                failed.append(f"chunk {k}: idle coefficient not finite")
        if not np.all(ok):
            failed.append(f"chunk {k}: coefficient beyond 6 standard deviations")
    if m.n_learned != chunks * chunk:
        failed.append(f"learned {m.n_learned} of {chunks * chunk}")
    return failed


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench rls_soak", description=__doc__)
    p.add_argument("--chunks", type=int, default=10)
    p.add_argument("--chunk", type=int, default=100_000)
    args = p.parse_args(argv)
    t0 = time.process_time()
    failed = soak(args.chunks, args.chunk)
    cpu = time.process_time() - t0
    n = args.chunks * args.chunk
    print(f"rls soak: {n:,} updates, {1e6 * cpu / n:.2f} us/update (process CPU)")
    for f in failed:
        print("FAIL", f)
    print("all checks held" if not failed else f"{len(failed)} checks failed")
    return 1 if failed else 0
