"""Drift detection on a learner's standardised residuals, and what to do about it.

Why residuals. A change in the true coefficients (new vLLM version, GPU clocks, a
noisy neighbour) shows up first as a shift in the mean of the prequential residuals.
The learner feeds its standardised, clipped residuals (``z = e/σ``, ``|z| ≤ c``, so a
single stall cannot trigger) to a River detector: ADWIN by default (no tuning of the
change size, bounded false-positive rate via ``delta``), Page–Hinkley selectable.

Policy on detection (applied by :class:`learners.rls.RLSRegressor`): *covariance
inflation* — the data information is multiplied by ``keep`` with the estimate held
where it is — followed by ``fast_for`` rows at the faster forgetting factor
``fast_forgetting``. The estimate therefore does not jump at the alarm, but the next
rows dominate it, and the old regime is forgotten within a few dozen rows. The detector
is restarted and ignores a ``grace`` period (the learner's own convergence from its prior
would otherwise look like drift).

>>> import random
>>> mon = DriftMonitor(detector="adwin")
>>> rng = random.Random(1)
>>> hits = [mon.update(rng.gauss(0, 1), n=i) for i in range(3000)]
>>> any(hits)
False
>>> mon.detections
0
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import structlog

from coeffd.learners import native as _native

__all__ = ["DriftEvent", "DriftMonitor"]

_log = structlog.get_logger(__name__)

DetectorName = Literal["adwin", "page_hinkley"]


_DETECTORS: dict[str, Any] = {}


def _river_detector(module: str, name: str) -> Any:
    """River's ``river.drift.<module>.<name>`` without running ``river/drift/__init__``.

    Why: that ``__init__`` also imports KSWIN, and with it ``scipy.stats``: ~70 MB of
    resident memory (half the daemon's) for a detector coeffd never uses (measured:
    ``from river.drift import ADWIN`` takes 1.4 s and the serving process's peak RSS from
    75 to 139 MB). Importing it lazily would not help: every learner set builds its
    detectors when it is created. The detector
    modules themselves need only ``river.base``/``river.stats`` (ADWIN is River's Rust
    core). They are loaded under a stand-in, unexecuted ``river.drift`` package, and all
    of it is then taken out of ``sys.modules`` again, so a later ``import river.drift``
    elsewhere is an ordinary import. If ``river.drift`` is already imported, or River's
    layout ever changes, the plain import is used.

    >>> _river_detector("adwin", "ADWIN").__module__
    'river.drift.adwin'
    """
    key = f"river.drift.{module}"
    if key in _DETECTORS:
        return getattr(_DETECTORS[key], name)
    mod = sys.modules.get(key) if "river.drift" in sys.modules else None
    if mod is None and "river.drift" not in sys.modules:
        spec = importlib.util.find_spec("river.drift")
        if spec is not None and spec.submodule_search_locations is not None:
            sys.modules["river.drift"] = importlib.util.module_from_spec(spec)
            try:
                mod = importlib.import_module(key)
            except ImportError:
                mod = None
            finally:
                for m in [
                    m for m in sys.modules if m == "river.drift" or m.startswith("river.drift.")
                ]:
                    del sys.modules[m]
    if mod is None:
        mod = importlib.import_module(key)  # the ordinary way (runs the package __init__)
    _DETECTORS[key] = mod
    return getattr(mod, name)


class DriftEvent(dict[str, Any]):
    """One detection: ``{"n": observation index, "time_ns": stream clock or None,
    "wall_ns": wall clock at detection, "detector": name}``."""


class DriftMonitor:
    """A River drift detector plus the learner's reaction policy and a detection history.

    Parameters
    ----------
    detector
        ``"adwin"`` or ``"page_hinkley"``.
    params
        Keyword arguments for the River detector (defaults: ADWIN ``delta=1e-4``;
        Page–Hinkley ``threshold=50, delta=0.05``).
    grace
        Observations not shown to the detector after creation and after each detection.
    keep, fast_forgetting, fast_for
        The reaction policy (see module docstring).
    label
        Context for the log line (configuration id, target).
    max_history
        Detections kept in :attr:`history`.
    """

    def __init__(
        self,
        detector: DetectorName = "adwin",
        params: Mapping[str, Any] | None = None,
        grace: int = 100,
        keep: float = 0.01,
        fast_forgetting: float = 0.97,
        fast_for: int = 60,
        label: str = "",
        max_history: int = 100,
    ) -> None:
        self.detector = detector
        self.params = dict(params or {})
        self.grace = grace
        self.keep = keep
        self.fast_forgetting = fast_forgetting
        self.fast_for = fast_for
        self.label = label
        self.max_history = max_history
        self.detections = 0
        self.history: list[DriftEvent] = []
        self.clock_ns: int | None = None  # set by the caller to timestamp detections
        self._seen = 0
        self._det = self._make()

    def _make(self) -> Any:
        if self.detector == "adwin":
            kw: dict[str, Any] = {"delta": 1e-4}
            kw.update(self.params)
            return _river_detector("adwin", "ADWIN")(**kw)
        if self.detector == "page_hinkley":
            kw = {"threshold": 50.0, "delta": 0.05, "min_instances": 30}
            kw.update(self.params)
            return _river_detector("page_hinkley", "PageHinkley")(**kw)
        raise ValueError(f"unknown drift detector {self.detector!r}")

    def update(self, z: float, n: int) -> bool:
        """Feed one standardised residual; ``n`` is the learner's observation index."""
        return self.update_many([z], n) == 0

    def update_many(self, z: Sequence[float] | npt.NDArray[np.float64], start: int) -> int:
        """Feed residuals of rows ``start, start+1, …``; index within ``z`` of the first alarm or −1.

        The same as :meth:`update` row by row, in one loop: every learner feeds each of
        its rows here, so the detector is called directly and the grace rows are skipped
        by counting.
        """
        values = z.tolist() if isinstance(z, np.ndarray) else z
        first = -1
        i, n = 0, len(values)
        while i < n:
            if self._seen < self.grace:
                # The learner is still converging (from its prior, or after an alarm):
                # those residuals shrink by design, and a window holding them would later
                # "detect" the convergence itself. The detector's window starts once it
                # has settled.
                skip = min(self.grace - self._seen, n - i)
                self._seen += skip
                i += skip
                continue
            det = self._det
            hit = -1
            helper = getattr(det, "_helper", None) if self.detector == "adwin" else None
            if helper is not None:
                # River's ADWIN.update is its Rust window's update plus a reset when the
                # last update alarmed; a detector that alarms is replaced here (_alarm),
                # so the window is fed directly (~0.5 µs a row less, every row of every
                # learner)
                window = helper.update
                if _native.feed is not None and type(values) is list:
                    hit = _native.feed(window, values, i)  # the loop below, compiled
                    if hit >= 0:
                        det._drift_detected = True
                else:
                    for j in range(i, n):
                        if window(float(values[j])):
                            det._drift_detected = True  # as River leaves it
                            hit = j
                            break
            else:
                update = det.update
                for j in range(i, n):
                    update(float(values[j]))
                    if det.drift_detected:
                        hit = j
                        break
            if hit < 0:
                self._seen += n - i
                break
            self._alarm(start + hit)
            if first < 0:
                first = hit
            i = hit + 1
        return first

    def _alarm(self, n: int) -> None:
        self.detections += 1
        ev = DriftEvent(
            n=n,
            time_ns=self.clock_ns,  # the stream's clock, when the caller provides it
            wall_ns=time.time_ns(),
            detector=self.detector,
        )
        self.history.append(ev)
        del self.history[: -self.max_history]
        _log.info(
            "drift_detected", label=self.label, n=n, detector=self.detector, count=self.detections
        )
        self._det = self._make()
        self._seen = 0

    def clone(self) -> DriftMonitor:
        return DriftMonitor(
            self.detector,
            self.params,
            self.grace,
            self.keep,
            self.fast_forgetting,
            self.fast_for,
            self.label,
            self.max_history,
        )

    def state_dict(self) -> dict[str, Any]:
        """Policy, counters and history; the detector window restarts on restore (with grace)."""
        return {
            "detector": self.detector,
            "params": self.params,
            "grace": self.grace,
            "keep": self.keep,
            "fast_forgetting": self.fast_forgetting,
            "fast_for": self.fast_for,
            "label": self.label,
            "max_history": self.max_history,
            "detections": self.detections,
            "history": [dict(e) for e in self.history],
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` output. The state carries the monitor's policy,
        which replaces the one it was constructed with (any monitor can be loaded into,
        e.g. ``DriftMonitor()``); the detector window restarts, with grace.

        >>> mon = DriftMonitor(keep=0.05, label="cfg/beta")
        >>> back = DriftMonitor()
        >>> back.load_state(mon.state_dict())
        >>> back.keep, back.label
        (0.05, 'cfg/beta')
        """
        DriftMonitor.__init__(
            self,
            state["detector"],
            state["params"],
            state["grace"],
            state["keep"],
            state["fast_forgetting"],
            state["fast_for"],
            state["label"],
            state["max_history"],
        )
        self.detections = int(state["detections"])
        self.history = [DriftEvent(e) for e in state["history"]]
