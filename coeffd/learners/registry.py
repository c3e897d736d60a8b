"""Per-configuration learner sets, created on first sight, bounded, checkpointable.

:class:`LearnerRegistry` keeps one :class:`~learners.learnerset.LearnerSet` per
configuration id (what each set learns: :mod:`learners.targets`). New sets start from
the :class:`~learners.prior.PooledPrior` of similar known configurations, and every
snapshot feeds those pools. The number of live sets is bounded (LRU); an evicted set is
reduced to its ``state_dict`` (handed to ``on_evict`` for a checkpoint, and parked in
memory, bounded) and restored exactly when its configuration is seen again. A
checkpoint's state is checked whole before it is loaded (:meth:`LearnerRegistry.check_state`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import structlog

from coeffd.learners.config import LearnersConfig
from coeffd.learners.estimates import (
    ConfigEstimate,
    RequestScores,
    Scored,
    StepScores,
    VectorEstimate,
)
from coeffd.learners.evaluation import Evaluator
from coeffd.learners.features import BLIS_DEFAULT_ALPHA, BLIS_DEFAULT_BETA, BlisBasis
from coeffd.learners.features.config import BasisResolver, ServingConfig
from coeffd.learners.learnerset import LearnerSet
from coeffd.learners.prior import PooledPrior
from coeffd.learners.rls import RLSRegressor
from coeffd.learners.targets import ALPHA_TARGETS
from coeffd.records.observations import Observation, RequestObservation, StepObservation

__all__ = ["LearnerRegistry"]

_log = structlog.get_logger(__name__)


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
        fresh = ls.make(name)  # the learner of that name today (KeyError: no such target)
    except KeyError:
        raise ValueError(f"unknown learner {name!r}") from None
    if list(fresh.features) != list(m.features):
        raise ValueError(f"learner {name!r}: features {list(m.features)} are not this version's")
    n = len(m.features)
    coef = np.asarray(m.coef, dtype=float)
    if coef.shape != (n,) or np.asarray(m.coef_std()).shape != (n,):
        raise ValueError(f"learner {name!r}: state does not match its {n} features")
    m.predict_prequential(dict.fromkeys(m.features, 1.0), nonnegative=False)


class LearnerRegistry:
    """Learner sets by configuration id (LRU-bounded), with pooled priors and evaluation.

    Usage (see ``tests/learners/test_registry.py``)::

        reg = LearnerRegistry(LearnersConfig(), on_evict=checkpoint_writer)
        for obs in observations:
            scored = reg.learn(serving_config, obs)   # prequential predictions, for metrics
        est = reg.estimate(serving_config.id)          # ConfigEstimate: alpha, beta, detail
        reg.pool(est)                                  # what new configurations' priors see
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
        #: step observations left out for an approximate composition (LearnerSet._exact_first)
        self.approximate_skipped = 0
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
        if isinstance(obs, StepObservation):
            return self.learn_steps(config, [obs])
        ls = self.ensure(config)
        out = ls.learn(obs, self.evaluator)
        if not out:
            self.rejected += 1
        return out

    def learn_requests(
        self, config: ServingConfig, requests: Sequence[RequestObservation]
    ) -> tuple[list[Scored], int]:
        """:meth:`learn` for many finished requests of one configuration, in one loop;
        returns the scores and how many requests scored anything."""
        out = self.learn_request_scores(config, requests)
        return out.scored(), out.learned

    def learn_request_scores(
        self, config: ServingConfig, requests: Sequence[RequestObservation]
    ) -> RequestScores:
        """:meth:`learn_requests` with the scores as tuples (the learning consumer's path)."""
        out = self.ensure(config).learn_request_scores(requests, self.evaluator)
        self.rejected += len(requests) - out.learned
        return out

    def learn_steps(self, config: ServingConfig, steps: Sequence[StepObservation]) -> list[Scored]:
        """:meth:`learn` for many step observations of one configuration (vectorised)."""
        scores = self.learn_step_scores(config, steps)
        return [] if scores is None else scores.rows()

    def learn_step_scores(
        self, config: ServingConfig, steps: Sequence[StepObservation]
    ) -> StepScores | None:
        """:meth:`learn_steps` with the scores as columns (None when nothing was learned)."""
        ls = self.ensure(config)
        skipped = ls.approximate_skipped
        out = ls.learn_step_scores(steps, self.evaluator)
        skipped = ls.approximate_skipped - skipped
        self.approximate_skipped += skipped
        self.rejected += len(steps) - (0 if out is None else len(out)) - skipped
        return out

    # -------------------------------------------------------------- output

    def _set_or_parked(self, config_id: str) -> LearnerSet:
        ls = self._sets.get(config_id)
        if ls is None:
            parked = self._parked.get(config_id)
            if parked is None:
                raise KeyError(config_id)
            ls = self._from_state(parked)
        return ls

    def estimate(self, config_id: str) -> ConfigEstimate:
        """Current valid coefficients and metadata of a configuration (a pure query:
        :meth:`pool` is what lets other configurations' priors learn from it)."""
        ls = self._set_or_parked(config_id)
        th = self.settings.identify_threshold
        vectors: dict[str, VectorEstimate] = {}
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
        errors = {
            t: self.evaluator.summary(config_id, t) for t in self.evaluator.targets(config_id)
        }
        return ConfigEstimate(
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

    def pool(self, estimate: ConfigEstimate) -> None:
        """Add a configuration's published vectors to the pooled priors of new ones (the
        publisher calls it with what it publishes)."""
        ls = self._set_or_parked(estimate.config_id)
        vectors, key = estimate.vectors, estimate.config_id
        if "beta" in vectors and vectors["beta"].observations > 0:
            vb = vectors["beta"]
            self.beta_pool.add(ls.config, vb.values, vb.identified, vb.n_effective, key=key)
        alpha_n = [vectors[t].n_effective for t in ALPHA_TARGETS if t in vectors]
        if len(alpha_n) == len(ALPHA_TARGETS):
            self.alpha_pool.add(ls.config, estimate.alpha, None, min(alpha_n), key=key)

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
                scratch.estimate(cid)  # every published vector (steady β included) computes
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
        ls.load_state(state)
        return ls
