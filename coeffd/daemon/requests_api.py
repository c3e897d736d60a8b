"""``GET /v1/requests/{id}[?since=SECONDS]``: a configuration's finished requests, for
``coeffd trace`` to write as a BLIS TraceV2 pair (issue 31).

The answer is JSON: ``configuration`` (id and description: model, TP, knobs, KV size),
``columns`` and ``requests`` (one array per request, oldest arrival first: times in µs of
the API server's wall clock, 0 where the request never got there; the status TraceV2
writes). ``since`` keeps the requests that arrived at most that many seconds before the
newest one departed. Errors as :mod:`coeffd.daemon.api` answers them: 404 for a
configuration never seen, 400 for a bad query.
"""

from __future__ import annotations

import math
from urllib.parse import unquote

import orjson

from coeffd.base.http import Request, Response, Router
from coeffd.daemon.api import JSON, error
from coeffd.daemon.learning.requests import FinishedRequest, RequestRing
from coeffd.daemon.publish.snapshot import InvalidConfigurationIdError, validate_config_id

PREFIX = "/v1/requests/"
COLUMNS = list(FinishedRequest._fields)


def parse_since(raw: str) -> float:
    """A ``?since=`` value: finite seconds > 0.

    >>> parse_since("600"), parse_since("2.5")
    (600.0, 2.5)
    """
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"since must be a number of seconds > 0, got {raw[:40]!r}")
    return value


def get_requests(ring: RequestRing, config_id: str, since: str | None) -> tuple[int, bytes]:
    """(status, JSON body) of ``GET /v1/requests/{config_id}``."""
    try:
        validate_config_id(config_id)
    except InvalidConfigurationIdError as exc:
        return _error(400, str(exc))
    description = ring.description(config_id)
    if description is None:
        return _error(404, f"no requests seen for configuration {config_id!r}")
    try:
        since_s = parse_since(since) if since is not None else None
    except ValueError as exc:
        return _error(400, str(exc))
    rows = ring.requests(config_id, since_s)
    body = orjson.dumps(
        {
            "configuration": {"id": config_id, "description": description},
            "columns": COLUMNS,
            "requests": [list(r) for r in rows],
        }
    )
    return 200, body


def _error(status: int, message: str) -> tuple[int, bytes]:
    resp = error(status, message)
    return resp.status, resp.body


def mount(router: Router, ring: RequestRing) -> None:
    """Serve ``GET /v1/requests/{id}`` from ``ring`` on the daemon's router."""

    def endpoint(req: Request) -> Response:
        config_id = unquote(req.path[len(PREFIX) :].rstrip("/"))
        since = req.query.get("since")
        raw = since[-1] if isinstance(since, list) and since else None
        status, body = get_requests(ring, config_id, raw)
        return Response(status, body, JSON, {})

    router.add_route("GET", PREFIX, endpoint, prefix=True)
