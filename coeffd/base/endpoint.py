"""``HOST:PORT`` endpoints of the listeners (receivers and the daemon's HTTP server).

:data:`Endpoint` is the settings type: a string checked by :func:`parse_endpoint` when
the settings load, so a wrong endpoint stops start-up with the key named.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

__all__ = ["Endpoint", "parse_endpoint"]


def parse_endpoint(value: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` allowed; port 0 = pick a free port).

    >>> parse_endpoint("0.0.0.0:4317")
    ('0.0.0.0', 4317)
    >>> parse_endpoint("[::1]:0")
    ('::1', 0)
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError("expected HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _check_endpoint(value: str) -> str:
    parse_endpoint(value)
    return value


Endpoint = Annotated[str, AfterValidator(_check_endpoint)]
