"""The fleet snapshot and predictions for described configurations, in the daemon.

:class:`FleetPublisher` runs on the pipeline worker (the learners' thread): every
``interval_s`` it rebuilds the :class:`~learners.fleet.model.FleetModel` from the registry's live
learner sets, publishes the fleet vector as snapshot ``fleet`` through the same store and
writer as every configuration (same BLIS validation: a vector BLIS would refuse is never
published), with its leave-one-configuration-out errors in the snapshot (``loco``) and as
the gauge ``coeffd_fleet_loco_error_ratio{config, coefficients}``.

The model it built is then swapped in as :attr:`FleetPublisher.model` in one reference
assignment; the HTTP API's ``/v1/predict`` reads it from its own threads. A built model is
never mutated (its pooled prior is a private copy), so readers need no lock.

The source each described configuration was answered with is remembered (the newest
:data:`REMEMBERED` descriptions) and handed to the next model's prediction as its
``incumbent``: a refit on slightly different data keeps the answer's source unless
another candidate is clearly better (:mod:`learners.fleet.model`, "Why hysteresis"),
so the same query does not flip between sources a minute apart.

No fleet snapshot before ``min_configurations`` (2) configurations have learned steps: a
"fleet" of one would be that configuration's vector under a global name — exactly what
``coeffd pull --defaults`` must never write into BLIS's single block.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson
import structlog
from prometheus_client import CollectorRegistry, Gauge

from coeffd.daemon.publish.policy import PublishPolicy
from coeffd.daemon.publish.snapshot import ConfigurationRef, ErrorStats, Snapshot
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.learners.fleet.model import FleetModel
from coeffd.learners.fleet.results import FLEET_ID, FleetResult, Prediction
from coeffd.learners.registry import LearnerRegistry

__all__ = ["FLEET_INTERVAL_S", "AnsweredSources", "FleetPublisher", "fleet_snapshot"]

log = structlog.get_logger(__name__)

#: Seconds between fleet refits: a fleet vector averages many configurations and moves
#: slowly; a refit with LOCO costs ~0.1 ms per configuration pair.
FLEET_INTERVAL_S = 10.0
#: Described configurations whose answered source is remembered (oldest forgotten first).
REMEMBERED = 4096


def _stats(mape: float, n: int) -> ErrorStats:
    return ErrorStats(mape=mape if math.isfinite(mape) else None, count=n)


def fleet_snapshot(result: FleetResult, version: int, wall_ns: int | None = None) -> Snapshot:
    """The ``fleet`` snapshot of a fit: vector, members, weights, LOCO errors.

    ``loco`` has one entry per scored configuration (source → error on its recent
    steps) and ``"mean"`` (the mean over them); ``prequential`` is left empty because the
    fleet vector is never scored on data it has learned.
    """
    loco = {
        cid: {s: _stats(e.mape, e.n) for s, e in row.items()} for cid, row in result.loco.items()
    }
    if result.summary:
        loco["mean"] = {s: _stats(v, len(result.loco)) for s, v in result.summary.items()}
    return Snapshot(
        configuration=ConfigurationRef(
            id=FLEET_ID,
            labels={"config": FLEET_ID, "kind": "fleet"},
            description={
                "kind": "fleet",
                "what": "joint fit of one alpha/beta over every configuration's learner "
                "statistics (learners.fleet); error: leave-one-configuration-out",
                "members": list(result.members),
                "weights": result.weights,
                "best_prediction_source": result.best_source,
                "factor_strengths": result.factor_strengths,
                "factor_alpha_from": result.factor_alpha_from,
            },
        ),
        version=version,
        wall_ns=time.time_ns() if wall_ns is None else wall_ns,
        alpha=result.alpha,
        beta=result.beta,
        observations={"configurations": len(result.members), "beta": int(result.observations)},
        loco=loco,
    )


class AnsweredSources:
    """The source each described configuration was last answered with (the newest
    :data:`REMEMBERED`), handed to the next model as its ``incumbent`` (module docs); any
    thread may call :meth:`predict`."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self.size = size
        self._answered: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    def predict(self, model: FleetModel, description: Mapping[str, Any]) -> Prediction:
        """``model``'s prediction for ``description``, keeping the source answered before
        while it stays close to the best."""
        key = orjson.dumps(dict(description), option=orjson.OPT_SORT_KEYS, default=str)
        with self._lock:
            incumbent = self._answered.get(key)
        p = model.predict(description, incumbent=incumbent)
        with self._lock:
            self._answered[key] = p.source
            self._answered.move_to_end(key)
            while len(self._answered) > self.size:
                self._answered.popitem(last=False)
        return p


class FleetPublisher:
    """Refit, publish and serve the fleet model (see module docs)."""

    def __init__(
        self,
        registry: LearnerRegistry,
        metrics: CollectorRegistry | None = None,
        *,
        interval_s: float = FLEET_INTERVAL_S,
        min_configurations: int = 2,
        policy: PublishPolicy | None = None,
    ) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self.min_configurations = min_configurations
        self.policy = policy or PublishPolicy(interval_s=60.0, relative_threshold=0.02)
        #: The newest built model (None before the first refit); read by the HTTP API.
        self.model: FleetModel | None = None
        self.last: Snapshot | None = None
        self._next_version: int | None = None
        self._due = 0.0
        self.refits = 0
        self._rejected_logged: set[str] = set()
        self._answered = AnsweredSources()
        self._loco: Gauge | None = None
        self._members: Gauge | None = None
        if metrics is not None:
            self._loco = Gauge(
                "coeffd_fleet_loco_error_ratio",
                "Leave-one-configuration-out step-time MAPE of the fleet model (and of each "
                "prediction candidate, and BLIS's defaults) on each configuration's recent steps",
                ["config", "coefficients"],
                registry=metrics,
            )
            self._members = Gauge(
                "coeffd_fleet_configurations",
                "Configurations whose learner statistics the fleet model combines",
                registry=metrics,
            )

    def refit(self) -> FleetModel:
        """Build a new model from the registry (worker thread) and swap it in."""
        model = FleetModel.from_registry(self.registry)  # its pool is a private copy
        for key in set(model.rejected) - self._rejected_logged:
            self._rejected_logged.add(key)
            log.warning("fleet_member_skipped", config=key, reason="non-finite statistics")
        model.result()  # computed here, not on an HTTP thread
        self.model = model
        self.refits += 1
        return model

    def tick(self, now: float, store: SnapshotStore | None, force: bool = False) -> Snapshot | None:
        """Refit when due; return a fleet snapshot to publish (None: nothing new)."""
        if not force and now < self._due:
            return None
        self._due = now + self.interval_s
        model = self.refit()
        r = model.result()
        self._export(r)
        if store is None or len(model) < self.min_configurations:
            return None
        previous = self.last
        if previous is None and self._next_version is None:
            previous = store.latest(FLEET_ID)
        ok, reason = self.policy.decide(previous, r.alpha, r.beta, int(now * 1e9))
        if reason == "invalid":  # fit_beta falls back to defaults, so only a bug gets here
            log.error("refusing to publish an invalid fleet vector")
            return None
        if not ok and not force:
            return None
        version = self._next_version or store.next_version(FLEET_ID)
        self._next_version = version + 1
        snap = fleet_snapshot(r, version)
        self.last = snap
        return snap

    def _export(self, r: FleetResult) -> None:
        if self._members is not None:
            self._members.set(len(r.members))
        if self._loco is None:
            return
        for cid, row in r.loco.items():
            for source, e in row.items():
                if math.isfinite(e.mape):
                    self._loco.labels(cid, source).set(e.mape)
        for source, v in r.summary.items():
            if math.isfinite(v):
                self._loco.labels("mean", source).set(v)

    def predict(self, description: Mapping[str, Any]) -> Prediction | None:
        """A prediction for an unseen configuration (None before the first refit), from
        the source it was answered with before while that stays close to the best."""
        model = self.model
        return None if model is None else self._answered.predict(model, description)
