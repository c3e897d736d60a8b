"""What the fleet model answers: the fleet vector with its honest error, and coefficients
for a described configuration.

:class:`FleetResult` is the fleet vector — one α/β fitted jointly over every
configuration — with every candidate's leave-one-configuration-out (LOCO) error on each
configuration's recent steps beside BLIS's shipped vector's; the daemon publishes it as
the snapshot :data:`FLEET_ID`. :class:`Prediction` is what a user pulls for a
configuration: coefficients, the candidate they came from, and the step-time error to
expect of them, with how that was reckoned (:mod:`learners.fleet.error`). Both are made
by :class:`~learners.fleet.model.FleetModel`.

>>> r = FleetResult(alpha=(1.0,), beta=(1.0,), members=("a",), weights={"a": 1.0},
...                 loco={"a": {"fleet": LocoError(0.02, 50), "blis_default": LocoError(0.2, 50)}},
...                 summary={"fleet": 0.02, "blis_default": 0.2}, best_source="fleet",
...                 observations=50.0)
>>> {k: round(v, 3) for k, v in r.loco_ratio().items()}
{'a': 0.1}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FLEET_ID", "FleetResult", "LocoError", "Prediction"]

#: Snapshot id of the fleet vector (configuration ids are 12 hex digits: no clash).
FLEET_ID = "fleet"


@dataclass(frozen=True)
class LocoError:
    """Error of one coefficient source on one configuration's recent step rows."""

    mape: float
    n: int


@dataclass(frozen=True)
class FleetResult:
    """The fleet vector and its honest error.

    ``loco[config][source]`` for ``source`` in :data:`~learners.fleet.model.SOURCES` + ``blis_default``;
    ``summary[source]`` is the mean over configurations (what picks the predictor).
    """

    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    members: tuple[str, ...]
    weights: dict[str, float]
    loco: dict[str, dict[str, LocoError]]
    summary: dict[str, float]
    best_source: str
    observations: float
    #: ridge strengths of ``fleet_factors``' offsets chosen by LOCO (``beta`` and each α
    #: target; :data:`learners.fleet.factors.STRENGTHS`)
    factor_strengths: dict[str, float] = field(default_factory=dict)
    #: where ``fleet_factors`` takes each α target from (``factors`` or ``kernel``), by LOCO
    factor_alpha_from: dict[str, str] = field(default_factory=dict)

    def loco_ratio(self, source: str = "fleet") -> dict[str, float]:
        """Per configuration: LOCO error of ``source`` / error of BLIS's defaults."""
        out = {}
        for cid, row in self.loco.items():
            d = row.get("blis_default")
            s = row.get(source)
            if d is not None and s is not None and d.mape > 0:
                out[cid] = s.mape / d.mape
        return out


@dataclass(frozen=True)
class Prediction:
    """Coefficients for a described configuration, where they came from, how good."""

    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    source: str
    expected_error: float | None
    similar: tuple[str, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)
    #: how ``expected_error`` was reckoned (:data:`~learners.fleet.error.ERROR_BASES`)
    error_basis: str = ""
