"""When a new snapshot is worth publishing, and with which numbers.

Consecutive versions that wobble cost users more than a slightly stale estimate (issue
15: versions of a steady engine moved E2E by 4–8 %), so a change is measured as what it
does to BLIS's predictions of the configuration's own recent batches, per regime.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from coeffd.daemon.publish.snapshot import InvalidCoefficientsError, Snapshot, validate_for_blis

__all__ = [
    "PublishPolicy",
    "max_relative_change",
    "regime_step_time_change",
    "step_time_change",
]


def max_relative_change(old: Iterable[float], new: Iterable[float], floor: float = 1e-9) -> float:
    """Largest ``|new - old| / max(|old|, floor)`` over paired positions (inf on length change).

    >>> max_relative_change([1.0, 2.0], [1.1, 2.0])  # doctest: +ELLIPSIS
    0.100...
    """
    a, b = list(old), list(new)
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        worst = max(worst, abs(y - x) / max(abs(x), floor))
    return worst


def step_time_change(
    old: Sequence[float], new: Sequence[float], batches: npt.NDArray[np.float64]
) -> float:
    """Mean ``|x·new − x·old| / x·old`` over the rows ``x`` of ``batches`` (BLIS basis
    terms of recent steps): how much a new β would move the predicted step times of the
    batches this configuration really runs. A term that no batch excites moves nothing.

    >>> import numpy as np
    >>> x = np.array([[1.0, 0.0], [1.0, 1.0]])
    >>> round(step_time_change([10.0, 5.0], [10.0, 5.5], x), 4)  # only the second row moves
    0.0167
    >>> step_time_change([10.0, 5.0], [10.0, 5.0, 1.0], x)
    inf
    """
    a = np.asarray(old, dtype=float)
    b = np.asarray(new, dtype=float)
    if a.shape != b.shape or batches.ndim != 2 or batches.shape[1] != len(a):
        return math.inf
    p_old = batches @ a
    ok = p_old > 0
    if not ok.any():
        return max_relative_change(a, b)
    return float(np.mean(np.abs(batches[ok] @ b - p_old[ok]) / p_old[ok]))


def regime_step_time_change(
    old: Sequence[float], new: Sequence[float], batches: npt.NDArray[np.float64]
) -> float:
    """:func:`step_time_change` over the batches with a prefill and over those without,
    the larger. Decode steps are most of what an engine runs (and, at vLLM's default
    sampling, nearly all that is observed), so a mean over them all never saw prefill
    terms move: a β with 10 %-off prefill terms stayed published, and TTFT with it.

    >>> import numpy as np
    >>> pd = np.array([[0.0, 1.0]] * 9 + [[1.0, 1.0]])  # nine decode batches, one prefill
    >>> round(step_time_change([10.0, 5.0], [11.0, 5.0], pd), 4)  # the mix: 0.67 %
    0.0067
    >>> round(regime_step_time_change([10.0, 5.0], [11.0, 5.0], pd), 4)  # prefill: 6.7 %
    0.0667
    """
    if batches.ndim != 2 or batches.shape[1] != len(old) or not len(batches):
        return step_time_change(old, new, batches)
    prefill = batches[:, 0] > 0
    return max(step_time_change(old, new, batches[g]) for g in (prefill, ~prefill) if g.any())


class PublishPolicy:
    """Decide when a new snapshot is worth publishing, and with which numbers.

    New coefficients are published when the vector is valid and nothing was published
    yet, or when they change what BLIS would predict: β moves the predicted step time of
    the configuration's recent batches (``recent``) by more than ``step_time_threshold``
    on average (without recent batches: any β by more than ``relative_threshold``), or
    an α moved by more than ``relative_threshold``. Otherwise, once ``interval_s`` has
    passed, a heartbeat version carries the *previous* numbers with fresh provenance
    (reason ``interval``), so users see that the estimate was confirmed, not that it
    wobbled (issue 15: consecutive versions of a steady engine moved E2E by 4–8 %).
    """

    def __init__(
        self,
        interval_s: float = 60.0,
        relative_threshold: float = 0.05,
        min_observations: int = 0,
        step_time_threshold: float = 0.005,
    ) -> None:
        self.interval_s = interval_s
        self.relative_threshold = relative_threshold
        self.min_observations = min_observations
        self.step_time_threshold = step_time_threshold

    def decide(
        self,
        previous: Snapshot | None,
        alpha: Sequence[float],
        beta: Sequence[float],
        now_wall_ns: int,
        observations: int = 0,
        recent: npt.NDArray[np.float64] | None = None,
        learned: int = 0,
        fitted_on: int | None = None,
    ) -> tuple[bool, str]:
        """Return ``(publish, reason)``; reason is one of ``invalid``, ``too_few_observations``,
        ``first``, ``significant_change``, ``refined`` (publish these numbers),
        ``interval`` (publish the previous numbers again), ``unchanged``.

        ``learned``: the β learner's observations now; ``fitted_on``: its observations
        behind the numbers published last. Numbers learned from at least twice as many
        are published (``refined``) even when they
        move the recent predictions less than the threshold: the threshold guards
        against wobble, but an early estimate held at 2-3 % off on batches the recent
        mix seldom runs stayed published for good (bench closedloop, every step sampled)
        while the learner had long since converged. Doubling keeps such versions rare:
        about log2(observations) in a configuration's life.
        """
        try:
            validate_for_blis(alpha, beta)
        except InvalidCoefficientsError:
            return False, "invalid"
        if observations < self.min_observations:
            return False, "too_few_observations"
        if previous is None:
            return True, "first"
        if recent is not None and len(recent):
            moved = regime_step_time_change(previous.beta, beta, recent)
            beta_moved = moved > self.step_time_threshold
        else:
            beta_moved = max_relative_change(previous.beta, beta) > self.relative_threshold
        if beta_moved or max_relative_change(previous.alpha, alpha) > self.relative_threshold:
            return True, "significant_change"
        refined = fitted_on is not None and fitted_on > 0 and learned >= 2 * fitted_on
        if refined and (
            tuple(beta) != tuple(previous.beta) or tuple(alpha) != tuple(previous.alpha)
        ):
            return True, "refined"
        if now_wall_ns - previous.wall_ns >= self.interval_s * 1e9:
            return True, "interval"
        return False, "unchanged"
