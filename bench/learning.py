"""Learning accuracy vs the noise floor and vs baselines measured in the same run.

``python -m bench learning [--quick] [--sigma 0.03] [--seeds 3]``

Streams come from `tests/support/synthetic_steps.py` (real :class:`BlisBasis` terms, known true β,
log-normal noise with mean 1, 0.3 % stalls ×2–6). The *noise floor* is the MAPE of the
true coefficients on the same observations; every error below is a ratio to it, computed
on the same rows. Everything is prequential (predict, then learn). The learner is the
production configuration (``LearnersConfig()`` defaults: λ = 0.989, relative weights,
Huber 3, ADWIN drift with covariance inflation); the published (non-negative) vector is
what is scored. Baselines on the same stream: BLIS's shipped β, and a windowed NNLS batch
refit for several (window, refit cadence) pairs, the best of which is reported.

``--scenario contention`` (also in ``all``; issue 32): the real pipeline (simfleet → OTLP
decode → joiner → registry) on a dense and a MoE engine, learned unshed and with the load
controller holding the keep ratio at 30 % (shed summaries decoded partially, segments and
requests shed by identity); the published step time and α0 vs simfleet's truth, beside
random subsamples of the unshed observations at the same shares, over several seeds; every
step sampled for 600 s by default, so that the runs hold several of the published
estimates' memories (they forget per observation).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from coeffd.learners.config import LearnersConfig
from coeffd.learners.drift import DriftMonitor
from coeffd.learners.evaluation import WindowedRefit
from coeffd.learners.features import (
    BLIS_DEFAULT_BETA,
    TERM_NAMES,
    BlisBasis,
    load_hardware,
    load_model,
)
from coeffd.learners.prior import PooledPrior, prior_precision
from coeffd.learners.rls import RLSRegressor
from coeffd.learners.steady import SteadyEstimator
from tests.support.synthetic_steps import TRUE_BETA, SyntheticSteps, synth_steps

FloatArray = npt.NDArray[np.float64]

REFIT_GRID: tuple[tuple[int, int], ...] = (
    (200, 25),
    (500, 50),
    (1000, 100),
    (2000, 100),
)


def make_learner(
    cfg: LearnersConfig,
    prior_mean: Sequence[float] | FloatArray = BLIS_DEFAULT_BETA,
    precision: FloatArray | None = None,
    drift: bool = True,
) -> RLSRegressor:
    d = cfg.drift
    mon = (
        DriftMonitor(d.detector, d.params, d.grace, d.keep, d.fast_forgetting, d.fast_for)
        if drift and d.enabled
        else None
    )
    prec = (
        prior_precision(prior_mean, cfg.prior_strength, cfg.prior_scale_floor)
        if precision is None
        else precision
    )
    return RLSRegressor(
        TERM_NAMES,
        forgetting=cfg.forgetting,
        prior_mean=list(prior_mean),
        prior_precision=prec,
        weighting=cfg.weighting,
        huber=cfg.huber,
        scale_memory=cfg.scale_memory,
        refresh_every=cfg.refresh_every,
        drift=mon,
    )


def make_published(cfg: LearnersConfig, drift: bool = True) -> RLSRegressor | SteadyEstimator:
    """The β estimator the daemon publishes: with ``cfg.steady`` the fast tracker plus the
    long-memory learner (:mod:`learners.steady`), as ``LearnerSet`` builds it."""
    fast = make_learner(cfg, drift=drift)
    if not cfg.steady:
        return fast
    slow = make_learner(cfg.model_copy(update={"forgetting": cfg.steady_forgetting}), drift=drift)
    d = cfg.drift
    return SteadyEstimator(
        fast, slow, keep=d.keep, fast_forgetting=d.fast_forgetting, fast_for=d.fast_for
    )


def prequential(m: RLSRegressor | SteadyEstimator, s: SyntheticSteps) -> FloatArray:
    """Predictions of the published (non-negative) vector, each made before learning its row."""
    pred = np.empty(len(s.y))
    if isinstance(m, SteadyEstimator):
        for i in range(len(s.y)):
            pred[i] = m.learn_row_scored(s.x[i], float(s.y[i]))
        return pred
    for i in range(len(s.y)):
        pred[i] = s.x[i] @ m.nonnegative_coef()
        m.learn_many(s.x[i : i + 1], s.y[i : i + 1])
    return pred


def _fast(m: RLSRegressor | SteadyEstimator) -> RLSRegressor:
    """The learner that carries the drift detector (the fast tracker)."""
    return m.fast if isinstance(m, SteadyEstimator) else m


def _published(m: RLSRegressor | SteadyEstimator) -> RLSRegressor:
    return m.published if isinstance(m, SteadyEstimator) else m


def refit_predictions(s: SyntheticSteps, window: int, every: int) -> FloatArray:
    b = WindowedRefit(window, every, len(TERM_NAMES), initial=BLIS_DEFAULT_BETA)
    pred = np.empty(len(s.y))
    for i in range(len(s.y)):
        pred[i] = b.predict_row(s.x[i])
        b.learn_row(s.x[i], float(s.y[i]))
    return pred


def ape(y: FloatArray, p: FloatArray) -> FloatArray:
    return np.abs(y - p) / np.abs(y)  # type: ignore[no-any-return]


@dataclass
class Check:
    name: str
    value: float
    target: str
    ok: bool

    def line(self) -> str:
        tag = "INFO" if self.target.startswith("(info") else ("PASS" if self.ok else "FAIL")
        return f"  [{tag}] {self.name}: {self.value:.4g} (target {self.target})"


def _basis(model: str = "llama-3.1-8b-instruct", gpu: str = "H100", tp: int = 1) -> BlisBasis:
    return BlisBasis(load_model(model), load_hardware(gpu), tp=tp)


# ---------------------------------------------------------------------------- scenarios


def steady(cfg: LearnersConfig, seeds: int, n: int, sigma: float) -> list[Check]:
    print(f"\n== steady: llama-3.1-8b / H100 / tp1, n={n}, σ={sigma}, seeds={seeds}")
    basis = _basis()
    rows = []
    rel_err_ident: list[float] = []
    for seed in range(seeds):
        s = synth_steps(basis, TRUE_BETA, n, seed=seed, sigma=sigma)
        m = make_published(cfg)
        t0 = time.perf_counter()
        p = prequential(m, s)
        dt = time.perf_counter() - t0
        sl = slice(500, n)
        floor = ape(s.y, s.mean)[sl].mean()
        learned = ape(s.y, p)[sl].mean() / floor
        default = ape(s.y, s.x @ np.asarray(BLIS_DEFAULT_BETA))[sl].mean() / floor
        refits = {
            (w, e): ape(s.y, refit_predictions(s, w, e))[sl].mean() / floor for w, e in REFIT_GRID
        }
        best = min(refits, key=lambda k: refits[k])
        first50 = ape(s.y, p)[50:100].mean() / ape(s.y, s.mean)[50:100].mean()
        ident = _published(m).identified(cfg.identify_threshold, max_rel_std=0.025)
        coef = _published(m).nonnegative_coef()
        rel = np.abs(coef / np.asarray(TRUE_BETA) - 1)
        rel_err_ident.extend(rel[ident].tolist())
        rows.append((learned, default, refits[best], best, first50))
        print(
            f"  seed {seed}: MAPE/floor after 500 obs: learned {learned:.4f}  "
            f"blis_default {default:.3f}  batch_refit best {refits[best]:.4f} {best}  "
            f"(obs 50–100: {first50:.3f}; floor {floor:.4f}; {dt / n * 1e6:.0f} µs/obs)"
        )
        print(
            "    identified terms: "
            + ", ".join(
                f"{TERM_NAMES[i]} {coef[i]:.4g} (truth {TRUE_BETA[i]:.4g}, {rel[i] * 100:+.2f}%)"
                for i in np.flatnonzero(ident)
            )
        )
        print(
            "    not identified (prior/collinear): "
            + ", ".join(
                f"{TERM_NAMES[i]} {coef[i]:.3g}/{TRUE_BETA[i]:.3g}" for i in np.flatnonzero(~ident)
            )
        )
    learned_all = float(np.mean([r[0] for r in rows]))
    max_rel = max(rel_err_ident) if rel_err_ident else float("nan")
    return [
        Check(
            "steady MAPE / floor after 500 obs (mean of seeds)",
            learned_all,
            "≤ 1.03",
            learned_all <= 1.03,
        ),
        Check("max |β − truth|/truth on identified terms", max_rel, "≤ 0.05", max_rel <= 0.05),
    ]


def recovery(cfg: LearnersConfig, n: int = 40_000, sigma: float = 0.03) -> None:
    """Long stationary stream without forgetting: which terms one configuration can pin down."""
    print(f"\n== recovery without forgetting (λ = 1, n = {n}): per-term error and learner's σ")
    s = synth_steps(_basis(), TRUE_BETA, n, seed=11, sigma=sigma)
    m = make_learner(cfg.model_copy(update={"forgetting": 1.0}), drift=False)
    m.learn_many(s.x, s.y)
    coef, std = m.nonnegative_coef(), m.coef_std()
    for i, name in enumerate(TERM_NAMES):
        print(
            f"  {name:15s} {coef[i]:10.4g} truth {TRUE_BETA[i]:8.4g} err {(coef[i] / TRUE_BETA[i] - 1) * 100:+7.2f}%"
            f"  σ/θ {std[i] / max(abs(coef[i]), 1e-12):.3f}"
        )


def _drift_streams(n: int, sigma: float, seed: int) -> dict[str, SyntheticSteps]:
    basis = _basis()
    truth = np.asarray(TRUE_BETA)
    after = truth.copy()
    after[[0, 2, 9]] *= (1.3, 1.1, 1.25)
    out = {
        "abrupt": synth_steps(
            basis, truth, n, seed=seed, sigma=sigma, change_at=n // 2, beta_after=after
        )
    }
    # Several abrupt changes: every n/4 rows a new β (±30 % on the big terms).
    s = synth_steps(basis, truth, n, seed=seed + 100, sigma=sigma)
    rng = np.random.default_rng(seed)
    b = np.tile(truth, (n, 1))
    for k in range(1, 4):
        nb = truth * np.exp(rng.normal(0, 0.2, truth.shape))
        b[k * n // 4 :] = nb
    out["multi"] = _rebuild(s, b, sigma, seed)
    # Gradual: the compute and KV efficiencies ramp by +50 % over the stream.
    g = np.tile(truth, (n, 1))
    ramp = np.linspace(0, 0.5, n)
    g[:, 0] *= 1 + ramp
    g[:, 9] *= 1 + ramp
    g[:, 2] *= 1 + ramp / 2
    out["gradual"] = _rebuild(
        synth_steps(basis, truth, n, seed=seed + 200, sigma=sigma), g, sigma, seed
    )
    return out


def _rebuild(s: SyntheticSteps, b: FloatArray, sigma: float, seed: int) -> SyntheticSteps:
    """Same batches, new per-row true β (noise redrawn with the generator's recipe)."""
    rng = np.random.default_rng(seed + 7)
    mean = np.einsum("ij,ij->i", s.x, b)
    n = len(mean)
    noise = np.exp(rng.normal(-0.5 * sigma * sigma, sigma, n))
    stall = np.where(rng.random(n) < 0.003, rng.uniform(2, 6, n), 1.0)
    return SyntheticSteps(s.x, mean * noise * stall, mean, s.regime, s.kv_usage, b, s.stats)


def drift(cfg: LearnersConfig, seeds: int, n: int, sigma: float) -> list[Check]:
    print(
        f"\n== drift scenarios: n={n}, σ={sigma}, seeds={seeds}; batch refit grid {list(REFIT_GRID)}"
    )
    recov: list[int] = []
    ratio_raw: dict[str, list[float]] = {}
    ratio_excess: dict[str, list[float]] = {}
    false_alarms = 0
    false_switches = 0  # published estimate switched to tracking on a stationary stream
    for seed in range(seeds):
        stationary = synth_steps(_basis(), TRUE_BETA, n, seed=seed + 300, sigma=sigma)
        m0 = make_published(cfg)
        prequential(m0, stationary)
        assert _fast(m0).drift is not None
        false_alarms += _fast(m0).drift.detections  # type: ignore[union-attr]
        if isinstance(m0, SteadyEstimator):
            false_switches += m0.switches
        for name, s in _drift_streams(n, sigma, seed).items():
            m = make_published(cfg)
            p = prequential(m, s)
            sl = slice(200, n)
            e_true = ape(s.y, s.mean)
            e_l = ape(s.y, p)
            refit_p = {k: refit_predictions(s, *k) for k in REFIT_GRID}
            refit = {k: ape(s.y, v) for k, v in refit_p.items()}
            # "Mean error" = error of the prediction against the true (noiseless) step time:
            # the part a learner can remove. Raw MAPE vs the noisy y is reported beside it.
            t_l = ape(s.mean, p)[sl].mean()
            t_r = {k: ape(s.mean, v)[sl].mean() for k, v in refit_p.items()}
            best = min(t_r, key=lambda k: t_r[k])
            floor = e_true[sl].mean()
            raw = e_l[sl].mean() / refit[best][sl].mean()
            exc = t_l / t_r[best]
            ratio_raw.setdefault(name, []).append(raw)
            ratio_excess.setdefault(name, []).append(exc)
            extra = ""
            if name == "abrupt":
                c = n // 2
                k_rec = -1
                for k in range(0, n - c - 200, 10):
                    w = slice(c + k, c + k + 200)
                    if e_l[w].mean() <= 1.10 * e_true[w].mean():
                        k_rec = k
                        break
                recov.append(k_rec if k_rec >= 0 else n)
                mon = _fast(m).drift
                hist = [h["n"] - c for h in mon.history] if mon else []
                extra = f" recovery to ≤1.10×floor (200-row window) after {k_rec} obs; alarms at change+{hist}"
            print(
                f"  seed {seed} {name:8s}: MAPE learned {e_l[sl].mean():.4f}  best refit {refit[best][sl].mean():.4f} "
                f"{best}  floor {floor:.4f}  blis_default {ape(s.y, s.x @ np.asarray(BLIS_DEFAULT_BETA))[sl].mean():.3f}"
                f"  MAPE learned/refit {raw:.3f}; error vs truth learned {t_l:.4f} refit {t_r[best]:.4f} ratio {exc:.3f}{extra}"
            )
    checks = [
        Check("false drift alarms on stationary streams", false_alarms, "0", false_alarms == 0),
        Check(
            "published estimate left steady on stationary streams",
            false_switches,
            "0",
            false_switches == 0,
        ),
        Check(
            "abrupt drift: obs to ≤ 1.10× floor (worst seed)",
            max(recov),
            "≤ 300",
            max(recov) <= 300,
        ),
    ]
    for name in ratio_raw:
        r = float(np.mean(ratio_raw[name]))
        x = float(np.mean(ratio_excess[name]))
        checks.append(
            Check(
                f"{name}: mean error vs truth, learned / best batch refit", x, "≤ 0.75", x <= 0.75
            )
        )
        checks.append(
            Check(
                f"{name}: MAPE vs measured, learned / best batch refit",
                r,
                "(info, floor-bound)",
                r <= 0.75,
            )
        )
    return checks


FLEET: tuple[tuple[str, str, int], ...] = (
    ("llama-3.1-8b-instruct", "H100", 1),
    ("llama-3.1-8b-instruct", "A100-80", 1),
    ("qwen2.5-7b-instruct", "H100", 1),
    ("mistral-nemo-instruct-2407", "H100", 1),
    ("qwen3-14b", "H100", 2),
    ("llama-3.1-70b-instruct", "H100", 4),
    ("yi-34b", "H100", 2),
    ("llama-3.1-8b-instruct", "H100", 2),
)
GPU_FACTOR = {"H100": 1.0, "A100-80": 1.15}


def _fleet_truth(model: str, gpu: str, tp: int) -> FloatArray:
    """Shared physics with per-configuration deviations (deterministic per configuration)."""
    seed = abs(hash((model, gpu, tp))) % (2**32)
    rng = np.random.default_rng(seed)
    t = np.asarray(TRUE_BETA) * GPU_FACTOR[gpu] * np.exp(rng.normal(0, 0.05, len(TRUE_BETA)))
    return t  # type: ignore[no-any-return]


def coldstart(cfg: LearnersConfig, n_train: int, sigma: float) -> list[Check]:
    print(
        f"\n== cold start in a fleet: train {len(FLEET) - 1} configurations × {n_train} obs, hold one out"
    )
    worst = 0.0
    rows = []
    for held in range(len(FLEET)):
        pool = PooledPrior(BLIS_DEFAULT_BETA, cfg.prior_strength, cfg.prior_scale_floor)
        for j, (model, gpu, tp) in enumerate(FLEET):
            if j == held:
                continue
            s = synth_steps(
                _basis(model, gpu, tp), _fleet_truth(model, gpu, tp), n_train, seed=j, sigma=sigma
            )
            m = make_learner(cfg, drift=False)
            m.learn_many(s.x, s.y)
            pool.add(
                {"model": model, "gpu": gpu, "tp": tp},
                m.nonnegative_coef(),
                m.identified(cfg.identify_threshold, max_rel_std=0.05),
                m.n_effective,
            )
        model, gpu, tp = FLEET[held]
        est = pool.prior_for({"model": model, "gpu": gpu, "tp": tp})
        s = synth_steps(
            _basis(model, gpu, tp), _fleet_truth(model, gpu, tp), 200, seed=999, sigma=sigma
        )
        floor = ape(s.y, s.mean)
        pooled = ape(s.y, prequential(make_learner(cfg, est.mean, est.precision), s))
        default = ape(s.y, prequential(make_learner(cfg), s))
        w = slice(50, 150)
        r_p, r_d = pooled[w].mean() / floor[w].mean(), default[w].mean() / floor[w].mean()
        r_p0, r_d0 = pooled[:50].mean() / floor[:50].mean(), default[:50].mean() / floor[:50].mean()
        worst = max(worst, r_p)
        rows.append(r_p)
        print(
            f"  held out {model}/{gpu}/tp{tp}: MAPE/floor obs 50–150: pooled {r_p:.3f}  default prior {r_d:.3f}"
            f"   (obs 0–50: pooled {r_p0:.3f}, default {r_d0:.3f}; prior sources {len(est.sources)}, best sim {est.similarity:.2f})"
        )
    return [
        Check(
            "cold start: pooled prior MAPE/floor after 50 obs (worst held-out)",
            worst,
            "≤ 1.25",
            worst <= 1.25,
        )
    ]


def _truth_beta(conf: dict[str, object], t_s: float) -> FloatArray:
    """simfleet's true β at simulated time ``t_s`` (step or linear interpolation)."""
    co = conf["coefficients"]
    assert isinstance(co, dict)
    pts = co["points"]
    if co["interpolation"] == "linear" and len(pts) > 1:
        ts = [p["t_s"] for p in pts]
        return np.array(
            [np.interp(t_s, ts, [p["beta"][i] for p in pts]) for i in range(len(TERM_NAMES))]
        )
    cur = pts[0]
    for p in pts:
        if p["t_s"] <= t_s:
            cur = p
    return np.asarray(cur["beta"], dtype=float)


def simfleet_mode(cfg: LearnersConfig, scenario: str, duration: float, seed: int) -> list[Check]:
    """The real pipeline: simfleet → OTLP decode → joiner → registry, against simfleet's truth."""
    from coeffd.joiner import Joiner, JoinerConfig
    from coeffd.learners.features.config import ServingConfig
    from coeffd.learners.features.observe import step_features
    from coeffd.learners.registry import LearnerRegistry
    from coeffd.receivers.otlp.decode import Decoder, decode_request
    from coeffd.records.observations import StepObservation
    from coeffd.simfleet import SampleRates, run

    print(
        f"\n== simfleet {scenario}: {duration:.0f} simulated s, seed {seed} (OTLP decode → joiner → registry)"
    )
    dec = Decoder()
    batches: list[list[object]] = []

    def sink(req: object) -> None:
        batches.append(list(decode_request(req, dec).records))  # type: ignore[arg-type]

    t0 = time.perf_counter()
    res = run(
        scenario,
        duration,
        seed,
        trace_sinks=[sink],
        rates=SampleRates(journey=1.0, step=1.0, rich=0.2, closure_interval=100),
        drain_s=5.0,
    )
    t_sim = time.perf_counter() - t0
    confs = {c["config_id"]: c for c in res.truth["configurations"]}
    mono0 = res.truth["mono_start_ns"]
    joiner = Joiner(JoinerConfig())
    reg = LearnerRegistry(cfg)
    configs: dict[str, ServingConfig] = {}
    rows: dict[str, list[tuple[float, float, float, float, float]]] = {}
    t0 = time.perf_counter()

    def feed(obs_list: list[object]) -> None:
        for obs in obs_list:
            src = obs.source  # type: ignore[attr-defined]
            sc = configs.get(src.id)
            if sc is None:
                sc = configs[src.id] = ServingConfig.from_resource(src)
            scored = reg.learn(sc, obs)  # type: ignore[arg-type]
            if not isinstance(obs, StepObservation) or not scored or sc.id not in confs:
                continue
            ls = reg.get(sc.id)
            assert ls is not None and ls.basis is not None
            x = step_features(obs, ls.basis, block_size=sc.block_size)
            truth = float(x @ _truth_beta(confs[sc.id], (obs.start_mono_ns - mono0) / 1e9))
            p = scored[0].predictions
            rows.setdefault(sc.id, []).append(
                (scored[0].y, truth, p["learned"], p["blis_default"], p["batch_refit"])
            )

    for b in batches:
        feed(joiner.push_many(b))  # type: ignore[arg-type]
    feed(joiner.flush())  # type: ignore[arg-type]
    t_learn = time.perf_counter() - t0
    checks: list[Check] = []
    for cid, r in rows.items():
        a = np.asarray(r)
        y, truth = a[:, 0], a[:, 1]
        sl = slice(500, len(y))
        floor = ape(y, truth)[sl].mean()
        ratios = {
            k: ape(y, a[:, j])[sl].mean() / floor
            for j, k in ((2, "learned"), (3, "blis_default"), (4, "batch_refit(1000,100)"))
        }
        snap = reg.estimate(cid)
        reg.pool(snap)
        vb = snap.vectors["beta"]
        tb = _truth_beta(confs[cid], duration)
        ident = [
            i
            for i, ok in enumerate(vb.identified)
            if ok and vb.std[i] <= 0.025 * max(vb.values[i], 1e-12)
        ]
        errs = {TERM_NAMES[i]: vb.values[i] / tb[i] - 1 for i in ident if tb[i] > 0}
        print(
            f"  {cid} ({len(y)} step observations; simfleet {t_sim:.1f} s, pipeline {t_learn:.1f} s): "
            + "  ".join(f"{k} {v:.4f}" for k, v in ratios.items())
            + f"  (MAPE/floor after 500 obs; floor {floor:.4f})"
        )
        print(
            "    identified (σ/θ ≤ 2.5 %): "
            + (", ".join(f"{k} {v * 100:+.2f}%" for k, v in errs.items()) or "none")
        )
        print(
            "    all terms (value/truth, σ/θ): "
            + ", ".join(
                f"{TERM_NAMES[i]} {vb.values[i]:.3g}/{tb[i]:.3g} ({vb.std[i] / max(vb.values[i], 1e-12):.2f})"
                for i in range(len(TERM_NAMES))
            )
        )
        ta = confs[cid]["coefficients"]["points"][-1]["alpha"]
        print(
            f"    alpha learned {[round(v, 1) for v in snap.alpha]} truth {[round(v, 1) for v in ta]}"
        )
        changes = confs[cid]["coefficients"]["change_points_s"]
        alarms = [h["n"] for h in vb.drift_history]
        if changes:
            # With a change inside the scored range the steady target does not apply:
            # report it, the alarms, and the error once the transient has passed.
            tail = slice(len(y) * 3 // 4, len(y))
            r_tail = ape(y, a[:, 2])[tail].mean() / ape(y, truth)[tail].mean()
            print(
                f"    truth changes at {changes} s; drift alarms at observation {alarms}; "
                f"MAPE/floor over the last quarter {r_tail:.4f}"
            )
            checks.append(
                Check(
                    f"simfleet {scenario} MAPE/floor after 500 obs",
                    ratios["learned"],
                    "(info, includes the change)",
                    True,
                )
            )
            checks.append(
                Check(
                    f"simfleet {scenario} MAPE/floor, last quarter",
                    r_tail,
                    "≤ 1.10",
                    r_tail <= 1.10,
                )
            )
        else:
            checks.append(
                Check(
                    f"simfleet {scenario} MAPE/floor after 500 obs",
                    ratios["learned"],
                    "≤ 1.03",
                    ratios["learned"] <= 1.03,
                )
            )
        if errs:
            worst = max(abs(v) for v in errs.values())
            checks.append(
                Check(
                    f"simfleet {scenario} max β error on identified terms",
                    worst,
                    "≤ 0.05",
                    worst <= 0.05,
                )
            )
    return checks


#: ``contention``: the engines of the issue-32 check, each learned unshed and shed
NULL_DRAWS = 8  # random subsamples: the spread a shed estimate may show
Z_UNBIASED = 4.0  # further from their mean (in their SDs): shedding moved the estimate
CONTENTION: tuple[tuple[str, str, int], ...] = (
    ("llama-3.1-8b-instruct", "H100", 1),
    ("mixtral-8x7b-v0.1", "H100", 2),
)
#: The α0 checks' stream: α0 learns from requests alone, whose rows scatter by ~45 % of
#: α0 on Mixtral TP2 (arrival → QUEUED less the loop wait, known only in expectation over
#: a 28 ms iteration), so a run keeping n requests has a standard error of ~0.45/√n. The
#: dense 600 s stream keeps ~1,040 (1.4 %: the 2 % target would fail an unbiased shedder
#: in ~1 seed of 7; seed 4 gave −2.34 % with |z| 1.8 against random subsamples); 2,400 s
#: at 6 requests/s keeps ~4,300 (0.7 %). At vLLM's default step sampling, where users
#: run, which also keeps the longer stream cheap (~85 s per Mixtral seed).
ALPHA_STEP_RATE = 0.01


@dataclass
class ContentionFit:
    """What :func:`contention_learn` measured of one learned stream."""

    step_error: float  # the published β's mean |step time / truth − 1| over every batch run
    a0_error: float  # α0 vs the truth, relative
    steps: int  # step observations in the stream
    requests: int  # request observations learned
    summary_only: int  # step rows learned from BATCH_SUMMARY totals alone (approximate terms)


def contention_learn(
    sim: Any, observations: Sequence[Any], keep: Callable[[str], bool] | None = None
) -> ContentionFit:
    """Learn ``observations`` as the consumer does (requests ``keep`` rejects are not
    learned) and score the published β and α0 against simfleet's truth.

    ``summary_only`` is printed because those rows are the one known source of bias here:
    their decode context comes from KV blocks in use, which prefix-shared blocks make too
    low (Mixtral TP2, seed 4: 12 % low, the step time 1.0 % low on those rows), and the
    learner takes them whenever fewer than half of the steps come with their requests —
    which is what happens once requests outlive the joiner's window (a step's composition
    needs every request in it finished; Mixtral's 28 ms steps make the long generations
    outlive 30 s, and 58 % of its steps were summary-only against Llama's 5 %). Since the
    joiner holds such steps for their journeys (``joiner.composition_wait_s``) ~8 % stay
    summary-only, mostly steps whose requests the run's end cuts off, and the learner
    leaves them out."""
    from coeffd.learners.features.config import ServingConfig
    from coeffd.learners.features.observe import has_requests
    from coeffd.learners.registry import LearnerRegistry
    from coeffd.records.observations import RequestObservation, StepObservation

    point = sim.truth["configurations"][0]["coefficients"]["points"][0]
    reg = LearnerRegistry(LearnersConfig())
    sc = ServingConfig.from_resource(observations[0].source)
    n_steps = n_reqs = n_summary = 0
    for o in observations:
        if isinstance(o, RequestObservation):
            if keep is not None and not keep(o.request_id):
                continue
            n_reqs += 1
        if isinstance(o, StepObservation):
            n_steps += 1
            n_summary += not has_requests(o)
        reg.learn(sc, o)
    ls = reg.get(sc.id)
    assert ls is not None and ls.basis is not None
    snap = reg.estimate(sc.id)
    reg.pool(snap)
    x = np.array([ls.basis.fast_terms(st.blis) for st in sim.engines[0].steps if st.blis])
    rel = (x @ np.asarray(snap.beta)) / (x @ np.asarray(point["beta"])) - 1.0
    a0 = snap.alpha[0] / float(point["alpha"][0]) - 1.0
    return ContentionFit(
        float(np.abs(rel).mean()), a0, n_steps, n_reqs, n_summary - ls.approximate_skipped
    )


def contention_errors(
    sim: Any, observations: Sequence[Any], keep: Callable[[str], bool] | None = None
) -> tuple[float, float, int, int]:
    """:func:`contention_learn` as ``(step error, α0 error, step observations, request
    observations learned)``."""
    f = contention_learn(sim, observations, keep)
    return f.step_error, f.a0_error, f.steps, f.requests


def subsample_null(
    sim: Any, unshed: Sequence[Any], step_share: float, request_share: float, draws: int
) -> list[tuple[float, float]]:
    """(step error, α0 error) of ``draws`` random subsamples of the unshed observations
    at the shares shedding kept: what shedding that does not look at the content costs.
    Steps go by 128-step blocks (a shed segment runs between summaries, and its spans go
    with it), requests one by one."""
    from coeffd.records.observations import RequestObservation, StepObservation

    def u(salt: int, key: int) -> float:
        return zlib.crc32(f"{salt}:{key}".encode()) / 2**32

    out = []
    for salt in range(draws):
        sub = [
            o
            for o in unshed
            if (
                u(salt, o.step >> 7) < step_share
                if isinstance(o, StepObservation)
                else u(salt, zlib.crc32(o.request_id.encode())) < request_share
                if isinstance(o, RequestObservation)
                else True
            )
        ]
        e, a0, _, _ = contention_errors(sim, sub)
        out.append((e, a0))
    return out


@dataclass
class ContentionRun:
    """One engine, one seed: learned unshed and shed, and random subsamples."""

    e_unshed: float  # published step time vs the truth, mean |.|
    e_shed: float
    a0_unshed: float  # α0 vs the truth, relative
    a0_shed: float
    steps: tuple[int, int]  # step observations learned (unshed, shed)
    requests: tuple[int, int]
    null: list[tuple[float, float]]  # random subsamples at the shed shares
    summary_only: tuple[int, int] = (0, 0)  # step rows learned from totals alone

    @property
    def ratio(self) -> float:
        return self.e_shed / self.e_unshed if self.e_unshed > 0 else float("inf")

    @property
    def z(self) -> float:
        """How far the shed estimate lies from the random subsamples (max over step error
        and α0, in their SDs): shedding that moved the estimate shows here."""
        return max(
            abs(got - statistics.fmean(d)) / max(statistics.stdev(d), 1e-12)
            for got, d in (
                (self.e_shed, [n[0] for n in self.null]),
                (self.a0_shed, [n[1] for n in self.null]),
            )
        )


@dataclass
class AlphaRun:
    """One engine, one seed, on the α0 stream: learned unshed and shed."""

    a0_unshed: float  # α0 vs the truth, relative
    a0_shed: float
    requests: tuple[int, int]  # request observations learned (unshed, shed)


def alpha_run(model: str, gpu: str, tp: int, duration: float, seed: int, keep: float) -> AlphaRun:
    """:func:`contention_run`'s α0 without its step checks, on a stream of ``duration``
    simulated s at vLLM's default step sampling (:data:`ALPHA_STEP_RATE`)."""
    tel = shed_telemetry(model, gpu, tp, duration, seed, ALPHA_STEP_RATE, keep)
    u, s, _ = learn_both(tel)
    return AlphaRun(u.a0_error, s.a0_error, (u.requests, s.requests))


def learn_both(tel: ShedTelemetry) -> tuple[ContentionFit, ContentionFit, list[Any]]:
    """Join and learn ``tel`` unshed and shed: (unshed fit, shed fit, unshed observations)."""
    unshed = join_batches(tel.full)
    u = contention_learn(tel.sim, unshed)
    s = contention_learn(tel.sim, join_batches(tel.partial, tel.load), tel.load.keep_request)
    return u, s, unshed


@dataclass
class ShedTelemetry:
    """One engine's telemetry decoded twice: as when idle (``full``) and while shedding
    (``partial``: shed summaries read partially), with the controller that shed it."""

    sim: Any
    full: list[list[Any]]
    partial: list[list[Any]]
    load: Any  # LoadController, holding the keep ratio at its floor


def shed_telemetry(
    model: str,
    gpu: str,
    tp: int,
    duration: float,
    seed: int,
    step_rate: float,
    keep: float,
    name: str = "",
) -> ShedTelemetry:
    """Simulate one engine (``name``, default ``contention-MODEL``) and decode every export
    request both ways, the load controller holding the keep ratio at ``keep``."""
    from coeffd.daemon.load import LoadController, LoadShedder
    from coeffd.receivers.otlp.decode import Decoder, decode_request
    from coeffd.simfleet import SampleRates, ServingSetup, Workload, run
    from coeffd.simfleet.scenarios import _engine

    load = LoadController(
        shedder=LoadShedder(start=0.0, full=0.5, min_keep=keep, tick_budget_s=0.0),
        backlog=lambda: 1.0,  # a full queue: the share held at its floor
    )
    load.steer()
    plain, shedding = Decoder(), Decoder()
    shedding.step_filter = load.step_filter
    full: list[list[Any]] = []
    partial: list[list[Any]] = []

    def sink(req: Any) -> None:
        full.append(list(decode_request(req, plain).records))
        partial.append(list(decode_request(req, shedding).records))

    spec = _engine(
        name or f"contention-{model}",
        ServingSetup(model=model, gpu=gpu, tp=tp),
        Workload(rate_per_s=6.0, profile="mixed"),
    )
    sim = run(
        [spec],
        duration,
        seed,
        trace_sinks=[sink],
        rates=SampleRates(1.0, step_rate, 0.001, 100),
        record_steps=True,
        drain_s=5.0,
    )
    return ShedTelemetry(sim, full, partial, load)


def join_batches(batches: list[list[Any]], load: Any = None) -> list[Any]:
    """Join decoded batches in order, then flush (``load``: the shedding controller)."""
    from coeffd.joiner import Joiner, JoinerConfig

    j = Joiner(JoinerConfig(), load=load)
    obs: list[Any] = []
    for batch in batches:
        obs.extend(j.push_many(batch))
    obs.extend(j.flush())
    return obs


def contention_run(
    model: str, gpu: str, tp: int, duration: float, seed: int, step_rate: float, keep: float
) -> ContentionRun:
    """Simulate one engine, decode its telemetry as when idle and while shedding, join and
    learn both (the load controller holding the keep ratio at ``keep``)."""
    tel = shed_telemetry(model, gpu, tp, duration, seed, step_rate, keep)
    u, s, unshed = learn_both(tel)
    null = subsample_null(tel.sim, unshed, s.steps / max(u.steps, 1), keep, NULL_DRAWS)
    return ContentionRun(
        u.step_error,
        s.step_error,
        u.a0_error,
        s.a0_error,
        (u.steps, s.steps),
        (u.requests, s.requests),
        null,
        (u.summary_only, s.summary_only),
    )


def contention(
    duration: float,
    seeds: Sequence[int],
    step_rate: float,
    keep: float = 0.3,
    alpha_duration: float = 2400.0,
) -> list[Check]:
    """Issue 32, item 9: shedding may cost data, never move the estimate. Each engine's
    telemetry is decoded twice — as when idle, and while shedding (shed summaries read
    partially) — and joined and learned twice: unshed, and with the load controller
    holding the keep ratio at ``keep`` (the joiner sheds whole segments by their closing
    summary's step, the consumer requests by their id).

    The published estimates forget per observation (``steady_forgetting``: a memory of
    1/(1 − λ) observations), so once a run gives the shed learner several memories of
    data, shed and unshed estimates average as many observations and shedding should
    cost little; in a shorter run the shed one has fewer rows and spreads more. Printed:
    how many memories each run held.

    α0 is judged on a stream of its own, ``alpha_duration`` simulated s at vLLM's default
    step sampling (:data:`ALPHA_STEP_RATE`: its resolution needs more requests than the
    step checks need steps); 0 judges it on the dense stream instead."""
    memory = 1.0 / (1.0 - LearnersConfig().steady_forgetting)
    print(
        f"\n== contention: observations shed to {keep:.0%} vs unshed, {duration:.0f} simulated s, "
        f"seeds {', '.join(map(str, seeds))}, journeys 1.0, step summaries {step_rate} "
        f"(simfleet → OTLP decode → joiner → registry); published memory {memory:,.0f} "
        "observations"
    )
    checks: list[Check] = []
    for model, gpu, tp in CONTENTION:
        runs: list[ContentionRun] = []
        for seed in seeds:
            t0 = time.perf_counter()
            r = contention_run(model, gpu, tp, duration, seed, step_rate, keep)
            runs.append(r)
            e_null = statistics.fmean(n[0] for n in r.null)
            print(
                f"  {model}/{gpu}/tp{tp} seed {seed} ({time.perf_counter() - t0:.0f} s): step "
                f"time vs truth (mean |.|) unshed {r.e_unshed * 100:.3f}% ({r.steps[0]:,} steps "
                f"= {r.steps[0] / memory:.1f} memories, {r.requests[0]:,} requests), shed "
                f"{r.e_shed * 100:.3f}% ({r.steps[1]:,} steps = {r.steps[1] / memory:.1f} "
                f"memories, {r.requests[1]:,} requests): ratio {r.ratio:.2f}; summary-only "
                f"rows learned {r.summary_only[0] / max(r.steps[0], 1):.0%} / "
                f"{r.summary_only[1] / max(r.steps[1], 1):.0%}; alpha0 unshed "
                f"{r.a0_unshed * 100:+.2f}%, shed {r.a0_shed * 100:+.2f}%\n    random "
                f"subsamples at the same shares ({NULL_DRAWS}): step error {e_null * 100:.3f}% "
                f"(ratio {e_null / max(r.e_unshed, 1e-12):.2f}); shed vs them max |z| {r.z:.2f}"
            )
        alpha: list[AlphaRun] = []
        for seed in seeds if alpha_duration > 0 else ():
            t0 = time.perf_counter()
            a = alpha_run(model, gpu, tp, alpha_duration, seed, keep)
            alpha.append(a)
            print(
                f"  {model}/{gpu}/tp{tp} seed {seed}, alpha0 stream ({alpha_duration:.0f} s, "
                f"steps {ALPHA_STEP_RATE}; {time.perf_counter() - t0:.0f} s): alpha0 unshed "
                f"{a.a0_unshed * 100:+.2f}% ({a.requests[0]:,} requests), shed "
                f"{a.a0_shed * 100:+.2f}% ({a.requests[1]:,} requests)"
            )
        checks += _contention_checks(model.split("-")[0], runs, alpha)
    return checks


def step_error_ratio(runs: Sequence[ContentionRun]) -> float:
    """Issue 32's step-error statistic: the shed runs' mean error over the unshed runs'
    (a ratio of means over seeds). Why not the mean of per-seed ratios: at errors of
    0.02-0.1 % each ratio divides two small noisy numbers, so it is heavy-tailed and its
    mean is pulled up by Jensen's inequality (seeds 3-5 at 2026-11-29: per-seed 0.41,
    0.90, 2.75, mean 1.35, where random 30 % subsamples also gave 1.33); "the shed run's
    error within 1.2x of the unshed run's" reads as mean against mean."""
    unshed = statistics.fmean(r.e_unshed for r in runs)
    shed = statistics.fmean(r.e_shed for r in runs)
    return shed / unshed if unshed > 0 else float("inf")


def null_error_ratio(runs: Sequence[ContentionRun]) -> float:
    """:func:`step_error_ratio` of the random subsamples: what shedding that does not look
    at the content would give by the same statistic (the mean over each seed's draws)."""
    unshed = statistics.fmean(r.e_unshed for r in runs)
    null = statistics.fmean(statistics.fmean(n[0] for n in r.null) for r in runs)
    return null / unshed if unshed > 0 else float("inf")


def _contention_checks(
    name: str, runs: Sequence[ContentionRun], alpha: Sequence[AlphaRun] = ()
) -> list[Check]:
    """Issue 32's targets over the seeds: step error shed / unshed ≤ 1.2 (ratio of the
    means over seeds; per-seed ratios printed), α0 within 2 % (shed vs unshed, and shed
    vs the truth, every seed: on the α0 stream when there is one, else on the dense
    stream), and no bias (shed vs random subsamples at the same shares)."""
    ratio = step_error_ratio(runs)
    per_seed = [r.ratio for r in runs]
    shift = max(abs(r.a0_shed - r.a0_unshed) for r in runs)
    null_ratio = null_error_ratio(runs)
    null_mean_ratio = statistics.fmean(
        statistics.fmean(n[0] for n in r.null) / max(r.e_unshed, 1e-12) for r in runs
    )
    print(
        f"  {name}: step error over {len(runs)} seeds: unshed "
        f"{statistics.fmean(r.e_unshed for r in runs) * 100:.3f}%, shed "
        f"{statistics.fmean(r.e_shed for r in runs) * 100:.3f}%: shed / unshed {ratio:.2f} "
        f"(random subsamples {null_ratio:.2f}); for information, per-seed ratios "
        f"{', '.join(f'{x:.2f}' for x in per_seed)} (mean {statistics.fmean(per_seed):.2f}, "
        f"random subsamples {null_mean_ratio:.2f}); alpha0 shed − unshed at most "
        f"{shift * 100:.2f} points"
    )
    z = max(r.z for r in runs)
    # "α0 within 2 %" read both ways: moved by shedding, and the shed α0 vs the truth
    pairs = [(a.a0_unshed, a.a0_shed) for a in alpha] or [(r.a0_unshed, r.a0_shed) for r in runs]
    where = f"alpha0 stream, steps {ALPHA_STEP_RATE}" if alpha else "dense stream"
    shift = max(abs(s - u) for u, s in pairs)
    off = max(abs(s) for _, s in pairs)
    info = []
    if alpha:  # the dense stream's α0 too, for information (its resolution: 1.4 %)
        info = [
            Check(
                f"contention {name}: dense stream alpha0 moved by shedding / shed vs the truth",
                max(abs(r.a0_shed - r.a0_unshed) for r in runs),
                f"(info; shed vs the truth {max(abs(r.a0_shed) for r in runs):.4g})",
                True,
            )
        ]
    return [
        *info,
        Check(
            f"contention {name}: step error shed / unshed, ratio of means over seeds",
            ratio,
            "≤ 1.2",
            ratio <= 1.2,
        ),
        Check(
            f"contention {name}: alpha0 moved by shedding, max over seeds ({where})",
            shift,
            "≤ 0.02",
            shift <= 0.02,
        ),
        Check(
            f"contention {name}: shed alpha0 vs the truth, max |.| over seeds ({where})",
            off,
            "≤ 0.02",
            off <= 0.02,
        ),
        Check(
            f"contention {name}: shed vs random subsamples, max |z| (step, alpha0)",
            z,
            f"≤ {Z_UNBIASED:g}",
            z <= Z_UNBIASED,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench learning", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="one seed, shorter streams")
    ap.add_argument("--sigma", type=float, default=0.03, help="log-normal step noise")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--scenario",
        choices=("all", "steady", "drift", "coldstart", "recovery", "simfleet", "contention"),
        default="all",
        help="'simfleet' runs the real pipeline on simfleet's steady and abrupt-drift scenarios",
    )
    ap.add_argument("--sim-duration", type=float, default=120.0, help="simfleet simulated seconds")
    ap.add_argument(
        "--contention-duration",
        type=float,
        default=600.0,
        help="contention: simulated s (600 s at every-step sampling: the shed learner holds "
        "~2 memories of step observations, the unshed ~8)",
    )
    ap.add_argument(
        "--contention-step-rate",
        type=float,
        default=1.0,
        help="contention: step summary sampling (1.0: memory-limited in 600 s; at vLLM's "
        "0.01 a shed run needs ~12,000 simulated s to hold 2 memories)",
    )
    ap.add_argument("--contention-keep", type=float, default=0.3, help="contention: keep ratio")
    ap.add_argument(
        "--contention-alpha-duration",
        type=float,
        default=2400.0,
        help="contention: simulated s of the alpha0 stream (vLLM's default step sampling; "
        "0: judge alpha0 on the dense stream)",
    )
    ap.add_argument("--contention-seeds", default="3,4,5", help="contention: comma-separated seeds")
    args = ap.parse_args(argv)
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    cfg = LearnersConfig()
    seeds = 1 if args.quick else args.seeds
    n = 3000 if args.quick else 6000
    checks: list[Check] = []
    t0 = time.perf_counter()
    if args.scenario in ("all", "steady"):
        checks += steady(cfg, seeds, n, args.sigma)
    if args.scenario in ("all", "recovery"):
        recovery(cfg, 10_000 if args.quick else 40_000, args.sigma)
    if args.scenario in ("all", "drift"):
        checks += drift(cfg, seeds, n, args.sigma)
    if args.scenario in ("all", "coldstart"):
        checks += coldstart(cfg, 1000 if args.quick else 2000, args.sigma)
    if args.scenario in ("all", "contention"):
        seeds_c = [int(x) for x in args.contention_seeds.split(",")]
        checks += contention(
            args.contention_duration,
            seeds_c,
            args.contention_step_rate,
            args.contention_keep,
            args.contention_alpha_duration,
        )
    if args.scenario == "simfleet":
        for sc in ("steady", "abrupt-drift"):
            checks += simfleet_mode(cfg, sc, args.sim_duration, 1)
    print(f"\n== summary ({time.perf_counter() - t0:.0f} s)")
    for c in checks:
        print(c.line())
    return 0 if all(c.ok for c in checks if not c.target.startswith("(info")) else 1


if __name__ == "__main__":
    sys.exit(main())
