"""Per-configuration learner sets, created on first sight, bounded, checkpointable.

One :class:`LearnerSet` per configuration id holds one :class:`~learners.rls.RLSRegressor`
per target, each created when its first observation arrives:

==========================  ==============================================  =================
learner                     regression                                      BLIS vector
==========================  ==============================================  =================
``beta``                    step period on the 11 BLIS terms (§5.3)         ``beta_coeffs``
``beta_steady``             the same, long memory (published when steady)   ``beta_coeffs``
``beta_extended``           step period on BLIS terms + extended features   (diagnostic)
``arrival_to_queued``       arrival→queued on an intercept                  ``alpha[0]``
``finished_to_departed``    finished→departed on an intercept               ``alpha[1]``
``output_token``            first token→first response on an intercept      ``alpha[2]``
``queue_wait``              queue wait on (1, waiting, running, kv usage)   —
``kv_store`` / ``kv_load``  transfer time on (1, bytes): base + bytes/BW    —
==========================  ==============================================  =================

Every observation is predicted before it is learned (:mod:`learners.evaluation`), with
the learned vector, BLIS's shipped defaults and a windowed batch refit. New sets start
from the :class:`~learners.prior.PooledPrior` of similar known configurations. The number
of live sets is bounded (LRU); an evicted set is reduced to its ``state_dict`` (handed to
``on_evict`` for a checkpoint, and parked in memory, bounded) and restored exactly when
its configuration is seen again.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from coeffd.learners.config import LearnersConfig
from coeffd.learners.drift import DriftMonitor
from coeffd.learners.evaluation import (
    Evaluator,
    WindowedRefit,
    regime_batches,
    regime_std,
    step_regime,
)
from coeffd.learners.features import BLIS_DEFAULT_ALPHA, BLIS_DEFAULT_BETA, TERM_NAMES, BlisBasis
from coeffd.learners.features.config import BasisResolver, ServingConfig
from coeffd.learners.features.extended import EXTENDED_NAMES, extended_terms
from coeffd.learners.features.observe import kv_bytes_per_block, step_features
from coeffd.learners.prior import PooledPrior, prior_precision
from coeffd.learners.rls import RLSRegressor
from coeffd.learners.steady import STEADY, SteadyEstimator, identified_fit, term_sources
from coeffd.records.observations import (
    KVTransferObservation,
    Observation,
    RequestObservation,
    StepObservation,
)

__all__ = [
    "ALPHA_TARGETS",
    "ConfigSnapshot",
    "LearnerRegistry",
    "LearnerSet",
    "Scored",
    "VectorSnapshot",
]

_log = structlog.get_logger(__name__)

FloatArray = npt.NDArray[np.float64]

ALPHA_TARGETS: tuple[str, ...] = ("arrival_to_queued", "finished_to_departed", "output_token")
QUEUE_FEATURES: tuple[str, ...] = ("one", "waiting_depth", "running_depth", "kv_usage")
KV_FEATURES: tuple[str, ...] = ("one", "bytes")
BETA_EXTENDED_FEATURES: tuple[str, ...] = tuple(TERM_NAMES) + tuple(EXTENDED_NAMES)
_ONE = ("one",)
#: Step feature rows kept per configuration: the "recent batch mix" the publisher judges
#: a new β on (how much would it change the predicted step times of these batches).
RECENT_ROWS = 256
_NO_DRIFT = frozenset({"kv_store", "kv_load", "queue_wait"})


@dataclass(frozen=True)
class Scored:
    """One prequential prediction: the target, the measured value and each source's guess."""

    target: str
    y: float
    predictions: dict[str, float]
    regime: str | None = None


@dataclass(frozen=True)
class VectorSnapshot:
    """One learned vector. ``values`` is always publishable (finite, ≥ 0, full length)."""

    name: str
    names: tuple[str, ...]
    values: tuple[float, ...]
    unconstrained: tuple[float, ...]
    std: tuple[float, ...]
    prior: tuple[float, ...]
    identified: tuple[bool, ...]
    unidentified: tuple[str, ...]
    observations: int
    rejected: int
    n_effective: float
    mape: float
    rmse: float
    drift_detections: int
    drift_history: tuple[dict[str, Any], ...]
    #: ``steady`` (long-memory estimate) or ``tracking`` (fast, the physics is changing);
    #: "" for vectors without the two (every one but ``beta``)
    estimate: str = ""
    #: per term: ``data``, ``data+prior`` (only a combination identified) or ``prior``
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigSnapshot:
    """What the publisher needs for one configuration.

    ``alpha`` (3) and ``beta`` (11) are BLIS-ready: finite, non-negative, right length —
    learned where data exists, the (pooled) prior elsewhere. ``vectors`` has the detail of
    every learner; ``errors`` the rolling prequential errors
    ``{target: {source: {regime: {"mape", "rmse", "n"}}}}``.
    """

    config_id: str
    labels: dict[str, str]
    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    vectors: dict[str, VectorSnapshot]
    observations: int
    version: int
    created_wall_ns: int
    updated_wall_ns: int
    prior_sources: tuple[str, ...]
    errors: dict[str, Any] = field(default_factory=dict)
    #: the last step feature rows learned (≤ ``RECENT_ROWS`` × 11), or None
    recent_terms: FloatArray | None = None
    #: per regime: the published β's estimated relative standard error of the predicted
    #: step time on a fixed set of batches (learners.evaluation.regime_batches)
    step_time_rel_std: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.recent_terms is not None:
            d["recent_terms"] = self.recent_terms.tolist()
        return d


class LearnerSet:
    """The learners of one configuration (see module table)."""

    def __init__(
        self,
        config: ServingConfig,
        basis: BlisBasis | None,
        settings: LearnersConfig,
        beta_prior: FloatArray,
        beta_precision: FloatArray,
        alpha_prior: FloatArray,
        prior_sources: tuple[str, ...] = (),
    ) -> None:
        self.config = config
        self.basis = basis
        self.settings = settings
        self.beta_prior = np.asarray(beta_prior, dtype=float)
        self.beta_precision = np.asarray(beta_precision, dtype=float)
        self.alpha_prior = np.asarray(alpha_prior, dtype=float)
        self.prior_sources = prior_sources
        self.learners: dict[str, RLSRegressor] = {}
        self._steady: SteadyEstimator | None = None
        self._steady_state: dict[str, Any] = {}  # restored before the learners exist
        self._recent = np.zeros((RECENT_ROWS, len(TERM_NAMES)))
        self._recent_n = 0
        self._regime_terms: dict[str, FloatArray] | None = None
        ev = settings.evaluation
        self.baseline = WindowedRefit(
            ev.baseline_window, ev.baseline_refit_every, len(TERM_NAMES), initial=BLIS_DEFAULT_BETA
        )
        self.version = 0
        self.observations = 0
        self.created_wall_ns = time.time_ns()
        self.updated_wall_ns = self.created_wall_ns

    # -------------------------------------------------------------- learners

    def _drift(self, target: str) -> DriftMonitor | None:
        d = self.settings.drift
        if not d.enabled:
            return None
        return DriftMonitor(
            d.detector,
            d.params,
            d.grace,
            d.keep,
            d.fast_forgetting,
            d.fast_for,
            label=f"{self.config.id}/{target}",
        )

    def learner(self, target: str) -> RLSRegressor:
        """The learner of ``target``, created on first use."""
        m = self.learners.get(target)
        if m is None:
            m = self._make(target)
            self.learners[target] = m
        return m

    def _make(self, target: str) -> RLSRegressor:
        s = self.settings
        common: dict[str, Any] = {
            "huber": s.huber,
            "scale_memory": s.scale_memory,
            "refresh_every": s.refresh_every,
            # No detector where residuals follow the load rather than the coefficients, or
            # it raises false alarms on a stationary system: KV transfer durations are
            # only seen in whole step periods (completions are published once per step),
            # and queue waits swing with bursty arrivals far beyond a linear model.
            "drift": None if target in _NO_DRIFT else self._drift(target),
        }
        if target in ("beta", "beta_steady"):
            # the fast tracker and the long-memory learner (learners.steady), each with a
            # detector of its own
            return RLSRegressor(
                TERM_NAMES,
                forgetting=s.forgetting if target == "beta" else s.steady_forgetting,
                prior_mean=self.beta_prior.tolist(),
                prior_precision=self.beta_precision,
                weighting=s.weighting,
                **common,
            )
        if target == "beta_extended":
            n_ext = len(EXTENDED_NAMES)
            mean = np.concatenate([self.beta_prior, np.zeros(n_ext)])
            prec = np.concatenate(
                [
                    self.beta_precision,
                    prior_precision(np.zeros(n_ext), s.prior_strength, s.prior_scale_floor),
                ]
            )
            return RLSRegressor(
                BETA_EXTENDED_FEATURES,
                forgetting=s.forgetting,
                prior_mean=mean.tolist(),
                prior_precision=prec,
                weighting=s.weighting,
                **common,
            )
        if target in ALPHA_TARGETS:
            mean = self.alpha_prior[ALPHA_TARGETS.index(target) : ALPHA_TARGETS.index(target) + 1]
            return RLSRegressor(
                _ONE,
                forgetting=s.queueing_forgetting
                if target == "arrival_to_queued"
                else s.alpha_forgetting,
                prior_mean=mean.tolist(),
                prior_precision=prior_precision(
                    mean.tolist(), s.prior_strength, s.prior_scale_floor
                ),
                weighting="relative",
                **common,
            )
        if target == "queue_wait":
            # Queue waits are often ~0: relative weights would explode, so plain LS.
            return RLSRegressor(
                QUEUE_FEATURES,
                forgetting=s.alpha_forgetting,
                prior_precision=1e-6,
                weighting="none",
                **common,
            )
        if target in ("kv_store", "kv_load"):
            return RLSRegressor(
                KV_FEATURES,
                forgetting=s.kv_forgetting,
                prior_precision=[s.prior_strength * 1e-6, s.prior_strength * 1e6],
                weighting="relative",
                **common,
            )
        raise KeyError(target)

    def steady(self) -> SteadyEstimator:
        """The published β estimator: fast tracker ``beta`` + long-memory ``beta_steady``."""
        if self._steady is None:
            d = self.settings.drift
            self._steady = SteadyEstimator(
                self.learner("beta"),
                self.learner("beta_steady"),
                keep=d.keep,
                fast_forgetting=d.fast_forgetting,
                fast_for=d.fast_for,
            )
            if self._steady_state:
                self._steady.load_state(self._steady_state)
        return self._steady

    def regime_terms(self) -> dict[str, FloatArray]:
        """Basis terms of the fixed per-regime batches for this configuration (cached)."""
        if self._regime_terms is None:
            if self.basis is None:
                return {}
            c = self.config
            batches = regime_batches(c.max_num_batched_tokens or 2048, c.max_num_seqs or 256)
            self._regime_terms = {
                r: np.array([self.basis.terms(b) for b in bs]) for r, bs in batches.items()
            }
        return self._regime_terms

    def step_time_rel_std(self, beta: Sequence[float]) -> dict[str, float]:
        """:func:`learners.evaluation.regime_std` of the published β learner (µs-free)."""
        m = self.learners.get("beta")
        if m is None or not self.regime_terms():
            return {}
        if self.settings.steady and "beta_steady" in self.learners:
            m = self.steady().published
        sigma = m.residual_scale
        if sigma is None:
            return {}
        a, _ = m.information()
        try:
            cov = np.asarray(sigma * sigma * np.linalg.inv(a), dtype=np.float64)
        except np.linalg.LinAlgError:
            return {}
        return regime_std(self.regime_terms(), beta, cov)

    def recent_terms(self) -> FloatArray | None:
        """The step feature rows learned last (a copy), None before any."""
        n = min(self._recent_n, RECENT_ROWS)
        return self._recent[:n].copy() if n else None

    def _remember(self, x: FloatArray) -> None:
        k = len(x)
        if k >= RECENT_ROWS:
            self._recent[:] = x[-RECENT_ROWS:]
        else:
            idx = (self._recent_n + np.arange(k)) % RECENT_ROWS
            self._recent[idx] = x
        self._recent_n += k

    # -------------------------------------------------------------- learning

    def learn(self, obs: Observation, evaluator: Evaluator | None) -> list[Scored]:
        """Predict, score, then learn one observation; returns what was scored."""
        if isinstance(obs, StepObservation):
            return self.learn_steps([obs], evaluator)  # does its own bookkeeping
        if isinstance(obs, RequestObservation):
            out = self._learn_request(obs, evaluator)
        elif isinstance(obs, KVTransferObservation):
            out = self._learn_kv(obs, evaluator)
        else:
            out = []
        if out:
            self.version += 1
            self.observations += 1
            self.updated_wall_ns = time.time_ns()
        return out

    def _score(
        self,
        evaluator: Evaluator | None,
        target: str,
        y: float,
        preds: dict[str, float],
        regime: str | None,
    ) -> Scored:
        if evaluator is not None:
            evaluator.record(self.config.id, target, y, preds, regime)
        return Scored(target, y, preds, regime)

    def learn_steps(
        self, steps: Sequence[StepObservation], evaluator: Evaluator | None
    ) -> list[Scored]:
        """Many step observations of this configuration at once: the same predictions,
        updates and scores as :meth:`learn` one by one, vectorised (the learners predict
        each row with the coefficients of their last fold either way; see
        :meth:`RLSRegressor.learn_many_prequential`). Drift detections in the batch are
        stamped with the step clock of its last row."""
        if self.basis is None or not steps:
            return []
        beta = self.learner("beta")
        ev = self.settings.evaluation
        xs: list[FloatArray] = []
        ys: list[float] = []
        regimes: list[str] = []
        xes: list[FloatArray | None] = []
        for obs in steps:
            y = float(obs.period_us)
            x = step_features(obs, self.basis, block_size=self.config.block_size)
            if not (math.isfinite(y) and y > 0 and np.all(np.isfinite(x))):
                beta.n_rejected += 1
                continue
            agg = obs.aggregates
            regimes.append(
                step_regime(
                    agg.prefill_tokens,
                    agg.decode_tokens,
                    agg.kv_usage_gpu_ratio,
                    heavy_fraction=ev.heavy_fraction,
                    kv_saturated=ev.kv_saturated,
                )
            )
            xs.append(x)
            ys.append(y)
            if self.settings.extended:
                xe = np.concatenate([x, extended_terms(obs, self.basis, self.config)])
                xes.append(xe if np.all(np.isfinite(xe)) else None)
        if not ys:
            return []
        x_all = np.array(xs)
        y_all = np.array(ys)
        if beta.drift is not None:
            beta.drift.clock_ns = steps[-1].start_mono_ns
        if self.settings.steady:
            learned = self.steady().learn_many_prequential(x_all, y_all)
        else:
            learned = beta.learn_many_prequential(x_all, y_all)
        self._remember(x_all)
        default = x_all @ np.asarray(BLIS_DEFAULT_BETA)
        extended = np.full(len(ys), np.nan)
        ok = [i for i, xe in enumerate(xes) if xe is not None]
        if ok:
            xe_all = np.array([xes[i] for i in ok])
            extended[ok] = self.learner("beta_extended").learn_many_prequential(
                xe_all, y_all[ok], nonnegative=False
            )
        refit = self.baseline.learn_many_prequential(x_all, y_all)
        columns = {
            "learned": learned,
            "blis_default": default,
            "batch_refit": refit,
            "learned_extended": extended,
        }
        if evaluator is not None:
            evaluator.record_many(self.config.id, "step_period", y_all, columns, regimes)
        rows = zip(
            ys, learned.tolist(), default.tolist(), refit.tolist(), extended.tolist(), regimes,
            strict=True,
        )  # fmt: skip
        out = []
        for y, p_learned, p_default, p_refit, p_ext, regime in rows:
            preds = {"learned": p_learned, "blis_default": p_default, "batch_refit": p_refit}
            if p_ext == p_ext:  # not NaN: the extended learner predicted this row
                preds["learned_extended"] = p_ext
            out.append(Scored("step_period", y, preds, regime))
        self.version += len(out)
        self.observations += len(out)
        self.updated_wall_ns = time.time_ns()
        return out

    def _learn_request(self, obs: RequestObservation, evaluator: Evaluator | None) -> list[Scored]:
        out: list[Scored] = []
        default = dict(zip(ALPHA_TARGETS, BLIS_DEFAULT_ALPHA, strict=True))
        # BLIS's α0 is arrival → enqueued; vLLM's QUEUED also waits for the engine loop's
        # next iteration boundary, which BLIS simulates itself: learn α0 without it, and
        # not at all while the joiner cannot estimate it yet.
        wait = obs.queued_loop_wait_us
        for target, y in (
            ("arrival_to_queued", None if wait is None else obs.arrival_to_queued_us - wait),
            ("finished_to_departed", obs.finished_to_departed_us),
            ("output_token", obs.first_token_to_response_us),
        ):
            if y is None:
                continue
            m = self.learner(target)
            if not (math.isfinite(y) and y >= 0):
                m.n_rejected += 1
                continue
            preds = {"learned": float(m.prediction_coef()[0]), "blis_default": default[target]}
            out.append(self._score(evaluator, target, float(y), preds, None))
            m.learn_one({"one": 1.0}, float(y))
        qs = obs.queue_state
        if obs.queue_wait_us is not None and qs is not None:
            m = self.learner("queue_wait")
            xq = {
                "one": 1.0,
                "waiting_depth": float(qs.waiting_depth),
                "running_depth": float(qs.running_depth),
                "kv_usage": float(qs.kv_usage_gpu_ratio),
            }
            y = float(obs.queue_wait_us)
            if math.isfinite(y):
                out.append(
                    self._score(evaluator, "queue_wait", y, {"learned": _fast_predict(m, xq)}, None)
                )
            m.learn_one(xq, y)
        return out

    def _learn_kv(self, obs: KVTransferObservation, evaluator: Evaluator | None) -> list[Scored]:
        if not obs.success:
            return []
        target = "kv_store" if obs.store else "kv_load"
        m = self.learner(target)
        nbytes = obs.bytes
        if nbytes is None and self.basis is not None:
            nbytes = obs.block_count * kv_bytes_per_block(self.basis.model, self.config.block_size)
        if nbytes is None:
            m.n_rejected += 1
            return []
        x = {"one": 1.0, "bytes": float(nbytes)}
        y = float(obs.duration_us)
        scored = []
        if math.isfinite(y) and y > 0:
            scored.append(self._score(evaluator, target, y, {"learned": _fast_predict(m, x)}, None))
        m.learn_one(x, y)
        return scored

    # -------------------------------------------------------------- output

    def vector(
        self, name: str, evaluator: Evaluator | None, threshold: float
    ) -> VectorSnapshot | None:
        m = self.learners.get(name)
        if m is None:
            return None
        estimate = ""
        sources: dict[str, str] = {}
        if name == "beta" and self.settings.steady and "beta_steady" in self.learners:
            # the published β: the long-memory learner in steady state, identified
            # directions from its data and the rest from the (pooled) prior
            est = self.steady()
            estimate = est.mode
            slow = est.slow
            fit, share = identified_fit(slow, self.settings.identify_max_rel_std)
            a_data, _ = slow.data_information()
            sources = term_sources(m.features, share, np.diag(a_data) > 0)
            if estimate == STEADY:
                m = slow
        blis = (
            name in ("beta", "beta_steady")
            or name in ALPHA_TARGETS
            or name in ("kv_store", "kv_load")
        )
        prior = np.asarray(m.prior_mean if m.prior_mean is not None else np.zeros(len(m.features)))
        raw = m.coef
        values = m.nonnegative_coef() if blis else raw
        ident = m.identified(threshold)
        if estimate:
            if estimate == STEADY and self.settings.identify_pin:
                values = fit
            ident = np.array([sources[f] == "data" for f in m.features])
        # Terms the data cannot identify already sit at their prior value in the fit (the
        # prior is never forgotten, and an unexcited coefficient is decoupled from the data);
        # they are not overwritten here, so the published vector is exactly the one scored.
        if blis and not _publishable(values, len(m.features)):
            _log.warning("invalid_vector_replaced_by_prior", config=self.config.id, vector=name)
            values = np.maximum(np.nan_to_num(prior, nan=0.0, posinf=0.0), 0.0)
        target = {"beta": "step_period", "beta_steady": "step_period"}.get(name, name)
        target = "step_period" if name == "beta_extended" else target
        source = "learned_extended" if name == "beta_extended" else "learned"
        mape = rmse = math.nan
        if evaluator is not None:
            s = evaluator.summary(self.config.id, target).get(source, {}).get("all")
            if s:
                mape, rmse = s["mape"], s["rmse"]
        drift = self.learners[name].drift  # the fast tracker's, for the published β too
        return VectorSnapshot(
            name=name,
            names=tuple(m.features),
            values=tuple(float(v) for v in values),
            unconstrained=tuple(float(v) for v in raw),
            std=tuple(float(v) for v in m.coef_std()),
            prior=tuple(float(v) for v in prior),
            identified=tuple(bool(v) for v in ident),
            unidentified=tuple(f for f, ok in zip(m.features, ident, strict=True) if not ok),
            observations=m.n_learned,
            rejected=m.n_rejected,
            n_effective=m.n_effective,
            mape=mape,
            rmse=rmse,
            drift_detections=0 if drift is None else drift.detections,
            drift_history=() if drift is None else tuple(dict(e) for e in drift.history),
            estimate=estimate,
            sources=sources,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "beta_prior": self.beta_prior.tolist(),
            "beta_precision": self.beta_precision.tolist(),
            "alpha_prior": self.alpha_prior.tolist(),
            "prior_sources": list(self.prior_sources),
            "learners": {k: m.state_dict() for k, m in self.learners.items()},
            "baseline": self.baseline.coef.tolist(),
            "version": self.version,
            "observations": self.observations,
            "created_wall_ns": self.created_wall_ns,
            "updated_wall_ns": self.updated_wall_ns,
            "steady": {} if self._steady is None else self._steady.state_dict(),
        }


_PROBE_CONFIG = ServingConfig(model="llama-3.1-8b-instruct", gpu="H100")


def _check_priors(reg: LearnerRegistry, config: ServingConfig, ls: LearnerSet | None) -> None:
    """Raise ``ValueError`` when the pools cannot give ``config`` a prior, or when a
    restored set's priors and baseline do not have the shapes a new set's would."""
    bp = reg.beta_pool.prior_for(config)
    ap = reg.alpha_pool.prior_for(config)
    if ls is None:
        return
    for what, got, want in (
        ("beta_prior", ls.beta_prior, bp.mean),
        ("beta_precision", ls.beta_precision, bp.precision),
        ("alpha_prior", ls.alpha_prior, ap.mean),
        ("baseline", ls.baseline.coef, bp.mean),
    ):
        if np.shape(got) != np.shape(want) or not np.all(np.isfinite(got)):
            raise ValueError(f"set {config.id}: {what} has shape {np.shape(got)}")


def _check_learner(ls: LearnerSet, name: str, m: RLSRegressor) -> None:
    """Raise ``ValueError`` when a restored learner is not one this version makes (its
    name, its features) or its state disagrees with its features."""
    try:
        fresh = ls._make(name)  # the learner of that name today (KeyError: no such target)
    except KeyError:
        raise ValueError(f"unknown learner {name!r}") from None
    if list(fresh.features) != list(m.features):
        raise ValueError(f"learner {name!r}: features {list(m.features)} are not this version's")
    n = len(m.features)
    coef = np.asarray(m.coef, dtype=float)
    if coef.shape != (n,) or np.asarray(m.coef_std()).shape != (n,):
        raise ValueError(f"learner {name!r}: state does not match its {n} features")
    _fast_predict(m, dict.fromkeys(m.features, 1.0))


def _fast_predict(m: RLSRegressor, x: Mapping[str, float]) -> float:
    """Predict-before-learn with the coefficients of the last fold (see
    :meth:`RLSRegressor.prediction_coef`)."""
    theta = m.prediction_coef(nonnegative=False)
    return float(sum(float(theta[i]) * x.get(f, 0.0) for i, f in enumerate(m.features)))


def _publishable(v: FloatArray, n: int) -> bool:
    return bool(v.shape == (n,) and np.all(np.isfinite(v)) and np.all(v >= 0))


class LearnerRegistry:
    """Learner sets by configuration id (LRU-bounded), with pooled priors and evaluation.

    Usage (see ``tests/learners/test_registry.py``)::

        reg = LearnerRegistry(LearnersConfig(), on_evict=checkpoint_writer)
        for obs in observations:
            scored = reg.learn(serving_config, obs)   # prequential predictions, for metrics
        snap = reg.snapshot(serving_config.id)         # ConfigSnapshot: alpha, beta, detail
    """

    def __init__(
        self,
        settings: LearnersConfig | None = None,
        resolver: BasisResolver | None = None,
        beta_pool: PooledPrior | None = None,
        alpha_pool: PooledPrior | None = None,
        evaluator: Evaluator | None = None,
        on_evict: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.settings = settings or LearnersConfig()
        s = self.settings
        self.resolver = resolver or BasisResolver()
        self.beta_pool = beta_pool or PooledPrior(
            BLIS_DEFAULT_BETA, s.prior_strength, s.prior_scale_floor
        )
        self.alpha_pool = alpha_pool or PooledPrior(
            BLIS_DEFAULT_ALPHA, s.prior_strength, s.prior_scale_floor
        )
        self.evaluator = evaluator if evaluator is not None else Evaluator(s.evaluation.window)
        self.on_evict = on_evict
        self._sets: OrderedDict[str, LearnerSet] = OrderedDict()
        self._parked: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._bad_configs: set[str] = set()
        self.rejected = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sets)

    def __contains__(self, config_id: object) -> bool:
        return config_id in self._sets

    def ids(self) -> list[str]:
        """Live configuration ids, least recently used first."""
        return list(self._sets)

    def get(self, config_id: str) -> LearnerSet | None:
        return self._sets.get(config_id)

    def ensure(self, config: ServingConfig) -> LearnerSet:
        """The set of ``config``: live, restored from the parking lot, or new (pooled prior)."""
        cid = config.id
        ls = self._sets.get(cid)
        if ls is not None:
            self._sets.move_to_end(cid)
            return ls
        parked = self._parked.pop(cid, None)
        if parked is not None:
            ls = self._from_state(parked)
        else:
            basis: BlisBasis | None
            try:
                basis = self.resolver.basis(config)
            except Exception as exc:  # unknown model/GPU: alpha/queue learners still work
                if cid not in self._bad_configs:
                    self._bad_configs.add(cid)
                    _log.warning("basis_unavailable", config=cid, error=str(exc))
                basis = None
            bp = self.beta_pool.prior_for(config)
            ap = self.alpha_pool.prior_for(config)
            ls = LearnerSet(
                config, basis, self.settings, bp.mean, bp.precision, ap.mean, bp.sources
            )
            _log.info(
                "learner_set_created",
                config=cid,
                label=config.short_label,
                prior_sources=len(bp.sources),
            )
        self._sets[cid] = ls
        self._evict_over_limit()
        return ls

    def learn(self, config: ServingConfig, obs: Observation) -> list[Scored]:
        """Predict-then-learn one observation of ``config``; returns the scored predictions."""
        ls = self.ensure(config)
        out = ls.learn(obs, self.evaluator)
        if not out:
            self.rejected += 1
        return out

    def learn_steps(self, config: ServingConfig, steps: Sequence[StepObservation]) -> list[Scored]:
        """:meth:`learn` for many step observations of one configuration (vectorised)."""
        ls = self.ensure(config)
        out = ls.learn_steps(steps, self.evaluator)
        self.rejected += len(steps) - len(out)
        return out

    # -------------------------------------------------------------- output

    def snapshot(self, config_id: str) -> ConfigSnapshot:
        """Current valid coefficients and metadata of a configuration (also feeds the pool)."""
        ls = self._sets.get(config_id)
        if ls is None:
            parked = self._parked.get(config_id)
            if parked is None:
                raise KeyError(config_id)
            ls = self._from_state(parked)
        th = self.settings.identify_threshold
        vectors: dict[str, VectorSnapshot] = {}
        for name in ls.learners:
            v = ls.vector(name, self.evaluator, th)
            if v is not None:
                vectors[name] = v
        beta = (
            vectors["beta"].values
            if "beta" in vectors
            else tuple(np.maximum(ls.beta_prior, 0.0).tolist())
        )
        alpha = tuple(
            vectors[t].values[0] if t in vectors else float(max(ls.alpha_prior[i], 0.0))
            for i, t in enumerate(ALPHA_TARGETS)
        )
        if "beta" in vectors and vectors["beta"].observations > 0:
            vb = vectors["beta"]
            self.beta_pool.add(ls.config, vb.values, vb.identified, vb.n_effective, key=config_id)
        alpha_n = [vectors[t].n_effective for t in ALPHA_TARGETS if t in vectors]
        if len(alpha_n) == len(ALPHA_TARGETS):
            self.alpha_pool.add(ls.config, alpha, None, min(alpha_n), key=config_id)
        errors = {
            t: self.evaluator.summary(config_id, t) for t in self.evaluator.targets(config_id)
        }
        return ConfigSnapshot(
            config_id=config_id,
            labels=ls.config.labels,
            alpha=alpha,
            beta=beta,
            vectors=vectors,
            observations=ls.observations,
            version=ls.version,
            created_wall_ns=ls.created_wall_ns,
            updated_wall_ns=ls.updated_wall_ns,
            prior_sources=ls.prior_sources,
            errors=errors,
            recent_terms=ls.recent_terms(),
            step_time_rel_std=ls.step_time_rel_std(beta) if "beta" in vectors else {},
        )

    # -------------------------------------------------------------- bounds / checkpoints

    def evict(self, config_id: str) -> dict[str, Any]:
        """Remove a live set; returns its state (also given to ``on_evict`` and parked)."""
        ls = self._sets.pop(config_id)
        state = ls.state_dict()
        if self.on_evict is not None:
            self.on_evict(config_id, state)
        if self.settings.max_parked > 0:
            self._parked[config_id] = state
            while len(self._parked) > self.settings.max_parked:
                self._parked.popitem(last=False)
        self.evictions += 1
        _log.info("learner_set_evicted", config=config_id, observations=ls.observations)
        return state

    def restore(self, state: Mapping[str, Any]) -> LearnerSet:
        """Bring back a set from :meth:`state_dict` / eviction state (e.g. a checkpoint)."""
        ls = self._from_state(state)
        cid = ls.config.id
        self._parked.pop(cid, None)
        self._sets[cid] = ls
        self._sets.move_to_end(cid)
        self._evict_over_limit()
        return ls

    def state_dict(self) -> dict[str, Any]:
        """Every live and parked set, plus the pools (a full checkpoint)."""
        sets = {cid: ls.state_dict() for cid, ls in self._sets.items()}
        sets.update({cid: st for cid, st in self._parked.items() if cid not in sets})
        return {
            "version": 1,
            "sets": sets,
            "beta_pool": self.beta_pool.state_dict(),
            "alpha_pool": self.alpha_pool.state_dict(),
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` checkpoint (sets come back parked, revived on use)."""
        self.beta_pool.load_state(state.get("beta_pool", {}))
        self.alpha_pool.load_state(state.get("alpha_pool", {}))
        for cid, st in state.get("sets", {}).items():
            self._parked[cid] = dict(st)

    def check_state(self, state: Any) -> None:
        """Raise ``ValueError`` unless ``state`` restores: :meth:`state_dict`'s layout, every
        set rebuildable and every learner usable (shapes agree with its features).

        A checkpoint's checksum only proves the bytes are what was written; a file of
        another version or tool with a good checksum once crashed start-up (``TypeError``)
        in a restart loop. Everything is rebuilt in a scratch registry, so a bad state
        leaves this one untouched.
        """
        try:
            if not isinstance(state, Mapping):
                raise TypeError(f"expected a map, got {type(state).__name__}")
            sets = state.get("sets", {})
            if not isinstance(sets, Mapping):
                raise TypeError(f"sets: expected a map, got {type(sets).__name__}")
            scratch = LearnerRegistry(self.settings, resolver=self.resolver)
            scratch.load_state(state)
            # the pools' entries take part in every new configuration's prior
            _check_priors(scratch, _PROBE_CONFIG, None)
            for cid, st in sets.items():
                if not isinstance(cid, str):
                    raise TypeError(f"set id {cid!r} is not a string")
                ls = scratch._from_state(st)
                _check_priors(scratch, ls.config, ls)
                for name, m in ls.learners.items():
                    _check_learner(ls, name, m)
                scratch.snapshot(cid)  # every published vector (steady β included) computes
        except (TypeError, KeyError, ValueError, AttributeError, IndexError) as exc:
            raise ValueError(f"{type(exc).__name__}: {exc}") from exc

    def _evict_over_limit(self) -> None:
        while len(self._sets) > self.settings.max_configurations:
            cid = next(iter(self._sets))
            self.evict(cid)

    def _from_state(self, state: Mapping[str, Any]) -> LearnerSet:
        config = ServingConfig.from_dict(state["config"])
        try:
            basis: BlisBasis | None = self.resolver.basis(config)
        except Exception:
            basis = None
        ls = LearnerSet(
            config,
            basis,
            self.settings,
            np.asarray(state["beta_prior"]),
            np.asarray(state["beta_precision"]),
            np.asarray(state["alpha_prior"]),
            tuple(state.get("prior_sources", ())),
        )
        for name, st in state["learners"].items():
            ls.learners[name] = RLSRegressor.from_state(st)
        ls.baseline.coef = np.asarray(state["baseline"], dtype=float)
        ls.version = int(state["version"])
        ls.observations = int(state["observations"])
        ls.created_wall_ns = int(state["created_wall_ns"])
        ls.updated_wall_ns = int(state["updated_wall_ns"])
        ls._steady_state = dict(state.get("steady") or {})
        return ls
