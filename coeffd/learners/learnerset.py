"""The learners of one configuration: predict, score, learn; vectors and state out.

A :class:`LearnerSet` holds one :class:`~learners.rls.RLSRegressor` per target (made on
first use by :mod:`learners.targets`). Every observation is predicted before it is
learned (:mod:`learners.evaluation`), with the learned vector, BLIS's shipped defaults
and a windowed batch refit; :meth:`LearnerSet.vector` turns a learner into the
publishable :class:`~learners.estimates.VectorEstimate`. Sets are created, bounded and
checkpointed by :mod:`learners.registry`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from coeffd.learners.config import LearnersConfig
from coeffd.learners.estimates import (
    RequestScore,
    RequestScores,
    Scored,
    StepScores,
    VectorEstimate,
)
from coeffd.learners.evaluation import (
    Evaluator,
    WindowedRefit,
    regime_batches,
    regime_std,
    step_regimes,
)
from coeffd.learners.features import BLIS_DEFAULT_ALPHA, BLIS_DEFAULT_BETA, TERM_NAMES, BlisBasis
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.features.observe import have_requests, kv_bytes_per_block
from coeffd.learners.features.rows import step_rows
from coeffd.learners.rls import RLSRegressor
from coeffd.learners.steady import STEADY, SteadyEstimator, identified_fit, term_sources
from coeffd.learners.targets import ALPHA_STEADY, ALPHA_TARGETS, STEADY_TWINS, make_learner
from coeffd.records.observations import (
    KVTransferObservation,
    Observation,
    RequestObservation,
    StepObservation,
)

__all__ = ["RECENT_ROWS", "LearnerSet"]

_log = structlog.get_logger(__name__)

FloatArray = npt.NDArray[np.float64]

#: Step feature rows kept per configuration: the "recent batch mix" the publisher judges
#: a new β on (how much would it change the predicted step times of these batches).
RECENT_ROWS = 256
#: Rows of memory of the share of exact (per-request) step compositions: summary-only
#: steps come in runs (bursts of requests whose journeys are not all known yet; runs of
#: up to ~1,400 steps at every-step sampling on simfleet), and one must not flip the
#: choice; a change of journey sampling is followed after ~7,000 steps (a minute or two).
EXACT_SHARE_MEMORY = 10_000
#: BLIS's shipped β as an array (every step is scored against it)
_DEFAULT_BETA = np.asarray(BLIS_DEFAULT_BETA, dtype=np.float64)
#: BLIS's shipped α by target (each finished request is scored against them)
_DEFAULT_ALPHA: dict[str, float] = dict(zip(ALPHA_TARGETS, BLIS_DEFAULT_ALPHA, strict=True))


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
        self._steady: dict[str, SteadyEstimator] = {}  # target → its published estimator
        #: target → SteadyEstimator state, restored before the learners exist
        self._steady_state: dict[str, dict[str, Any]] = {}
        self._recent = np.zeros((RECENT_ROWS, len(TERM_NAMES)))
        self._recent_n = 0
        #: share of step observations with a per-request composition (see _exact_first):
        #: their running mean over the first EXACT_SHARE_MEMORY rows, then an EW mean
        self.exact_share = 0.0
        self.exact_rows = 0
        #: step observations not learned: only BATCH_SUMMARY totals while exact ones flow
        self.approximate_skipped = 0
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

    def learner(self, target: str) -> RLSRegressor:
        """The learner of ``target``, created on first use."""
        m = self.learners.get(target)
        if m is None:
            m = self.make(target)
            self.learners[target] = m
        return m

    def make(self, target: str) -> RLSRegressor:
        """A fresh learner of ``target`` with this set's priors (:mod:`learners.targets`)."""
        return make_learner(
            target,
            self.settings,
            self.beta_prior,
            self.beta_precision,
            self.alpha_prior,
            label=f"{self.config.id}/{target}",
        )

    def steady(self, target: str = "beta") -> SteadyEstimator:
        """The published estimator of ``target`` (β or an α, :data:`STEADY_TWINS`): its
        fast tracker + its long-memory twin."""
        est = self._steady.get(target)
        if est is None:
            d = self.settings.drift
            est = SteadyEstimator(
                self.learner(target),
                self.learner(STEADY_TWINS[target]),
                keep=d.keep,
                fast_forgetting=d.fast_forgetting,
                fast_for=d.fast_for,
            )
            if target in self._steady_state:
                est.load_state(self._steady_state[target])
            self._steady[target] = est
        return est

    def published_learner(self, target: str) -> RLSRegressor | None:
        """The learner whose estimate of ``target`` is published now: with a long-memory
        twin, its estimator's :attr:`SteadyEstimator.published` (the twin in steady state,
        the fast tracker while it tracks a change; its mode restored from a checkpoint),
        else the fast tracker. The one place the snapshot, its error bars and the fleet
        model (``learners.fleet.members.member_stats``) decide it."""
        fast = self.learners.get(target)
        if (
            fast is None
            or not self.settings.steady
            or STEADY_TWINS.get(target) not in self.learners
        ):
            return fast
        return self.steady(target).published

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
        m = self.published_learner("beta")
        if m is None or not self.regime_terms():
            return {}
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

    def learn_requests(
        self, requests: Sequence[RequestObservation], evaluator: Evaluator | None
    ) -> tuple[list[Scored], int]:
        """:meth:`learn` of many finished requests (a joiner burst): the same predictions,
        updates and scores, in one loop; returns the scores and how many of the requests
        scored anything (the others were rejected)."""
        out = self.learn_request_scores(requests, evaluator)
        return out.scored(), out.learned

    def learn_request_scores(
        self, requests: Sequence[RequestObservation], evaluator: Evaluator | None
    ) -> RequestScores:
        """:meth:`learn_requests` with the scores as tuples (what the learning consumer's
        metrics take, without a :class:`Scored` and a dict per score)."""
        rows: list[RequestScore] = []
        learned = 0
        for obs in requests:
            k = len(rows)
            self._request_rows(obs, rows)
            if len(rows) > k:
                learned += 1
        if evaluator is not None and rows:
            evaluator.add_scored_rows(self.config.id, rows)
        if learned:
            self.version += learned
            self.observations += learned
            self.updated_wall_ns = time.time_ns()
        return RequestScores(rows, learned)

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
        scores = self.learn_step_scores(steps, evaluator)
        return [] if scores is None else scores.rows()

    def learn_step_scores(
        self, steps: Sequence[StepObservation], evaluator: Evaluator | None
    ) -> StepScores | None:
        """:meth:`learn_steps` with the scores as columns (None when nothing was learned):
        what the learning consumer's metrics take, without a dict per row."""
        if self.basis is None or not steps:
            return None
        steps = self._exact_first(steps)
        if not steps:
            return None
        beta = self.learner("beta")
        ev = self.settings.evaluation
        x_all, xe_all = step_rows(steps, self.basis, self.config, extended=self.settings.extended)
        y_all = np.array([obs.period_us for obs in steps], dtype=np.float64)
        good = np.isfinite(x_all).all(axis=1) & np.isfinite(y_all) & (y_all > 0)
        if not good.all():
            beta.n_rejected += int((~good).sum())
            steps = [obs for obs, ok in zip(steps, good.tolist(), strict=True) if ok]
            x_all, y_all = x_all[good], y_all[good]
            xe_all = None if xe_all is None else xe_all[good]
        if not steps:
            return None
        aggs = [obs.aggregates for obs in steps]
        regimes = step_regimes(
            np.array([a.prefill_tokens for a in aggs], dtype=np.float64),
            np.array([a.decode_tokens for a in aggs], dtype=np.float64),
            np.array([a.kv_usage_gpu_ratio for a in aggs], dtype=np.float64),
            heavy_fraction=ev.heavy_fraction,
            kv_saturated=ev.kv_saturated,
        )
        ys = y_all.tolist()
        if beta.drift is not None:
            beta.drift.clock_ns = steps[-1].start_mono_ns
        if self.settings.steady:
            learned = self.steady().learn_many_prequential(x_all, y_all)
        else:
            learned = beta.learn_many_prequential(x_all, y_all)
        self._remember(x_all)
        default = x_all @ _DEFAULT_BETA
        extended = np.full(len(ys), np.nan)
        if xe_all is not None:
            xe_all = np.concatenate([x_all, xe_all], axis=1)
            ok = np.isfinite(xe_all).all(axis=1)
            if ok.all():  # the usual burst: no copies of the rows learned
                extended = self.learner("beta_extended").learn_many_prequential(
                    xe_all, y_all, nonnegative=False
                )
            elif ok.any():
                extended[ok] = self.learner("beta_extended").learn_many_prequential(
                    xe_all[ok], y_all[ok], nonnegative=False
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
        self.version += len(ys)
        self.observations += len(ys)
        self.updated_wall_ns = time.time_ns()
        return StepScores(y_all, columns, regimes)

    def _exact_first(self, steps: Sequence[StepObservation]) -> Sequence[StepObservation]:
        """The steps to learn: those with only BATCH_SUMMARY totals (``AGGREGATES``) are
        left out while most of the configuration's steps come with their requests.

        Why: the totals give no per-request context, so the decode KV and prefill
        attention terms are estimated (:meth:`BlisBasis.terms_from_aggregates`) — from KV
        blocks in use, which prefix-shared blocks make too low. On simfleet with a prefix
        cache those rows' terms put the true step time 1.0 % low on average (5 % of them
        more than 2.5 %), in bursts; learned beside exact rows they biased every regime
        (0.8–4.6 % vs the noiseless truth at every-step sampling) and set off the
        long-memory learner's drift and lag tests over and over, so published versions
        wobbled by several percent. With nothing better (journeys not traced), they are
        still what there is, and are learned.
        """
        exact = have_requests(steps)
        share, n = self.exact_share, self.exact_rows
        if all(exact):  # the usual burst: every step kept, only the share moves
            for _ in exact:
                # a running mean at first: the first rows already tell what this stream
                # carries (a long-memory learner would keep early summary-only rows for
                # ~10,000 rows)
                n = n + 1 if n < EXACT_SHARE_MEMORY else EXACT_SHARE_MEMORY
                share += (1.0 - share) / n
            self.exact_share, self.exact_rows = share, n
            return steps
        keep: list[StepObservation] = []
        for obs, e in zip(steps, exact, strict=True):
            n = n + 1 if n < EXACT_SHARE_MEMORY else EXACT_SHARE_MEMORY
            share += ((1.0 if e else 0.0) - share) / n
            if e or share < 0.5:
                keep.append(obs)
        self.exact_share, self.exact_rows = share, n
        self.approximate_skipped += len(steps) - len(keep)
        return keep

    def _learn_request(self, obs: RequestObservation, evaluator: Evaluator | None) -> list[Scored]:
        rows: list[RequestScore] = []
        self._request_rows(obs, rows)
        if evaluator is not None and rows:
            evaluator.add_scored_rows(self.config.id, rows)
        return RequestScores(rows, 1 if rows else 0).scored()

    def _request_rows(self, obs: RequestObservation, out: list[RequestScore]) -> None:
        """Predict and learn one finished request's targets; its scores go to ``out``
        (one tuple each: a finished request is learned per observation, and the
        per-score objects cost as much as the learning), for the evaluator to take a
        burst's at once (:meth:`Evaluator.add_scored_rows`)."""
        default = _DEFAULT_ALPHA
        steady = self.settings.steady
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
            m = self.learners.get(target) or self.learner(target)
            if not (math.isfinite(y) and y >= 0):
                m.n_rejected += 1
                continue
            y = float(y)
            if steady:
                # long memory in steady state as for β: α0 rows scatter ±50 % (the
                # loop wait is only known in expectation), so ~2,000 rows of memory
                # left α0 ±1 % — ±0.4 % of TTFT, α0 being ~40 % of it (bench closedloop)
                est = self._steady.get(target) or self.steady(target)
                learned = est.learn_intercept_prequential(y)
            else:
                learned = m.intercept_prequential()
                m.learn_intercept(y)
            out.append((target, y, learned, default[target]))
        qs = obs.queue_state
        if obs.queue_wait_us is not None and qs is not None:
            m = self.learners.get("queue_wait") or self.learner("queue_wait")
            xq = {
                "one": 1.0,
                "waiting_depth": float(qs.waiting_depth),
                "running_depth": float(qs.running_depth),
                "kv_usage": float(qs.kv_usage_gpu_ratio),
            }
            y = float(obs.queue_wait_us)
            if math.isfinite(y):
                p = m.predict_prequential(xq, nonnegative=False)
                out.append(("queue_wait", y, p, None))
            m.learn_one(xq, y)

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
            scored.append(
                self._score(
                    evaluator,
                    target,
                    y,
                    {"learned": m.predict_prequential(x, nonnegative=False)},
                    None,
                )
            )
        m.learn_one(x, y)
        return scored

    # -------------------------------------------------------------- output

    def vector(
        self, name: str, evaluator: Evaluator | None, threshold: float
    ) -> VectorEstimate | None:
        m = self.learners.get(name)
        if m is None:
            return None
        estimate = ""
        sources: dict[str, str] = {}
        twin = STEADY_TWINS.get(name)
        if name in ALPHA_TARGETS and self.settings.steady and twin in self.learners:
            est = self.steady(name)
            estimate, m = est.mode, est.published
        elif name == "beta" and self.settings.steady and twin in self.learners:
            # the published β: the long-memory learner in steady state, identified
            # directions from its data and the rest from the (pooled) prior
            est = self.steady()
            estimate = est.mode
            slow = est.slow
            fit, share = identified_fit(slow, self.settings.identify_max_rel_std)
            a_data, _ = slow.data_information()
            sources = term_sources(m.features, share, np.diag(a_data) > 0)
            m = est.published
        blis = (
            name in ("beta", "beta_steady")
            or name in ALPHA_TARGETS
            or name in ALPHA_STEADY
            or name in ("kv_store", "kv_load")
        )
        prior = np.asarray(m.prior_mean if m.prior_mean is not None else np.zeros(len(m.features)))
        raw = m.coef
        values = m.nonnegative_coef() if blis else raw
        ident = m.identified(threshold)
        if sources:
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
        return VectorEstimate(
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
            "exact_share": self.exact_share,
            "exact_rows": self.exact_rows,
            # "steady": β's (the key older checkpoints carry); "steady_alpha": the α's
            "steady": self._steady["beta"].state_dict() if "beta" in self._steady else {},
            "steady_alpha": {t: e.state_dict() for t, e in self._steady.items() if t != "beta"},
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Resume what the set learned from :meth:`state_dict` output: learners, baseline,
        counters and the published estimators' modes. Its configuration and priors are
        the constructor's (:class:`~learners.registry.LearnerRegistry` builds the set from
        the same state's)."""
        self.learners = {}
        for name, st in state["learners"].items():
            m = RLSRegressor([])  # parameters and all come from its state
            m.load_state(st)
            self.learners[name] = m
        self.baseline.coef = np.asarray(state["baseline"], dtype=float)
        self.version = int(state["version"])
        self.observations = int(state["observations"])
        self.created_wall_ns = int(state["created_wall_ns"])
        self.updated_wall_ns = int(state["updated_wall_ns"])
        # absent in checkpoints from before it existed (then: decided afresh)
        share, rows = state.get("exact_share", 0.0), state.get("exact_rows", 0)
        if isinstance(share, int | float) and 0 <= share <= 1 and isinstance(rows, int):
            self.exact_share, self.exact_rows = float(share), max(0, rows)
        # the estimators are built on first use, on the restored learners
        steady = {"beta": state.get("steady") or {}, **(state.get("steady_alpha") or {})}
        self._steady = {}
        self._steady_state = {t: dict(v) for t, v in steady.items() if v}


def _publishable(v: FloatArray, n: int) -> bool:
    return bool(v.shape == (n,) and np.all(np.isfinite(v)) and np.all(v >= 0))
