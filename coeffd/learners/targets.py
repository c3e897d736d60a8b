"""The learners of one configuration, by target: features, priors, forgetting, drift.

One :class:`~learners.learnerset.LearnerSet` per configuration id holds one
:class:`~learners.rls.RLSRegressor` per target, made here when its first observation arrives:

==========================  ==============================================  =================
learner                     regression                                      BLIS vector
==========================  ==============================================  =================
``beta``                    step period on the 11 BLIS terms (§5.3)         ``beta_coeffs``
``beta_steady``             the same, long memory (published when steady)   ``beta_coeffs``
``beta_extended``           step period on BLIS terms + extended features   (diagnostic)
``arrival_to_queued``       arrival→queued on an intercept                  ``alpha[0]``
``finished_to_departed``    finished→departed on an intercept               ``alpha[1]``
``output_token``            first token→first response on an intercept      ``alpha[2]``
``<α target>_steady``       the same, long memory (published when steady)   ``alpha[i]``
``queue_wait``              queue wait on (1, waiting, running, kv usage)   —
``kv_store`` / ``kv_load``  transfer time on (1, bytes): base + bytes/BW    —
==========================  ==============================================  =================

Every setting that shapes a learner is read here, so what each target regresses on and
how fast it forgets is one table and one function, not spread over the learning code.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from coeffd.learners.config import LearnersConfig
from coeffd.learners.drift import DriftMonitor
from coeffd.learners.features import TERM_NAMES
from coeffd.learners.features.extended import EXTENDED_NAMES
from coeffd.learners.prior import prior_precision
from coeffd.learners.rls import RLSRegressor

__all__ = [
    "ALPHA_STEADY",
    "ALPHA_TARGETS",
    "BETA_EXTENDED_FEATURES",
    "KV_FEATURES",
    "QUEUE_FEATURES",
    "STEADY_TWINS",
    "drift_monitor",
    "make_learner",
]

FloatArray = npt.NDArray[np.float64]

ALPHA_TARGETS: tuple[str, ...] = ("arrival_to_queued", "finished_to_departed", "output_token")
#: the long-memory twin of each α target (learners.steady)
ALPHA_STEADY: tuple[str, ...] = tuple(f"{t}_steady" for t in ALPHA_TARGETS)
#: published target → its long-memory twin: published from the twin in steady state
STEADY_TWINS: dict[str, str] = {"beta": "beta_steady", **{t: f"{t}_steady" for t in ALPHA_TARGETS}}
QUEUE_FEATURES: tuple[str, ...] = ("one", "waiting_depth", "running_depth", "kv_usage")
KV_FEATURES: tuple[str, ...] = ("one", "bytes")
BETA_EXTENDED_FEATURES: tuple[str, ...] = tuple(TERM_NAMES) + tuple(EXTENDED_NAMES)
_ONE = ("one",)
_NO_DRIFT = frozenset({"kv_store", "kv_load", "queue_wait"})


def drift_monitor(settings: LearnersConfig, label: str) -> DriftMonitor | None:
    """The drift detector of one learner as configured, None when drift is off."""
    d = settings.drift
    if not d.enabled:
        return None
    return DriftMonitor(
        d.detector,
        d.params,
        d.grace,
        d.keep,
        d.fast_forgetting,
        d.fast_for,
        label=label,
    )


def make_learner(
    target: str,
    settings: LearnersConfig,
    beta_prior: FloatArray,
    beta_precision: FloatArray,
    alpha_prior: FloatArray,
    label: str,
) -> RLSRegressor:
    """A fresh learner of ``target`` (a ``KeyError`` for an unknown one) with these priors;
    ``label`` names it in drift logs (``config id/target``)."""
    s = settings
    common: dict[str, Any] = {
        "huber": s.huber,
        "scale_memory": s.scale_memory,
        "refresh_every": s.refresh_every,
        # No detector where residuals follow the load rather than the coefficients, or
        # it raises false alarms on a stationary system: KV transfer durations are
        # only seen in whole step periods (completions are published once per step),
        # and queue waits swing with bursty arrivals far beyond a linear model.
        "drift": None if target in _NO_DRIFT else drift_monitor(settings, label),
    }
    if target in ("beta", "beta_steady"):
        # the fast tracker and the long-memory learner (learners.steady), each with a
        # detector of its own
        return RLSRegressor(
            TERM_NAMES,
            forgetting=s.forgetting if target == "beta" else s.steady_forgetting,
            prior_mean=beta_prior.tolist(),
            prior_precision=beta_precision,
            weighting=s.weighting,
            **common,
        )
    if target == "beta_extended":
        n_ext = len(EXTENDED_NAMES)
        mean = np.concatenate([beta_prior, np.zeros(n_ext)])
        prec = np.concatenate(
            [
                beta_precision,
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
    if target in ALPHA_TARGETS or target in ALPHA_STEADY:
        steady = target in ALPHA_STEADY
        i = ALPHA_STEADY.index(target) if steady else ALPHA_TARGETS.index(target)
        mean = alpha_prior[i : i + 1]
        if steady:
            forgetting = s.steady_forgetting
        elif i == 0:
            forgetting = s.queueing_forgetting
        else:
            forgetting = s.alpha_forgetting
        return RLSRegressor(
            _ONE,
            forgetting=forgetting,
            prior_mean=mean.tolist(),
            prior_precision=prior_precision(mean.tolist(), s.prior_strength, s.prior_scale_floor),
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
