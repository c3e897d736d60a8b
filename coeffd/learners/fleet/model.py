"""The fleet model: one α/β for every configuration, and coefficients for unseen ones.

Length: one estimator (fit, candidates, LOCO, choice) whose parts read the same stacked
statistics.

BLIS ships one ``trained_physics_coefficients`` block for every model, GPU and TP: its
basis carries the physics (FLOPs over peak FLOP/s, bytes over bandwidth, ring factors),
so one vector can serve all configurations. coeffd learns one vector per configuration;
:class:`FleetModel` fits the one vector jointly over all of them, and predicts
coefficients for a configuration nobody has deployed.

Joint fit. Every member brings the information ``(A_c, b_c)`` of the learners its
configuration publishes, with its own quirk marginalised out (:mod:`learners.fleet.members`).
The statistics of independent streams add, so the joint least-squares fit over every
configuration's observations is one solve of ``(Σ w_c A_c + A₀) θ = Σ w_c b_c + b₀``
(non-negative: :func:`learners.nnls.nnls_information`), with BLIS's shipped vector as a
weak prior ``A₀`` for terms no configuration excites. Forgetting and drift handling are
the members' own: a configuration that drifted has just had its information scaled down,
so it counts little in the fleet until it has re-learned — the fleet tracks a changed
configuration exactly as fast as that configuration's published vector does.

Configuration weights ``w_c = min(1, n_ref / n_eff,c)``, ``n_ref`` the median effective
sample size. Why: the fleet vector is for configurations the fleet has *not* seen, so
each configuration is one sample of "a configuration" and should count about equally; a
chatty one (many engines, long memory) would otherwise pull the shared vector toward its
own idiosyncrasy. Capping at 1 rather than normalising every configuration to the same
weight keeps a quiet configuration (a few rows, or just after a drift alarm) at its own
small weight: inflating its information would claim a precision its few rows do not have.

Honest error: **leave one configuration out** (LOCO). For each configuration with recent
step rows (its learner's batch-refit window), the fleet is refitted without it and scored
on those rows (mean absolute percentage error), beside BLIS's shipped vector on the same
rows. Three more candidates for an unseen configuration are scored the same way:
``fleet_local``, the joint fit with each configuration's weight multiplied by its
similarity to the target (``floor + sim⁴``: same GPU, model, TP count most);
``fleet_factors``, the joint fit of a shared vector plus ridge-shrunk offsets per GPU,
model family and TP degree, combined for the target's levels (:mod:`learners.fleet.factors`:
"A100s are slower on these terms, TP-4 rings cost more per all-reduce" learned separately
and added up for a combination nobody has deployed); and ``pooled_prior``, the registry's
similarity-weighted average of learned vectors (:mod:`learners.prior`).
:meth:`FleetModel.predict` uses the candidate with the lowest LOCO error on the known
configurations most like the target (similarity kernel) — unless ``fleet_factors`` is
within one standard error of it (:func:`one_se_choice`) — and states its expected error
(:mod:`learners.fleet.error`).

Why the one-standard-error rule, and why for ``fleet_factors``. LOCO scores each candidate
on the left-out configuration's own recent steps, i.e. at the load it was learned at;
coefficients pulled for an unseen configuration are used at other loads (a loaded engine
runs batches several times larger, where the decode-KV and decode-compute terms weigh
far more than in the learning steps). Candidates that fit the learning steps equally well
can extrapolate very differently, and a LOCO difference within noise says nothing about
which does. The factor model is the one that extrapolates most steadily: its held-out
predictions of the step time on the configurations' fixed decode-heavy and mixed batches
(:func:`learners.evaluation.regime_batches`) move least when one more configuration is
left out, and are the closest to the truth. So where the relatives cannot tell the factor
model from the best candidate (paired differences of their LOCO errors, kernel-weighted:
mean ≤ one standard error), the factor model is used: cross-validation's
one-standard-error rule, with the steadiest model where the rule takes the simplest.
(Measurements: ``bench/README.md``, "How the fleet model got here".)

Why hysteresis. Every refit (each ``FLEET_INTERVAL_S``, on new rows) moves the LOCO errors
by about their standard error, so a target whose candidates sit near the one-SE line
flipped between them from one refit to the next — the same unseen setup answered
``fleet_factors, 3.6 %`` and a minute later ``fleet_local, 14.3 %`` (the two sources state
their error on different bases). A source once answered for a target (``incumbent``) is
kept while it stays within :data:`KEEP_SE` standard errors of the best: the one-SE rule
decides where to enter, the wider band where to leave, so refit noise no longer flips it.

References
----------
Hastie, T., Tibshirani, R. and Friedman, J. (2009). *The Elements of Statistical
Learning*, 2nd ed., section 7.10 (cross-validation; the one-standard-error rule).

Roberts, D. R. et al. (2017). Cross-validation strategies for data with temporal,
spatial, hierarchical, or phylogenetic structure. *Ecography* 40(8), 913–929 (leaving
out whole groups when the model is for new groups).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from coeffd.learners.features import BLIS_DEFAULT_ALPHA, BLIS_DEFAULT_BETA
from coeffd.learners.fleet.error import factor_error, relatives_error, row_moments
from coeffd.learners.fleet.factors import FactorCandidate
from coeffd.learners.fleet.members import (
    QUIRK,
    MemberStats,
    discount_quirks,
    is_finite,
    member_stats,
    row_noise,
)
from coeffd.learners.fleet.results import FleetResult, LocoError, Prediction
from coeffd.learners.nnls import nnls_information
from coeffd.learners.prior import DEFAULT_SIMILARITY_WEIGHTS, PooledPrior, prior_precision
from coeffd.learners.targets import ALPHA_TARGETS

if TYPE_CHECKING:
    from coeffd.learners.registry import LearnerRegistry

__all__ = [
    "FLEET_SIMILARITY_WEIGHTS",
    "KEEP_SE",
    "PREFERRED_SOURCE",
    "SOURCES",
    "FleetModel",
    "one_se_choice",
    "paired_excess",
]

FloatArray = npt.NDArray[np.float64]

#: Who counts as a relative in ``fleet_local`` and in a prediction's expected error: the
#: GPU first. The basis already carries the model's architecture (FLOPs, bytes, layers)
#: and the parallelism, not the hardware's achieved efficiency (share of peak FLOP/s and
#: bandwidth, host overheads), so configurations on the same GPU share most of what a
#: joint fit cannot express. (The pooled prior weighs the model first: a configuration's
#: own constant terms are model-specific.)
FLEET_SIMILARITY_WEIGHTS: dict[str, float] = DEFAULT_SIMILARITY_WEIGHTS | {
    "gpu": 4.0,
    "model": 1.0,
}
#: Largest fleet in which the ``pooled_prior`` candidate is scored (see ``result``).
POOLED_MAX_MEMBERS = 32
#: Candidates for an unseen configuration, scored by LOCO, plus the reference.
SOURCES: tuple[str, ...] = ("fleet", "fleet_local", "fleet_factors", "pooled_prior")
#: The candidate preferred when the relatives' LOCO errors cannot tell it from the best
#: (:func:`one_se_choice`; module docs: it extrapolates most steadily to other loads).
PREFERRED_SOURCE = "fleet_factors"
#: Standard errors within which the source answered before for a target is kept (module
#: docs, "Why hysteresis"): twice the one-SE rule's band.
KEEP_SE = 2.0


def paired_excess(a: FloatArray, b: FloatArray, weights: FloatArray) -> tuple[float, float]:
    """``(excess, se)``: weighted mean of ``a - b`` and its standard error (standard
    deviation / √(n_eff − 1), ``n_eff = (Σw)² / Σw²``).

    >>> paired_excess(np.array([1.5, 2.5]), np.array([1.0, 2.0]), np.ones(2))
    (0.5, 0.0)
    """
    w = np.asarray(weights, dtype=float)
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    excess = float(w @ d / w.sum())
    sd = math.sqrt(float(w @ (d - excess) ** 2 / w.sum()))
    n_eff = float(w.sum() ** 2 / (w @ w))
    return excess, sd / math.sqrt(max(n_eff - 1.0, 1.0))


def one_se_choice(
    errors: Mapping[str, FloatArray],
    weights: FloatArray,
    prefer: str = PREFERRED_SOURCE,
    incumbent: str | None = None,
) -> tuple[str, str]:
    """``(chosen, best)`` of candidates scored on the same configurations.

    ``errors[source][i]``: the source's LOCO error on configuration ``i``, whose weight is
    ``weights[i]``. ``best`` has the lowest weighted mean error; ``chosen`` is
    ``incumbent`` (the source answered before) while its paired differences to ``best``
    have a weighted mean within :data:`KEEP_SE` standard errors (:func:`paired_excess`),
    else ``prefer`` within one standard error, else ``best``.

    >>> w = np.ones(4)
    >>> one_se_choice({"a": np.array([1.0, 2, 3, 4]), "b": np.array([1.2, 1.8, 3.3, 3.9])}, w, "b")
    ('b', 'a')
    >>> one_se_choice({"a": np.array([1.0, 2, 3, 4]), "b": np.array([1.5, 2.5, 3.6, 4.4])}, w, "b")
    ('a', 'a')
    >>> one_se_choice({"a": np.array([1.0, 2, 3, 4]), "b": np.array([1.5, 2.5, 3.6, 4.4])}, w, "a",
    ...               incumbent="b")
    ('a', 'a')
    >>> one_se_choice({"a": np.array([1.0, 2, 3, 4]), "b": np.array([1.1, 2.0, 3.2, 4.0])}, w, "a",
    ...               incumbent="b")
    ('b', 'a')
    """
    w = np.asarray(weights, dtype=float)
    mean = {s: float(w @ e / w.sum()) for s, e in errors.items()}
    best = min(mean, key=lambda s: mean[s])
    for source, band in ((incumbent, KEEP_SE), (prefer, 1.0)):
        if source is None or source not in errors:
            continue
        if source == best:
            return best, best
        excess, se = paired_excess(errors[source], errors[best], w)
        if excess <= band * se:
            return source, best
    return best, best


def _valid(v: FloatArray, n: int) -> bool:
    return bool(v.shape == (n,) and np.all(np.isfinite(v)) and np.all(v >= 0) and np.any(v > 0))


class FleetModel:
    """Joint fit over configurations' learner statistics (see module docs).

    Parameters
    ----------
    members
        Per-configuration statistics (:func:`~learners.fleet.members.member_stats`, or
        :meth:`from_registry`).
    pool
        The registry's β pool, scored as the ``pooled_prior`` candidate (optional).
    strength, floor
        Prior (BLIS's shipped vector) strength in relative units (:mod:`learners.prior`).
    similarity_weights, sharpness, local_floor
        Similarity kernel ``local_floor + sim^sharpness`` of ``fleet_local`` and of the
        expected error of a prediction.
    min_rows
        Rows a configuration needs to be scored by LOCO.
    quirk
        Relative standard deviation of a configuration's own quirk
        (:data:`~learners.fleet.members.QUIRK`; 0: every member's information taken at
        face value).

    Examples
    --------
    >>> import numpy as np
    >>> from coeffd.learners.features import BLIS_DEFAULT_BETA
    >>> truth = np.array(BLIS_DEFAULT_BETA) * 1.2
    >>> rng = np.random.default_rng(0)
    >>> members = []
    >>> for k, gpu in enumerate(["H100", "A100-80", "H100"]):
    ...     x = rng.uniform(0.0, 100.0, size=(200, 11))
    ...     y = x @ truth
    ...     w = 1.0 / y**2
    ...     members.append(MemberStats(
    ...         key=f"c{k}", description={"model": "m", "gpu": gpu, "tp": 1},
    ...         beta_a=(x * w[:, None]).T @ x, beta_b=x.T @ (w * y), beta_n=200.0,
    ...         rows_x=x, rows_y=y))
    >>> fm = FleetModel(members)
    >>> r = fm.result()
    >>> sorted(r.loco), all(min(r.beta[i], truth[i]) >= 0 for i in range(11))
    (['c0', 'c1', 'c2'], True)
    >>> r.loco["c0"]["fleet"].mape < 0.01 < 0.1 < r.loco["c0"]["blis_default"].mape
    True
    >>> p = fm.predict({"model": "m", "gpu": "H100", "tp": 2})
    >>> p.source in ("fleet", "fleet_local", "fleet_factors"), p.expected_error < 0.01
    (True, True)
    """

    def __init__(
        self,
        members: Iterable[MemberStats],
        *,
        pool: PooledPrior | None = None,
        strength: float = 0.01,
        floor: float = 1.0,
        similarity_weights: Mapping[str, float] | None = None,
        sharpness: float = 4.0,
        local_floor: float = 0.02,
        min_rows: int = 20,
        quirk: float = QUIRK,
    ) -> None:
        given = list(members)
        # Learners never hold non-finite information (they reject such rows), but a
        # member that did would poison every fit: it is left out and named.
        self.rejected = tuple(m.key for m in given if not is_finite(m))
        self.members = {m.key: m for m in given if is_finite(m)}
        self.pool = pool
        self.floor = floor
        self.sharpness = sharpness
        self.local_floor = local_floor
        self.min_rows = min_rows
        self._sim = PooledPrior(
            BLIS_DEFAULT_BETA, weights=similarity_weights or FLEET_SIMILARITY_WEIGHTS
        )
        d = np.asarray(BLIS_DEFAULT_BETA, dtype=float)
        #: BLIS's shipped β, the weak prior's mean and every fallback
        self.default_beta = d
        #: the weak prior's information ``(A₀, b₀)`` on β
        self.prior_a = np.diag(prior_precision(d, strength, floor))
        self.prior_b = self.prior_a @ d
        da = np.asarray(BLIS_DEFAULT_ALPHA, dtype=float)
        #: BLIS's shipped α and the weak prior's precision on each α target
        self.default_alpha = da
        self.alpha_prior = prior_precision(da, strength, floor)
        self.weights = self._weights([m.beta_n for m in self.members.values()])
        #: per α target, each member's weight (as :attr:`weights` for β)
        self.alpha_weights = [
            self._weights([m.alpha_n[j] for m in self.members.values()])
            for j in range(len(ALPHA_TARGETS))
        ]
        # Stacked, pre-weighted statistics: a fit with per-member multipliers is then two
        # tensor contractions (a refit scores K configurations × 3 candidates, each a
        # weighted sum over K members: K = 128 took 1.3 s as Python loops).
        keys = list(self.members)
        self._index = {k: i for i, k in enumerate(keys)}
        w = np.array([self.weights[k] for k in keys])
        n = len(keys)
        #: ``(K, d, d)`` and ``(K, d)``: every member's β information, weighted (and with
        #: its quirk marginalised out), in the order of :attr:`members`
        self.weighted_a = (
            np.stack([m.beta_a for m in self.members.values()]) * w[:, None, None]
            if n
            else np.zeros((0, *self.prior_a.shape))
        )
        self.weighted_b = (
            np.stack([m.beta_b for m in self.members.values()]) * w[:, None]
            if n
            else np.zeros((0, len(d)))
        )
        self.quirk = quirk
        #: each member's (variance, mean absolute value) of relative step noise
        self._noise = {k: row_noise(m) for k, m in self.members.items()}
        if quirk > 0 and n:
            self.weighted_a, self.weighted_b = discount_quirks(
                self.weighted_a,
                self.weighted_b,
                list(self.members.values()),
                quirk,
                prior=(self.prior_a, self.prior_b),
                floor=floor,
                noise=[v for v, _ in self._noise.values()],
            )
        #: every member's description, in the order of :attr:`members`
        self.descriptions = [m.description for m in self.members.values()]
        self._desc_row = {id(dsc): i for i, dsc in enumerate(self.descriptions)}
        self._member_sims: FloatArray | None = None
        self._full: FloatArray | None = None
        self._result: FleetResult | None = None
        self._factors: FactorCandidate | None = None
        self._moments: FloatArray | None = None

    @classmethod
    def from_registry(
        cls, registry: LearnerRegistry, exclude: Sequence[str] = (), **kw: Any
    ) -> FleetModel:
        """Statistics of every live configuration of ``registry`` (minus ``exclude``, also
        left out of the pooled prior)."""
        members = []
        for cid in registry.ids():
            ls = registry.get(cid)
            if ls is None or cid in exclude:
                continue
            m = member_stats(ls)
            if m is not None:
                members.append(m)
        if "pool" not in kw:
            # a private copy: the registry's pool changes on the worker thread while
            # readers predict, and a left-out configuration must not leak through it
            src = registry.beta_pool
            pool = PooledPrior(src.default.tolist(), src.strength, src.floor)
            pool.load_state(src.state_dict())
            for key in exclude:
                pool.remove(key)
            kw["pool"] = pool
        kw.setdefault("strength", registry.settings.prior_strength)
        kw.setdefault("quirk", registry.settings.fleet_quirk)
        kw.setdefault("floor", registry.settings.prior_scale_floor)
        return cls(members, **kw)

    def __len__(self) -> int:
        return len(self.members)

    def _weights(self, n_eff: Sequence[float]) -> dict[str, float]:
        keys = list(self.members)
        pos = [n for n in n_eff if n > 0]
        if not pos:
            return dict.fromkeys(keys, 0.0)
        ref = statistics.median(pos)
        return {k: (min(1.0, ref / n) if n > 0 else 0.0) for k, n in zip(keys, n_eff, strict=True)}

    def member_row(self, description: Mapping[str, Any]) -> int | None:
        """The row of the member whose description this is (the very object), else None."""
        return self._desc_row.get(id(description))

    def or_default(self, theta: FloatArray) -> FloatArray:
        """``theta`` if BLIS would take it (finite, non-negative, not all 0), else a copy
        of BLIS's shipped vector."""
        return theta if _valid(theta, len(self.default_beta)) else self.default_beta.copy()

    # ------------------------------------------------------------------ fits

    def similarity(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
        """Similarity of two configuration descriptions (:meth:`PooledPrior.similarity`)."""
        return self._sim.similarity(a, b)

    def kernel(
        self, description: Mapping[str, Any], exclude: str | None = None
    ) -> dict[str, float]:
        """Similarity weight of every member for a target description."""
        sims = self._similarities(description)
        return {
            k: self.local_floor + float(sims[i]) ** self.sharpness
            for k, i in self._index.items()
            if k != exclude
        }

    def _similarities(self, description: Mapping[str, Any]) -> FloatArray:
        """:meth:`similarity` of ``description`` to every member, one pass per field."""
        i = self.member_row(description)
        if i is not None:  # a member's own description (LOCO): one matrix for all of them
            if self._member_sims is None:
                self._member_sims = self._similarity_matrix()
            return self._member_sims[i]  # type: ignore[no-any-return]
        hit = np.zeros(len(self.descriptions))
        total = np.zeros(len(self.descriptions))
        for key, w in self._sim.weights.items():
            mine = description.get(key)
            for i, d in enumerate(self.descriptions):
                if key in description or key in d:
                    total[i] += w
                    if d.get(key) == mine:
                        hit[i] += w
        return np.divide(hit, total, out=np.zeros_like(hit), where=total > 0)  # type: ignore[no-any-return]

    def _similarity_matrix(self) -> FloatArray:
        """Member × member :meth:`similarity`, vectorised per field."""
        n = len(self.descriptions)
        hit = np.zeros((n, n))
        total = np.zeros((n, n))
        for key, w in self._sim.weights.items():
            present = np.array([key in d for d in self.descriptions])
            seen: dict[Any, int] = {}  # equal values (as == sees them) share a code
            codes = np.array([seen.setdefault(d.get(key), len(seen)) for d in self.descriptions])
            either = present[:, None] | present[None, :]
            total += w * either
            hit += w * (either & (codes[:, None] == codes[None, :]))
        return np.divide(hit, total, out=np.zeros_like(hit), where=total > 0)  # type: ignore[no-any-return]

    def fit_beta(self, multipliers: Mapping[str, float] | None = None) -> FloatArray:
        """Non-negative joint fit; ``multipliers`` (key → factor) select/scale members
        (default: all, factor 1). Falls back to BLIS's vector if the fit is not valid."""
        if multipliers is None:
            f = np.ones(len(self._index))
        else:
            f = np.zeros(len(self._index))
            for k, v in multipliers.items():
                i = self._index.get(k)
                if i is not None:
                    f[i] = v
        a = self.prior_a + np.tensordot(f, self.weighted_a, axes=1)
        b = self.prior_b + f @ self.weighted_b
        try:  # a feasible unconstrained optimum is the NNLS one (strictly convex)
            theta = np.linalg.solve(a, b)
        except np.linalg.LinAlgError:
            theta = np.full(len(b), -1.0)
        if not np.all(theta >= 0):
            try:
                theta = nnls_information(a, b, warm=None if self._full is None else self._full > 0)
            except (ValueError, np.linalg.LinAlgError):
                theta = self.default_beta.copy()
        return self.or_default(theta)

    def fit_alpha(self, multipliers: Mapping[str, float] | None = None) -> FloatArray:
        """The α intercepts, fitted jointly the same way (one 1×1 system per target)."""
        out = np.empty(len(ALPHA_TARGETS))
        for j in range(len(ALPHA_TARGETS)):
            a, b = self.alpha_prior[j], self.alpha_prior[j] * self.default_alpha[j]
            for k, m in self.members.items():
                f = 1.0 if multipliers is None else multipliers.get(k, 0.0)
                w = self.alpha_weights[j][k] * f
                a += w * m.alpha_a[j]
                b += w * m.alpha_b[j]
            out[j] = max(b / a, 0.0) if a > 0 and math.isfinite(b / a) else self.default_alpha[j]
        return out

    def _without(self, key: str) -> dict[str, float]:
        return {k: 1.0 for k in self.members if k != key}

    def candidate_beta(
        self, source: str, description: Mapping[str, Any], exclude: str | None = None
    ) -> FloatArray:
        """β of one candidate source for a target (``exclude``: a member left out)."""
        if source == "fleet":
            return self.fit_beta(None if exclude is None else self._without(exclude))
        if source == "fleet_local":
            return self.fit_beta(self.kernel(description, exclude))
        if source == "fleet_factors":
            return self.factors().beta(description, exclude)
        if source == "pooled_prior":
            pool = self.pool or self._sim
            return self.or_default(pool.prior_for(description, exclude=exclude).mean)
        if source == "blis_default":
            return self.default_beta.copy()
        raise KeyError(source)

    def factors(self) -> FactorCandidate:
        """The ``fleet_factors`` candidate (built once, its strengths chosen by LOCO)."""
        if self._factors is None:
            self._factors = FactorCandidate(self)
        return self._factors

    # ------------------------------------------------------------------ LOCO

    def result(self) -> FleetResult:
        """The fleet vector and per-configuration LOCO errors (computed once)."""
        if self._result is not None:
            return self._result
        beta = self.fit_beta()
        self._full = beta  # the LOCO refits start NNLS from its active set
        alpha = self.fit_alpha()
        loco: dict[str, dict[str, LocoError]] = {}
        # The pooled prior is scored only in fleets it can afford: its similarity loop is
        # Python over every pair (prior_for), ~0.3 s at 128 configurations per refit.
        pooled = self.pool is not None and len(self.members) <= POOLED_MAX_MEMBERS
        sources = tuple(s for s in SOURCES if pooled or s != "pooled_prior")
        for k, m in self.members.items():
            if m.rows_x is None or m.rows_y is None or len(m.rows_y) < self.min_rows:
                continue
            if len(self.members) < 2:
                break
            x = np.asarray(m.rows_x, dtype=float)
            y = np.asarray(m.rows_y, dtype=float)
            row = {}
            for s in (*sources, "blis_default"):
                theta = self.candidate_beta(s, m.description, exclude=k)
                row[s] = LocoError(float(np.mean(np.abs(x @ theta - y) / y)), len(y))
            loco[k] = row
        summary = {
            s: float(np.mean([r[s].mape for r in loco.values()]))
            for s in (*sources, "blis_default")
            if loco
        }
        best = min(sources, key=lambda s: summary.get(s, math.inf)) if loco else "fleet"
        self._result = FleetResult(
            alpha=tuple(float(v) for v in alpha),
            beta=tuple(float(v) for v in beta),
            members=tuple(self.members),
            weights=dict(self.weights),
            loco=loco,
            summary=summary,
            best_source=best,
            observations=float(sum(m.beta_n for m in self.members.values())),
            factor_strengths=self.factors().strengths if loco else {},
            factor_alpha_from=self.factors().alpha_from if loco else {},
        )
        return self._result

    # ------------------------------------------------------------------ prediction

    def predict(
        self,
        description: Mapping[str, Any],
        source: str | None = None,
        exclude: str | None = None,
        incumbent: str | None = None,
    ) -> Prediction:
        """Coefficients for a described configuration from the other members (``exclude``
        leaves one out). ``source`` forces a candidate; default: the best by LOCO, or
        ``incumbent`` (the source answered for it before) while within :data:`KEEP_SE`
        standard errors of the best (module docs, "Why hysteresis")."""
        r = self.result()
        key = exclude
        if not self.members or (len(self.members) < 2 and source is None):
            # nothing to generalise from: say so rather than pass one configuration off
            src = "pooled_prior" if self.members and self.pool is not None else "blis_default"
            beta = self.candidate_beta(src, description, exclude=key)
            return Prediction(tuple(self.default_alpha.tolist()), tuple(beta.tolist()), src, None)
        kern = self.kernel(description, exclude=key)
        # The source whose LOCO errors on the target's relatives (kernel weights) are
        # lowest, or the factor model within one standard error of it (module docs).
        stats = {
            s: found
            for s in r.summary
            if s != "blis_default" and (found := relatives_error(r.loco, s, kern)) is not None
        }
        best = None
        if source is None and stats:
            src, best = self._choose(kern, tuple(stats), incumbent)
        else:
            src = source or r.best_source
        beta = self.candidate_beta(src, description, exclude=key)
        detail: dict[str, Any] = {"loco_mean": r.summary.get(src), "members": len(self.members)}
        parts = (
            factor_error(
                self.factors(),
                description,
                beta,
                kern,
                key,
                members=self.members,
                noise=self._noise,
                moments=self._row_moments(),
                quirk=self.quirk,
            )
            if src == PREFERRED_SOURCE
            else None
        )
        found = stats.get(src) or relatives_error(r.loco, src, kern)
        relatives = found[0] + found[1] if found else None
        expected: float | None
        if parts is not None:
            basis, expected = "model", math.hypot(*parts)
            # the other reckoning beside it, for comparison (bench fleet, table 5)
            detail |= {"noise_error": parts[0], "bias_sd": parts[1], "relatives": relatives}
        else:
            basis, expected = "relatives", relatives
        if src == "fleet_factors":
            alpha = self.factors().alpha(description, key)
        else:
            alpha = self.fit_alpha(kern if src != "fleet" else None)
        ranked = sorted(kern, key=lambda k: -kern[k])[:3]
        return Prediction(
            tuple(float(v) for v in alpha),
            tuple(float(v) for v in beta),
            src,
            expected,
            tuple(ranked),
            detail | ({"loco_best": best} if best is not None else {}),
            basis,
        )

    def _row_moments(self) -> FloatArray:
        """:func:`~learners.fleet.error.row_moments` of the members (cached: per
        prediction a contraction over members, not over every row)."""
        if self._moments is None:
            self._moments = row_moments(self.members.values(), len(self.default_beta))
        return self._moments

    def _choose(
        self, kern: Mapping[str, float], sources: Sequence[str], incumbent: str | None = None
    ) -> tuple[str, str]:
        """``(chosen, best)`` among ``sources`` by :func:`one_se_choice` over the target's
        relatives (kernel weights) scored by every one of them."""
        rows = [
            (kern[k], row)
            for k, row in self.result().loco.items()
            if k in kern and kern[k] > 0 and all(s in row for s in sources)
        ]
        if not rows:
            best = min(sources, key=lambda s: self.result().summary.get(s, math.inf))
            return best, best
        w = np.array([wk for wk, _ in rows])
        errors = {s: np.array([row[s].mape for _, row in rows]) for s in sources}
        return one_se_choice(errors, w, incumbent=incumbent)
