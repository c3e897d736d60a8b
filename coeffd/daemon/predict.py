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

A query need not name every knob: when no learned configuration has exactly the
described identity, the learned configurations that match every key the query *gives*
(knobs not given match any; model and GPU names case-insensitively) answer with their own
coefficients; of several, the one with the most step observations, the others listed in
``other_matches`` with the keys that set each apart (:func:`answer_query`). A model or GPU
name this server knows nothing of (not bundled, not in its catalogue directories, not
learned here) is refused with the known names and the closest ones, rather than answered
with a guess for a typo.

The query is untrusted: values are names, never paths — nothing here opens a file or
resolves a model; a value is at most :data:`MAX_VALUE` printable characters and keys
must be vocabulary keys (else 400). ``format=json|flags|yaml`` as for
``/v1/coefficients``.
"""

from __future__ import annotations

import dataclasses
import difflib
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from coeffd.daemon.publish.blis import to_flags, to_yaml_block
from coeffd.daemon.publish.snapshot import ConfigurationRef, Snapshot, validate_for_blis
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.learners.features import BLIS_DEFAULT_ALPHA, BLIS_DEFAULT_BETA
from coeffd.learners.features.catalog import MODELS, canonical_model_name
from coeffd.learners.features.config import (
    ATTRIBUTE_PREFIX,
    BasisResolver,
    ServingConfig,
    ServingConfigError,
)
from coeffd.learners.features.hardware import available_gpus
from coeffd.learners.fleet.error import ERROR_BASES
from coeffd.learners.fleet.results import FLEET_ID, Prediction

__all__ = [
    "MAX_VALUE",
    "PredictError",
    "Predictor",
    "answer_query",
    "check_names",
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


def given_keys(query: Mapping[str, Sequence[str]]) -> frozenset[str]:
    """The vocabulary keys a query names (``coeffd.`` prefix dropped, ``format`` left out).

    >>> sorted(given_keys({"coeffd.model": ["m"], "gpu": ["H100"], "format": ["json"]}))
    ['gpu', 'model']
    """
    return frozenset(
        k.removeprefix(ATTRIBUTE_PREFIX) for k, v in query.items() if v and k != "format"
    )


def _learned(store: SnapshotStore | None) -> list[Snapshot]:
    """The latest snapshot of every learned configuration (the fleet vector left out)."""
    if store is None:
        return []
    snaps = (store.latest(cid) for cid in store.configurations() if cid != FLEET_ID)
    return [s for s in snaps if s is not None]


def _resolver(predictor: Predictor | None) -> BasisResolver:
    """The daemon's model/GPU resolver (its catalogue directories), else the bundled one."""
    registry = getattr(predictor, "registry", None)
    found = getattr(registry, "resolver", None)
    return found if isinstance(found, BasisResolver) else BasisResolver()


def _unknown(kind: str, name: str, known: Sequence[str]) -> PredictError:
    """One line: the name, the closest known names, every known name."""
    lower = {k.lower(): k for k in known}
    close = [lower[m] for m in difflib.get_close_matches(name.lower(), list(lower), n=3)]
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return PredictError(
        f"unknown {kind} {name!r}{hint}; known {kind}s (bundled or learned here): "
        + ", ".join(sorted(known, key=str.lower))
    )


def check_names(
    config: ServingConfig, store: SnapshotStore | None, predictor: Predictor | None = None
) -> ServingConfig:
    """``config`` with its GPU name in the known spelling; :class:`PredictError` for a model
    or GPU this server knows nothing of (a typo must not be answered with a guess).

    Known: bundled, in the daemon's catalogue (``catalog.*``), or learned here. GPU names
    match case-insensitively where that picks one name. A model sent with its
    ``model_config_hash`` (``coeffd pull --model config.json``) is the client's own file.

    >>> check_names(ServingConfig(model="llama-3.1-8b-instruct", gpu="h100"), None).gpu
    'H100'
    >>> check_names(ServingConfig(model="llama-3.1-70b-instuct", gpu="H100"), None)
    Traceback (most recent call last):
    ...
    coeffd.daemon.predict.PredictError: unknown model 'llama-3.1-70b-instuct' (did you mean llama-3.1-70b-instruct...
    """
    learned = _learned(store)
    resolver = _resolver(predictor)
    models = {str(s.configuration.labels.get("model", "")) for s in learned} - {""}
    if (
        not config.model_config_hash
        and canonical_model_name(config.model) is None
        and config.model.lower() not in {m.lower() for m in models}
    ):
        try:
            resolver.model(config)
        except (ValueError, OSError):
            raise _unknown("model", config.model, sorted(set(MODELS) | models)) from None
    gpus = set(available_gpus()) | {str(s.configuration.labels.get("gpu", "")) for s in learned}
    gpus.discard("")
    if config.gpu in gpus:
        return config
    try:
        resolver.hardware(config)
        return config
    except (ValueError, OSError):
        pass
    same = sorted(g for g in gpus if g.lower() == config.gpu.lower())
    if len(same) == 1:
        return config.with_changes(gpu=same[0])
    if same:
        raise PredictError(f"GPU {config.gpu!r} is ambiguous: which of {', '.join(same)}?")
    raise _unknown("GPU", config.gpu, sorted(gpus))


def _observations(snap: Snapshot) -> int:
    obs = snap.observations
    return int(obs.get("beta", obs.get("step_period", 0)))


def _identity(description: Mapping[str, Any]) -> dict[str, Any] | None:
    """A learned configuration's identity (names lower-cased), None if it does not parse."""
    try:
        ident = ServingConfig.from_dict(
            {k: v for k, v in description.items() if k in _FIELDS and v is not None}
        ).identity()
    except (ServingConfigError, TypeError, ValueError):
        return None
    return ident | {"model": str(ident["model"]).lower(), "gpu": str(ident["gpu"]).lower()}


def _matching(
    learned: Sequence[Snapshot], config: ServingConfig, given: frozenset[str]
) -> list[tuple[Snapshot, dict[str, Any]]]:
    """Learned configurations whose identity agrees with ``config`` on every given key,
    the one with the most step observations first (then by id: deterministic)."""
    want = _identity(config.to_dict())
    if want is None:
        return []
    keys = given & set(want)
    found = []
    for snap in learned:
        ident = _identity(snap.configuration.description)
        if ident is not None and all(ident[k] == want[k] for k in keys):
            found.append((snap, ident))
    return sorted(found, key=lambda f: (-_observations(f[0]), f[0].config_id))


def _own(snap: Snapshot) -> dict[str, Any]:
    step = snap.prequential.get("step_period", {}).get("learned")
    return {
        "source": "configuration",
        "alpha": list(snap.alpha),
        "beta": list(snap.beta),
        "expected_error": step.mape if step is not None else None,
        "error_basis": "prequential step-time MAPE of these coefficients",
        "version": snap.version,
        "wall_ns": snap.wall_ns,
    }


def answer_query(
    store: SnapshotStore | None, predictor: Predictor | None, query: Mapping[str, Sequence[str]]
) -> dict[str, Any]:
    """The ``/v1/predict`` answer for a raw query (module docs); raises :class:`PredictError`.

    The learned configuration of exactly this identity, else those matching every key the
    query gives (``matched_on``; several: the most observed, the rest in
    ``other_matches``, each with ``differs``: its values of the keys where it differs),
    else :func:`predict`.
    """
    config = check_names(describe(query), store, predictor)
    if store is None or store.latest(config.id) is not None:
        return predict(store, predictor, config)
    given = given_keys(query)
    found = _matching(_learned(store), config, given)
    if not found:
        return predict(store, predictor, config)
    (snap, ident), rest = found[0], found[1:]
    ref = snap.configuration
    others = [
        {
            "id": s.config_id,
            "labels": s.configuration.labels,
            "observations": _observations(s),
            "differs": {
                k: s.configuration.description.get(k, v)
                for k, v in i.items()
                if k not in ("model", "gpu", "model_config_hash") and v != ident.get(k)
            },
        }
        for s, i in rest
    ]
    return (
        {"configuration": {"id": ref.id, "labels": ref.labels, "description": ref.description}}
        | _own(snap)
        | {"matched_on": sorted(given & _FIELDS), "other_matches": others}
    )


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
        return out | _own(own)
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
