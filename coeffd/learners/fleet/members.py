"""What one configuration brings to the fleet model, and how far to believe it.

A member of the fleet is one configuration's learner statistics (:class:`MemberStats`):
the information ``(A_c, b_c)`` its learners keep (relative-error units, exponentially
forgotten, scaled down on a drift alarm: :mod:`learners.rls`), its effective sample size,
and its recent step rows for scoring. :func:`member_stats` takes them from the learners
the configuration *publishes* (``LearnerSet.published_learner``: in steady state the
long-memory twin, ~10,000 steps; while it tracks a change, the fast tracker, ~90), so the
fleet hears about a configuration what its published vector says, and a configuration
that drifted counts little until it has re-learned.

Step noise (:func:`row_noise`, :func:`relative_noise`): the relative scatter of a member's
steps around its own least-squares fit — the part of the step time no coefficient
removes, and the unit its information is measured in.

Quirks (:func:`discount_quirks`). A configuration is never exactly what a shared model of
the fleet says: its own kernels, clocks, firmware and NCCL topology move each coefficient
a little (the ``fleet-shared`` scenario's truth draws ±3 % per term). A member's
information does not know that: thousands of steps pin a direction of its *own* vector
very tightly, and a joint fit then reads that member's quirk as the fleet's — most in the
directions that only contrasts between configurations identify (decode compute against
the per-request and decode-KV terms), where one member's quirk is magnified in another's
prediction. So each member's information is taken with its quirk
``u ~ N(0, (quirk·θ)²)`` marginalised out (``quirk`` is ``learners.fleet_quirk``,
:data:`QUIRK` by default; 0 turns it off): what one configuration says about a direction
saturates at what its quirk allows. The price, where the truth has no quirks: each member
then pins each coefficient to about ``±quirk`` at best, however many steps it has.
(Measured effects: ``bench/README.md``, "How the fleet model got here".)

>>> import numpy as np
>>> x = np.ones((4, 1))
>>> m = MemberStats("c", {"gpu": "H100"}, x.T @ x, x.T @ np.ones(4), 4.0, rows_x=x,
...                 rows_y=np.array([0.9, 1.1, 0.9, 1.1]))
>>> round(relative_noise(m), 4)  # residuals ±10 %, one degree of freedom used
0.0132

References
----------
Gelman, A., Carlin, J. B., Stern, H. S., Dunson, D. B., Vehtari, A. and Rubin, D. B.
(2013). *Bayesian Data Analysis*, 3rd ed., chapter 5 (hierarchical models: a group's
effect marginalised out of its likelihood).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from coeffd.learners.targets import ALPHA_TARGETS

if TYPE_CHECKING:
    from coeffd.learners.learnerset import LearnerSet

__all__ = [
    "NOISELESS",
    "QUIRK",
    "MemberStats",
    "discount_quirks",
    "is_finite",
    "member_stats",
    "relative_noise",
    "row_noise",
]

FloatArray = npt.NDArray[np.float64]

#: How far one configuration's true coefficients may stray, relative to each coefficient,
#: from what any shared model of the fleet says (its own kernels, clocks, firmware): the
#: standard deviation of the quirk :func:`discount_quirks` marginalises out of every
#: member's information (module docs, "Quirks"; the setting ``learners.fleet_quirk``).
QUIRK = 0.02
#: Relative noise variance below which a member's rows count as noise-free (0.01 %
#: standard deviation; a real engine's step times vary by percents).
_P_MAX = 1e300  # a quirk's precision at most this: (A + P)⁻¹ A stays finite, ≈ 0
NOISELESS = 1e-8


@dataclass(frozen=True)
class MemberStats:
    """What the fleet needs from one configuration's learners.

    ``beta_a``/``beta_b``: the β learner's data information (no prior);
    ``alpha_a``/``alpha_b``/``alpha_n``: the same for each α learner (1×1, 0 when absent);
    ``rows_x``/``rows_y``: recent step rows (basis terms, period µs) for LOCO scoring;
    ``noise_var``: the relative variance of its steps around its own fit, the unit its
    information is measured in (None: from its rows, :func:`relative_noise`).
    """

    key: str
    description: dict[str, Any]
    beta_a: FloatArray
    beta_b: FloatArray
    beta_n: float
    alpha_a: tuple[float, ...] = (0.0, 0.0, 0.0)
    alpha_b: tuple[float, ...] = (0.0, 0.0, 0.0)
    alpha_n: tuple[float, ...] = (0.0, 0.0, 0.0)
    rows_x: FloatArray | None = None
    rows_y: FloatArray | None = None
    noise_var: float | None = None


def member_stats(ls: LearnerSet) -> MemberStats | None:
    """A live learner set's statistics (None before its β learner has data): those of
    the learners it publishes (``LearnerSet.published_learner``: in steady state the
    long-memory twins, ~10,000 steps; while it tracks a change, the fast ones, ~90)."""
    beta = ls.published_learner("beta")
    if beta is None or beta.n_learned == 0:
        return None
    a, b = beta.data_information()
    aa, ab, an = [0.0] * 3, [0.0] * 3, [0.0] * 3
    for j, t in enumerate(ALPHA_TARGETS):
        m = ls.published_learner(t)
        if m is not None and m.n_learned > 0:
            ma, mb = m.data_information()
            aa[j], ab[j], an[j] = float(ma[0, 0]), float(mb[0]), m.n_effective
    x, y = ls.baseline.rows()
    return MemberStats(
        key=ls.config.id,
        description=ls.config.to_dict(),
        beta_a=a,
        beta_b=b,
        beta_n=beta.n_effective,
        alpha_a=tuple(aa),
        alpha_b=tuple(ab),
        alpha_n=tuple(an),
        rows_x=x if len(y) else None,
        rows_y=y if len(y) else None,
    )


def is_finite(m: MemberStats) -> bool:
    """Whether every number of the member's information is finite (learners reject
    non-finite rows, but a member that held such information would poison every fit)."""
    return bool(
        np.all(np.isfinite(m.beta_a))
        and np.all(np.isfinite(m.beta_b))
        and math.isfinite(m.beta_n)
        and all(math.isfinite(v) for v in (*m.alpha_a, *m.alpha_b, *m.alpha_n))
    )


def relative_noise(m: MemberStats) -> float:
    """The member's ``noise_var``, or else the relative variance of its recent rows around
    their own least-squares fit (residual sum of squares over ``rows − terms``; 0 without
    enough rows): the noise its information is measured against.

    >>> x = np.array([[1.0], [1.0], [1.0]])
    >>> round(relative_noise(MemberStats("c", {}, x.T @ x, x[0], 3.0, rows_x=x,
    ...                                  rows_y=np.array([0.9, 1.0, 1.1]))), 4)
    0.01
    """
    return row_noise(m)[0]


def row_noise(m: MemberStats) -> tuple[float, float]:
    """``(variance, mean absolute value)`` of the member's relative step noise: its
    ``noise_var`` (and the mean absolute value of a Gaussian of that variance), or else of
    its recent rows' residuals around their own least-squares fit, each corrected for the
    degrees of freedom the fit used; ``(0, 0)`` without enough rows.

    >>> x = np.array([[1.0], [1.0], [1.0]])
    >>> v, a = row_noise(MemberStats("c", {}, x.T @ x, x[0], 3.0, rows_x=x,
    ...                              rows_y=np.array([0.9, 1.0, 1.1])))
    >>> round(v, 4), round(a, 4)
    (0.01, 0.0868)
    """
    if m.noise_var is not None:
        return m.noise_var, math.sqrt(2 / math.pi * max(m.noise_var, 0.0))
    if m.rows_x is None or m.rows_y is None:
        return 0.0, 0.0
    x, y = np.asarray(m.rows_x, dtype=float), np.asarray(m.rows_y, dtype=float)
    if len(y) <= x.shape[1] or not np.all(y > 0):
        return 0.0, 0.0
    z = x / y[:, None]  # relative units: a row says z·θ = 1
    theta, *_ = np.linalg.lstsq(z, np.ones(len(y)), rcond=None)
    r = z @ theta - 1.0
    dof = len(y) / (len(y) - np.linalg.matrix_rank(z))
    v, a = float(np.mean(r**2) * dof), float(np.mean(np.abs(r)) * math.sqrt(dof))
    return (v, a) if math.isfinite(v) and math.isfinite(a) else (0.0, 0.0)


def discount_quirks(
    a: FloatArray,
    b: FloatArray,
    members: Sequence[MemberStats],
    quirk: float,
    *,
    prior: tuple[FloatArray, FloatArray],
    floor: float = 1.0,
    noise: Sequence[float] | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Each member's information ``(a[k], b[k])`` with its own quirk marginalised out.

    Member ``k`` measures ``θ_k = θ_model(k) + u_k``, ``u_k ~ N(0, diag((quirk·s)²))``
    with ``s`` each coefficient's scale (the fleet's joint fit; ``floor`` where it is 0).
    Its likelihood for the shared model is then Gaussian with precision
    ``(A_k⁻¹ + Σ_u/σ²_k)⁻¹`` in data units (``σ²_k``: its relative noise variance), i.e.
    ``A_k − A_k (A_k + P_k)⁻¹ A_k`` with ``P_k = σ²_k Σ_u⁻¹``: what thousands of steps of
    one configuration say about a direction saturates at what its quirk allows, so one
    member's quirk is not read as the fleet's. A member without rows is taken to be as
    noisy as the fleet's median member; one whose rows have no noise (below
    :data:`NOISELESS`: synthetic) keeps its information as it is. ``noise``: each member's
    :func:`relative_noise`, if the caller has it already.

    >>> import numpy as np
    >>> a = np.array([[[1e4]], [[1.0]]]); b = a[:, :, 0] * 2.0   # both say θ = 2
    >>> ms = [MemberStats(str(k), {}, a[k], b[k], 1.0, rows_x=np.array([[1.0], [1.0]]),
    ...       rows_y=np.array([1.9, 2.1])) for k in range(2)]
    >>> da, db = discount_quirks(a, b, ms, 0.05, prior=(np.zeros((1, 1)), np.zeros(1)))
    >>> round(relative_noise(ms[0]) / (0.05 * 2.0) ** 2, 2)  # P: σ² from the rows, s = 2
    0.5
    >>> round(float(da[0, 0, 0]), 2), round(float(da[1, 0, 0]), 2)  # capped near P; ≈ A P/(A+P)
    (0.5, 0.33)
    >>> round(float(db[0, 0] / da[0, 0, 0]), 6)   # same estimate, less weight
    2.0
    """
    if quirk <= 0:  # no quirk: P is infinite and A - A (A + P)⁻¹ A is A (without 1/0)
        return a, b
    a0, b0 = prior
    try:
        scale = np.abs(np.linalg.solve(a0 + a.sum(axis=0), b0 + b.sum(axis=0)))
    except np.linalg.LinAlgError:
        return a, b
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, floor)
    out_a, out_b = a.copy(), b.copy()
    noise = [relative_noise(m) for m in members] if noise is None else list(noise)
    known = [v for v in noise if v >= NOISELESS]
    typical = statistics.median(known) if known else 0.0
    for k, m in enumerate(members):
        s2 = noise[k] if m.rows_y is not None or m.noise_var is not None else typical
        if s2 < NOISELESS:  # synthetic rows: no noise to weigh a quirk against
            continue
        with np.errstate(divide="ignore", over="ignore"):
            # a quirk (or scale) so small that its precision overflows is the no-quirk
            # limit in that direction: capped finite, so the solve stays free of inf/nan
            p_diag = np.minimum(s2 / (quirk * scale) ** 2, _P_MAX)
        if not np.all(np.isfinite(p_diag)):
            continue
        p = np.diag(p_diag)
        try:
            ga = np.linalg.solve(a[k] + p, a[k])
            gb = np.linalg.solve(a[k] + p, b[k])
        except np.linalg.LinAlgError:
            continue
        da = a[k] - a[k] @ ga
        out_a[k] = (da + da.T) / 2
        out_b[k] = b[k] - a[k] @ gb
    return out_a, out_b
