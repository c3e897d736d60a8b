"""``GET /v1/predict``: coefficients for a described serving configuration.

The query uses the ``coeffd.*`` resource-attribute vocabulary (``model``, ``gpu``, ``tp``,
``dp``, ``ep``, ``moe_comm_backend``, ``max_num_batched_tokens``, …; the ``coeffd.``
prefix may be kept): ``/v1/predict?model=llama-3.1-70b-instruct&gpu=H200&tp=4``.

The answer is the configuration's own published coefficients when coeffd has learned it
(``source: configuration``), else the fleet model's best prediction for it
(``fleet``, ``fleet_local``, ``fleet_factors`` or ``pooled_prior``, chosen by
leave-one-configuration-out error; :mod:`learners.fleet`), else BLIS's shipped vector (``blis_default``). Every
answer states its ``expected_error`` (step-time MAPE) and how it was reckoned
(``error_basis``): the configuration's own prequential error; for the factor model, the
step noise of the known configurations most like it and the prediction's own
uncertainty, at one standard deviation (``error_parts``: ``noise_error``, ``bias_sd``);
for the other sources, the LOCO errors of the known configurations most like it, mean
plus one standard deviation.

The query is untrusted: values are names, never paths — nothing here opens a file or
resolves a model; a value is at most :data:`MAX_VALUE` printable characters and keys
must be vocabulary keys (else 400). ``format=json|flags|yaml`` as for
``/v1/coefficients``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from coeffd.daemon.publish.blis import to_flags, to_yaml_block
from coeffd.daemon.publish.snapshot import ConfigurationRef, Snapshot, validate_for_blis
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.learners.features import BLIS_DEFAULT_ALPHA, BLIS_DEFAULT_BETA
from coeffd.learners.features.config import ATTRIBUTE_PREFIX, ServingConfig, ServingConfigError
from coeffd.learners.fleet.error import ERROR_BASES
from coeffd.learners.fleet.results import FLEET_ID, Prediction

__all__ = [
    "MAX_VALUE",
    "PredictError",
    "Predictor",
    "describe",
    "error_text",
    "iso_time",
    "predict",
    "render",
]

#: Longest accepted query value (model names and HF repo ids are far shorter).
MAX_VALUE = 200
_FIELDS = frozenset(f.name for f in dataclasses.fields(ServingConfig))


class PredictError(ValueError):
    """A bad query; the message names the key (HTTP 400)."""


class Predictor(Protocol):
    """What the API needs from the fleet model (``daemon.fleet.FleetPublisher``)."""

    def predict(self, description: Mapping[str, Any]) -> Prediction | None: ...


def describe(query: Mapping[str, Sequence[str]]) -> ServingConfig:
    """The configuration a query describes; raises :class:`PredictError`.

    >>> describe({"model": ["llama-3.1-8b-instruct"], "coeffd.gpu": ["H100"], "tp": ["2"]}).tp
    2
    >>> describe({"model": ["m"], "gpu": ["H100"], "path": ["/etc"]})
    Traceback (most recent call last):
    ...
    coeffd.daemon.predict.PredictError: unknown key 'path'; expected coeffd.* vocabulary: ...
    """
    data: dict[str, str] = {}
    for raw_key, values in query.items():
        if raw_key == "format" or not values:
            continue
        key = raw_key[len(ATTRIBUTE_PREFIX) :] if raw_key.startswith(ATTRIBUTE_PREFIX) else raw_key
        if key not in _FIELDS:
            raise PredictError(
                f"unknown key {raw_key!r}; expected coeffd.* vocabulary: "
                + ", ".join(sorted(_FIELDS))
            )
        value = values[-1]
        if len(value) > MAX_VALUE or not value.isprintable():
            raise PredictError(f"{key}: value too long or not printable")
        data[key] = value
    try:
        return ServingConfig.from_dict(data)
    except ServingConfigError as exc:
        raise PredictError(str(exc)) from None


def iso_time(wall_ns: int) -> str:
    """UTC wall time to the second, as the provenance comments write it.

    >>> iso_time(1_700_000_000_000_000_000)
    '2023-11-14T22:13:20Z'
    """
    return datetime.fromtimestamp(wall_ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def predict(
    store: SnapshotStore | None, predictor: Predictor | None, config: ServingConfig
) -> dict[str, Any]:
    """The answer for ``config`` (see module docs), as a JSON-able dict."""
    out: dict[str, Any] = {
        "configuration": {"id": config.id, "labels": config.labels, "description": config.to_dict()}
    }
    own = store.latest(config.id) if store is not None else None
    if own is not None:
        step = own.prequential.get("step_period", {}).get("learned")
        return out | {
            "source": "configuration",
            "alpha": list(own.alpha),
            "beta": list(own.beta),
            "expected_error": step.mape if step is not None else None,
            "error_basis": "prequential step-time MAPE of these coefficients",
            "version": own.version,
            "wall_ns": own.wall_ns,
        }
    p = predictor.predict(config.to_dict()) if predictor is not None else None
    fleet = store.latest(FLEET_ID) if store is not None else None
    if p is None:
        mean = fleet.loco.get("mean", {}).get("blis_default") if fleet is not None else None
        return out | {
            "source": "blis_default",
            "alpha": list(BLIS_DEFAULT_ALPHA),
            "beta": list(BLIS_DEFAULT_BETA),
            "expected_error": mean.mape if mean is not None else None,
            "error_basis": "BLIS defaults' mean step-time MAPE over known configurations",
            "version": None,
            "wall_ns": time.time_ns(),
        }
    validate_for_blis(p.alpha, p.beta)  # never hand out a vector BLIS would refuse
    return out | {
        "source": p.source,
        "alpha": list(p.alpha),
        "beta": list(p.beta),
        "expected_error": p.expected_error,
        "error_basis": ERROR_BASES.get(p.error_basis, p.error_basis),
        **(
            {"error_parts": {k: p.detail[k] for k in ("noise_error", "bias_sd")}}
            if "bias_sd" in p.detail
            else {}
        ),
        "similar": list(p.similar),
        "version": fleet.version if fleet is not None else None,
        "wall_ns": time.time_ns(),
    }


def error_text(answer: Mapping[str, Any]) -> str:
    """How good the answer's coefficients are, in words.

    >>> error_text({"expected_error": 0.032}), error_text({"expected_error": None})
    ('expected step-time error 3.2 %', 'expected step-time error unknown')
    >>> error_text({"expected_error": 0.029,
    ...             "error_parts": {"noise_error": 0.02, "bias_sd": 0.021}})
    'expected step-time error 2.9 % (step noise 2.0 %, coefficients ±2.1 %)'
    >>> error_text({"expected_error": 0.029, "error_parts": {"bias_sd": "x"}})
    'expected step-time error 2.9 %'
    """
    err = answer.get("expected_error")
    text = "expected step-time error " + (
        f"{100 * err:.1f} %" if isinstance(err, float) else "unknown"
    )
    parts = answer.get("error_parts")
    if isinstance(parts, Mapping):  # a server's answer: print only what is what it says
        noise, doubt = parts.get("noise_error"), parts.get("bias_sd")
        if isinstance(noise, float) and isinstance(doubt, float):
            text += f" (step noise {100 * noise:.1f} %, coefficients ±{100 * doubt:.1f} %)"
    return text


def comment(answer: Mapping[str, Any]) -> str:
    """One YAML comment line saying what the coefficients are and how good."""
    cfg = answer["configuration"]
    label = "/".join(
        str(cfg["description"].get(k)) for k in ("model", "gpu", "tp") if k in cfg["description"]
    )
    return (
        f"# coeffd: {answer['source']} coefficients for {label} (configuration "
        f"{cfg['id']}), {error_text(answer)}, {iso_time(int(answer['wall_ns']))}"
    )


def as_snapshot(answer: Mapping[str, Any]) -> Snapshot:
    """The answer's vectors in a :class:`Snapshot` (for the flags/YAML formatters)."""
    cfg = answer["configuration"]
    return Snapshot(
        configuration=ConfigurationRef(id=cfg["id"], labels=cfg["labels"]),
        version=int(answer.get("version") or 1),
        wall_ns=int(answer["wall_ns"]),
        alpha=tuple(answer["alpha"]),
        beta=tuple(answer["beta"]),
    )


def render(answer: Mapping[str, Any], fmt: str) -> bytes:
    """``json`` (the answer), ``flags`` or ``yaml`` (block with a provenance comment)."""
    if fmt == "flags":
        return (to_flags(as_snapshot(answer)) + "\n").encode()
    if fmt == "yaml":
        block = to_yaml_block(as_snapshot(answer)).split("\n", 1)[1]
        return (comment(answer) + "\n" + block).encode()
    return orjson.dumps(answer)
