"""What the learners hand the publisher: scored predictions and coefficient estimates.

Plain frozen dataclasses, so the daemon's publisher, metrics and the fleet model read a
configuration's state without touching its learners (:mod:`learners.learnerset` builds
them, :mod:`learners.registry` hands them out).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["ConfigEstimate", "Scored", "StepScores", "VectorEstimate"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Scored:
    """One prequential prediction: the target, the measured value and each source's guess."""

    target: str
    y: float
    predictions: dict[str, float]
    regime: str | None = None


@dataclass(frozen=True)
class StepScores:
    """Prequential predictions of a burst of step observations, as columns: the measured
    periods ``y``, each source's predictions (NaN where a source made none) and each
    row's regime. :class:`Scored` rows carry the same, one dict per row."""

    y: npt.NDArray[np.float64]
    predictions: dict[str, npt.NDArray[np.float64]]
    regimes: list[str]

    def __len__(self) -> int:
        return len(self.y)

    def rows(self) -> list[Scored]:
        """One :class:`Scored` per row (a source's NaN left out of its dict)."""
        cols = {k: v.tolist() for k, v in self.predictions.items()}
        out = []
        for i, (y, regime) in enumerate(zip(self.y.tolist(), self.regimes, strict=True)):
            preds = {k: v[i] for k, v in cols.items() if v[i] == v[i]}
            out.append(Scored("step_period", y, preds, regime))
        return out


#: One score of a finished request: (target, measured value, learned prediction, BLIS's
#: shipped value — None for a target BLIS has no vector of, the queue wait)
RequestScore = tuple[str, float, float, float | None]


@dataclass(frozen=True)
class RequestScores:
    """Prequential predictions of a burst of finished requests, one tuple per score in
    the order :meth:`LearnerSet.learn` would make them request by request (the α targets,
    then the queue wait), and how many of the requests scored anything. What the learning
    consumer's metrics take: a :class:`Scored` and its dict per score cost more than
    learning the score's α."""

    rows: list[RequestScore]
    learned: int

    def __len__(self) -> int:
        return len(self.rows)

    def scored(self) -> list[Scored]:
        """One :class:`Scored` per score.

        >>> RequestScores([("output_token", 9.0, 8.0, 7.0), ("queue_wait", 3.0, 2.0, None)], 1).scored()
        ... # doctest: +NORMALIZE_WHITESPACE
        [Scored(target='output_token', y=9.0, predictions={'learned': 8.0, 'blis_default': 7.0},
                regime=None),
         Scored(target='queue_wait', y=3.0, predictions={'learned': 2.0}, regime=None)]
        """
        return [
            Scored(t, y, {"learned": p} if d is None else {"learned": p, "blis_default": d})
            for t, y, p, d in self.rows
        ]


@dataclass(frozen=True)
class VectorEstimate:
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
class ConfigEstimate:
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
    vectors: dict[str, VectorEstimate]
    observations: int
    version: int
    created_wall_ns: int
    updated_wall_ns: int
    prior_sources: tuple[str, ...]
    errors: dict[str, Any] = field(default_factory=dict)
    #: the last step feature rows learned (≤ ``learnerset.RECENT_ROWS`` × 11), or None
    recent_terms: FloatArray | None = None
    #: per regime: the published β's estimated relative standard error of the predicted
    #: step time on a fixed set of batches (learners.evaluation.regime_batches)
    step_time_rel_std: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.recent_terms is not None:
            d["recent_terms"] = self.recent_terms.tolist()
        return d
