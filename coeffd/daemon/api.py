"""HTTP API handlers over a ``SnapshotStore``: read-only coefficient endpoints.

The handlers are plain functions (request path + query -> ``Response``) with no server
attached, so any router can mount them and tests can call them directly:

* ``GET /v1/configurations`` - every configuration with its latest version;
* ``GET /v1/coefficients/{id}[?version=N][&format=json|flags|yaml]`` - latest (or N);
* ``GET /v1/coefficients/{id}/history`` - all retained versions, oldest first;
* ``GET /v1/predict?model=…&gpu=…&tp=…`` - coefficients for a described configuration,
  its own or predicted by the fleet model, with source and expected error
  (:mod:`daemon.predict`);
* ``GET /v1/statistics`` - this instance's learner statistics, for a query tier's merge
  (:mod:`daemon.query.statistics`; 503 until the learners' thread has built them).

Behind a query tier (:mod:`daemon.query.view`) every JSON answer about a configuration also
says which instances contributed and when each was last seen (``instances``; the
``X-Coeffd-Instances`` header carries the count in every format).

Errors are JSON ``{"error": {"status": .., "message": ..}}``: 404 for an unknown
configuration or version, 400 for a bad query, 405 for a non-GET method.
``handle(store, method, target)`` dispatches a raw request target; it returns None for
paths outside ``/v1/configurations`` and ``/v1/coefficients`` so a router can fall through.
``mount(router, store)`` registers the endpoints on the daemon's ``coeffd.base.http.Router``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import msgspec
import orjson

from coeffd.base.http import Request as HttpRequest
from coeffd.base.http import Response as HttpResponse
from coeffd.base.http import Router
from coeffd.daemon.predict import PredictError, Predictor, answer_query, render
from coeffd.daemon.publish.blis import to_flags, to_yaml_block
from coeffd.daemon.publish.snapshot import InvalidConfigurationIdError, Snapshot, validate_config_id
from coeffd.daemon.publish.store import SnapshotStore

JSON = "application/json"
FORMATS = {"json": JSON, "flags": "text/plain; charset=utf-8", "yaml": "application/yaml"}
Query = Mapping[str, Sequence[str]]
#: configuration id (or ``fleet``) → the instances behind its answer (query tier only)
Annotate = Callable[[str], list[dict[str, Any]] | None]


class Response(NamedTuple):
    """What a handler returns; ``headers`` always include ``Content-Type``."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def _json(status: int, payload: Any) -> Response:
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(status, [("Content-Type", JSON)], body)


def error(status: int, message: str) -> Response:
    """A JSON error response."""
    return _json(status, {"error": {"status": status, "message": message}})


def _snapshot_dict(snapshot: Snapshot) -> Any:
    return msgspec.to_builtins(snapshot)


def _single(query: Query, name: str) -> str | None:
    values = query.get(name)
    if not values:
        return None
    return values[-1]


#: Versions count snapshots (one a second at most per configuration): 15 digits outlast
#: any deployment, and keep file names and ``int()`` far from their limits.
MAX_VERSION_DIGITS = 15


def parse_version(raw: str) -> int:
    """A ``?version=`` value: ASCII decimal digits only, 1 to 15 of them, at least 1.

    ``int()`` alone also takes ``"1_0"``, ``" 7"``, ``"+3"`` and Unicode digits (``"١"``),
    and 300 digits made a file name too long for the OS (HTTP 500).

    >>> parse_version("42")
    42
    >>> parse_version("1_0")
    Traceback (most recent call last):
    ...
    ValueError: version must be a decimal integer (ASCII digits 0-9, at most 15), got '1_0'
    """
    if not (0 < len(raw) <= MAX_VERSION_DIGITS and raw.isascii() and raw.isdigit()):
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise ValueError(
            f"version must be a decimal integer (ASCII digits 0-9, at most "
            f"{MAX_VERSION_DIGITS}), got {shown!r}"
        )
    version = int(raw)
    if version < 1:
        raise ValueError(f"version must be >= 1, got {version}")
    return version


def list_configurations(store: SnapshotStore, annotate: Annotate | None = None) -> Response:
    """``GET /v1/configurations``."""
    out = []
    for cid in store.configurations():
        snap = store.latest(cid)
        if snap is None:
            continue
        entry = {
            "id": cid,
            "labels": snap.configuration.labels,
            "description": snap.configuration.description,
            "latest_version": snap.version,
            "wall_ns": snap.wall_ns,
        }
        out.append(entry | _instances(annotate, cid))
    return _json(200, {"configurations": out})


def _instances(annotate: Annotate | None, config_id: str) -> dict[str, Any]:
    found = annotate(config_id) if annotate is not None else None
    return {} if found is None else {"instances": found, "instance_count": len(found)}


def _with_instances(resp: Response, annotate: Annotate | None, config_id: str) -> Response:
    """Add the query tier's ``instances`` to a JSON answer and the count as a header."""
    extra = _instances(annotate, config_id)
    if not extra or resp.status != 200:
        return resp
    headers = [*resp.headers, ("X-Coeffd-Instances", str(extra["instance_count"]))]
    if dict(resp.headers).get("Content-Type") != JSON:
        return resp._replace(headers=headers)
    body = orjson.dumps(orjson.loads(resp.body) | extra)
    return Response(resp.status, headers, body)


def get_coefficients(store: SnapshotStore, config_id: str, query: Query | None = None) -> Response:
    """``GET /v1/coefficients/{id}``; ``version`` (int >= 1) and ``format`` (json|flags|yaml)."""
    query = query or {}
    fmt = _single(query, "format") or "json"
    if fmt not in FORMATS:
        return error(400, f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    raw_version = _single(query, "version")
    version: int | None = None
    if raw_version is not None:
        try:
            version = parse_version(raw_version)
        except ValueError as e:
            return error(400, str(e))
    try:
        validate_config_id(config_id)
    except InvalidConfigurationIdError:
        return error(404, f"unknown configuration {config_id!r}")
    snap = store.latest(config_id) if version is None else store.get(config_id, version)
    if snap is None:
        if version is not None and store.latest(config_id) is not None:
            return error(404, f"configuration {config_id!r} has no retained version {version}")
        return error(404, f"unknown configuration {config_id!r}")
    headers = [("Content-Type", FORMATS[fmt]), ("X-Coeffd-Version", str(snap.version))]
    if fmt == "flags":
        return Response(200, headers, (to_flags(snap) + "\n").encode())
    if fmt == "yaml":
        return Response(200, headers, to_yaml_block(snap).encode())
    return Response(200, headers, orjson.dumps(_snapshot_dict(snap)))


def get_history(store: SnapshotStore, config_id: str) -> Response:
    """``GET /v1/coefficients/{id}/history``: retained snapshots, oldest first."""
    try:
        validate_config_id(config_id)
    except InvalidConfigurationIdError:
        return error(404, f"unknown configuration {config_id!r}")
    history = store.history(config_id)
    if not history:
        return error(404, f"unknown configuration {config_id!r}")
    return _json(
        200, {"configuration": config_id, "versions": [_snapshot_dict(s) for s in history]}
    )


def get_prediction(store: SnapshotStore, predictor: Predictor | None, query: Query) -> Response:
    """``GET /v1/predict?model=…&gpu=…&tp=…`` (:mod:`daemon.predict`)."""
    fmt = _single(query, "format") or "json"
    if fmt not in FORMATS:
        return error(400, f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    try:
        answer = answer_query(store, predictor, query)
    except PredictError as e:
        return error(400, str(e))
    return Response(200, [("Content-Type", FORMATS[fmt])], render(answer, fmt))


def handle(
    store: SnapshotStore,
    method: str,
    target: str,
    predictor: Predictor | None = None,
    annotate: Annotate | None = None,
) -> Response | None:
    """Dispatch a raw request target (``/path?query``); None when the path isn't ours."""
    parts = urlsplit(target)
    path = parts.path.rstrip("/") or "/"
    query = parse_qs(parts.query, keep_blank_values=True)
    if path == "/v1/configurations":
        route = "list"
    elif path == "/v1/predict":
        route = "predict"
    elif path.startswith("/v1/coefficients/"):
        route = "coefficients"
    else:
        return None
    if method.upper() not in ("GET", "HEAD"):
        resp = error(405, f"method {method} not allowed")
        return resp._replace(headers=[*resp.headers, ("Allow", "GET, HEAD")])
    if route == "list":
        return list_configurations(store, annotate)
    if route == "predict":
        resp = get_prediction(store, predictor, query)
        if annotate is None or resp.status != 200 or _single(query, "format") not in (None, "json"):
            return resp
        answer = orjson.loads(resp.body)
        return _with_instances(
            resp,
            annotate,
            answer["configuration"]["id"] if answer.get("source") == "configuration" else "fleet",
        )
    segments = [unquote(s) for s in path[len("/v1/coefficients/") :].split("/")]
    if len(segments) == 1:
        return _with_instances(get_coefficients(store, segments[0], query), annotate, segments[0])
    if len(segments) == 2 and segments[1] == "history":
        return get_history(store, segments[0])
    return error(404, f"no such resource {parts.path!r}")


def mount(
    router: Router,
    store: SnapshotStore,
    predictor: Predictor | None = None,
    *,
    annotate: Annotate | None = None,
    statistics: Callable[[], bytes | None] | None = None,
) -> None:
    """Serve the API from ``store`` on the daemon's router (GET and HEAD); ``predictor``
    (the daemon's fleet model) answers ``/v1/predict`` for unseen configurations;
    ``annotate`` (the query tier) names the instances behind each answer; ``statistics``
    gives the newest ``/v1/statistics`` document (an instance that learns).

    ``/v1/configurations`` is an exact route and ``/v1/coefficients/`` a prefix route;
    both go through ``handle`` so routing rules live in one place.
    """

    def endpoint(req: HttpRequest) -> HttpResponse:
        target = req.path + ("?" + urlencode(req.query, doseq=True) if req.query else "")
        resp = handle(store, req.method, target, predictor, annotate) or error(
            404, f"no such resource {req.path!r}"
        )
        headers = dict(resp.headers)
        content_type = headers.pop("Content-Type", JSON)
        return HttpResponse(resp.status, resp.body, content_type, headers)

    if statistics is not None:
        get_statistics = statistics

        def statistics_endpoint(req: HttpRequest) -> HttpResponse:
            body = get_statistics()
            if body is None:
                r = error(503, "statistics not built yet; retry in a few seconds")
                return HttpResponse(r.status, r.body, JSON, {"Retry-After": "5"})
            return HttpResponse(200, body, JSON, {})

        router.add_route("GET", "/v1/statistics", statistics_endpoint)
    router.add_route("GET", "/v1/configurations", endpoint)
    router.add_route("GET", "/v1/predict", endpoint)
    router.add_route("GET", "/v1/coefficients/", endpoint, prefix=True)
