"""A labelled Prometheus histogram that takes whole arrays of observations.

Why not prometheus-client's ``Histogram``: it takes one value per call (a label lookup,
a lock and two value objects per bucket hit), and the learning consumer scores every
step observation against four coefficient sources — that alone was a tenth of the cost
of learning a step. Here a batch is bucketed with one ``numpy.searchsorted`` and
``bincount``; the series are exposed through prometheus-client's documented custom
collector interface (``HistogramMetricFamily``), so the exposition is the standard one
(``_bucket{le=…}``, ``_count``, ``_sum``).

>>> import numpy as np
>>> from prometheus_client import CollectorRegistry, generate_latest
>>> reg = CollectorRegistry()
>>> h = BatchHistogram("err", "Relative error.", ["target"], (0.1, 0.5), reg)
>>> h.observe_many(("step",), np.array([0.05, 0.1, 0.3, 2.0]))
>>> h.observe(("step",), 0.2)
>>> reg.get_sample_value("err_bucket", {"target": "step", "le": "0.1"})
2.0
>>> reg.get_sample_value("err_bucket", {"target": "step", "le": "0.5"})
4.0
>>> reg.get_sample_value("err_count", {"target": "step"}), round(reg.get_sample_value("err_sum", {"target": "step"}), 6)
(5.0, 2.65)
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["BatchHistogram"]


class BatchHistogram(Collector):
    """Histogram series keyed by label values; ``observe_many`` adds an array at once."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        upper = sorted(float(b) for b in buckets)
        if not upper or upper[-1] != math.inf:
            upper.append(math.inf)
        self._upper = np.array(upper)
        self._les = [floatToGoString(b) for b in upper]
        self._series: dict[tuple[str, ...], tuple[npt.NDArray[np.int64], list[float]]] = {}
        self._lock = threading.Lock()  # the scrape runs on the HTTP server's thread
        registry.register(self)

    def _get(self, labels: tuple[str, ...]) -> tuple[npt.NDArray[np.int64], list[float]]:
        s = self._series.get(labels)
        if s is None:
            if len(labels) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {labels}")
            s = self._series[labels] = (np.zeros(len(self._upper), dtype=np.int64), [0.0])
        return s

    def observe_many(self, labels: tuple[str, ...], values: npt.NDArray[np.float64]) -> None:
        """Add finite, non-negative ``values`` to the series ``labels`` (others are skipped)."""
        values = values[np.isfinite(values) & (values >= 0)]
        if not len(values):
            return
        counts = np.bincount(
            np.searchsorted(self._upper, values, side="left"), minlength=len(self._upper)
        )
        total = float(values.sum())
        with self._lock:
            hist, acc = self._get(labels)
            hist += counts
            acc[0] += total

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        """Add one value (the rare, single-observation path)."""
        if not (value >= 0 and math.isfinite(value)):
            return
        i = bisect.bisect_left(self._upper.tolist(), value)
        with self._lock:
            hist, acc = self._get(labels)
            hist[i] += 1
            acc[0] += value

    def remove(self, labels: tuple[str, ...]) -> None:
        """Drop a series (e.g. a configuration the registry evicted)."""
        with self._lock:
            self._series.pop(labels, None)

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            rows = [
                (k, np.cumsum(h, dtype=float).tolist(), acc[0])
                for k, (h, acc) in self._series.items()
            ]
        for labels, cum, total in rows:
            fam.add_metric(list(labels), list(zip(self._les, cum, strict=True)), total)
        yield fam
