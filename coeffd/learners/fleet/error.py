"""The expected error a fleet prediction states, and how it is reckoned.

A prediction for a configuration nobody has deployed (:meth:`FleetModel.predict
<learners.fleet.model.FleetModel.predict>`) states the step-time MAPE a user should expect
of it, at one standard deviation of what is not known. :data:`ERROR_BASES` names the two
reckonings; the answer says which one it used.

``model`` (the ``fleet_factors`` candidate, :func:`factor_error`): the step noise of the
target's relatives (the part no coefficient removes) and the standard deviation of the
prediction's own bias on the relatives' steps — the factor fit's covariance for the
target's levels, the target's own quirk, and the spread of the known GPUs, families or TP
degrees where the target's is new; ``√(noise² + bias_sd²)``.

``relatives`` (every other candidate, :func:`relatives_error`): the chosen candidate's
leave-one-configuration-out (LOCO) errors on the target's relatives, kernel-weighted:
their mean plus one standard deviation.

Why model it where the fit allows: each LOCO error is a MAPE over noisy rows — noise of
the order of the bias it should measure — so the spread of the relatives' errors is
mostly noise, and it does not count the target's own quirk at all: the setup with the
largest bias can get the lowest statement. The model separates the noise from the bias
and counts what no fit of the fleet can know. (Measured: ``bench/README.md``, "How the
fleet model got here".)

>>> from coeffd.learners.fleet.results import LocoError
>>> loco = {"a": {"fleet": LocoError(0.02, 100)}, "b": {"fleet": LocoError(0.04, 100)}}
>>> mean, sd = relatives_error(loco, "fleet", {"a": 1.0, "b": 1.0})
>>> round(mean, 3), round(sd, 3)
(0.03, 0.01)

References
----------
Hastie, T., Tibshirani, R. and Friedman, J. (2009). *The Elements of Statistical
Learning*, 2nd ed., section 7.3 (expected prediction error: irreducible noise plus the
prediction's bias and variance).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from coeffd.learners.fleet.factors import FactorCandidate
    from coeffd.learners.fleet.members import MemberStats
    from coeffd.learners.fleet.results import LocoError

__all__ = ["ERROR_BASES", "factor_error", "relatives_error", "row_moments"]

FloatArray = npt.NDArray[np.float64]

#: How a prediction's expected error is reckoned, by the key its ``error_basis`` names
#: (:class:`~learners.fleet.results.Prediction`).
ERROR_BASES: dict[str, str] = {
    "model": "step noise of the known configurations most like this one and the "
    "prediction's own uncertainty (factor fit covariance, this configuration's quirk, the "
    "spread of known levels where its GPU, family or TP degree is new), as step-time MAPE "
    "at one standard deviation",
    "relatives": "leave-one-configuration-out step-time MAPE of this source on the known "
    "configurations most like this one: mean plus one standard deviation",
}


def factor_error(
    factors: FactorCandidate,
    description: Mapping[str, Any],
    beta: FloatArray,
    kern: Mapping[str, float],
    exclude: str | None,
    *,
    members: Mapping[str, MemberStats],
    noise: Mapping[str, tuple[float, float]],
    moments: FloatArray,
    quirk: float,
) -> tuple[float, float] | None:
    """``(noise, bias_sd)`` of the ``fleet_factors`` prediction ``beta``: the relatives'
    mean absolute step noise, and the standard deviation of the relative step-time bias of
    ``beta`` on the relatives' steps (kernel-weighted; None if none has rows; each row's
    relative sensitivity taken against its own step time). The bias covariance is the
    factor fit's (:meth:`FactorFit.covariance <learners.fleet.factors.FactorFit.covariance>`,
    in the members' median noise variance) plus what no fleet model can know: the
    configuration's own quirk ``(quirk·β)²`` per term, and the offsets of any GPU, family
    or TP degree nobody has run (:meth:`FactorFit.unseen_variance
    <learners.fleet.factors.FactorFit.unseen_variance>`).

    ``members``: the fleet's members, in the order of ``moments`` (:func:`row_moments`);
    ``noise``: each one's :func:`~learners.fleet.members.row_noise`; ``quirk``: the
    relative standard deviation of a configuration's own quirk.
    """
    row = factors.left_out(exclude)
    fit, lam = factors.beta_fit, factors.strengths["beta"]
    cov = fit.covariance(description, lam, without=row)
    own = (quirk * beta) ** 2 + fit.unseen_variance(description, lam, without=row)
    others = [k for k in members if k != exclude]
    measured = [
        noise[k][0]
        for k in others
        if members[k].rows_y is not None or members[k].noise_var is not None
    ]
    unit = statistics.median(measured) if measured else 0.0
    q = unit * cov + np.diag(own)
    w = np.array([kern.get(k, 0.0) if k != exclude else 0.0 for k in members])
    w = np.where(np.any(moments != 0, axis=(1, 2)), w, 0.0)
    if w.sum() <= 0:
        return None
    var = float(np.sum(q * np.tensordot(w, moments, axes=1)) / w.sum())
    mean_noise = float(w @ np.array([noise[k][1] for k in members]) / w.sum())
    return mean_noise, math.sqrt(max(var, 0.0))


def row_moments(members: Iterable[MemberStats], d: int) -> FloatArray:
    """``(K, d, d)``: each member's mean ``z zᵀ`` over its recent rows, ``z = x / y`` (a
    row's terms relative to its step time, so ``zᵀ Σ z`` is the relative variance of that
    step's time under a coefficient covariance ``Σ``; 0 without rows). Computed once per
    fleet, a prediction's :func:`factor_error` is a contraction over members, not over
    every row (a pass over the rows of 96 configurations took ~35 ms a prediction).

    >>> from coeffd.learners.fleet.members import MemberStats
    >>> x = np.array([[1.0, 0.0], [1.0, 1.0]])
    >>> m = MemberStats("c", {}, x.T @ x, x[0], 2.0, rows_x=x, rows_y=np.array([1.0, 2.0]))
    >>> row_moments([m, MemberStats("n", {}, x.T @ x, x[0], 2.0)], 2).tolist()
    [[[0.625, 0.125], [0.125, 0.125]], [[0.0, 0.0], [0.0, 0.0]]]
    """
    given = list(members)
    out = np.zeros((len(given), d, d))
    for i, m in enumerate(given):
        if m.rows_x is None or m.rows_y is None:
            continue
        x, y = np.asarray(m.rows_x, dtype=float), np.asarray(m.rows_y, dtype=float)
        z = x[y > 0] / y[y > 0, None]
        if len(z):
            out[i] = z.T @ z / len(z)
    return out


def relatives_error(
    loco: Mapping[str, Mapping[str, LocoError]], source: str, kern: Mapping[str, float]
) -> tuple[float, float] | None:
    """Kernel-weighted mean and standard deviation of ``source``'s LOCO errors
    (``loco[config][source]``, :attr:`FleetResult.loco
    <learners.fleet.results.FleetResult.loco>`) over the configurations ``kern`` weighs."""
    errs = [(kern[k], row[source].mape) for k, row in loco.items() if k in kern and source in row]
    if not errs:
        return None
    w = np.array([e[0] for e in errs])
    e = np.array([e[1] for e in errs])
    mean = float(w @ e / w.sum())
    return mean, math.sqrt(float(w @ (e - mean) ** 2 / w.sum()))
