"""Which coeffd instances the query tier reads, and how it asks them.

A peer list (``query.peers``, ``coeffd serve --peers``) is comma-separated entries:

* a base URL, ``http://10.0.0.5:9464`` or ``https://coeffd-0.example:9464``: one peer;
* ``dns+HOST:PORT``: every address ``HOST`` resolves to, re-resolved on every refresh. A
  Kubernetes headless Service resolves to the addresses of its ready pods, so a pod that
  starts or goes away joins or leaves the fleet view with no other mechanism (Thanos
  Query's and Prometheus' ``dns+`` service discovery, the same convention).

Peers are asked over plain ``http.client`` with the client side of the API's own
security: a CA bundle to verify peers, a client certificate for mTLS, a bearer token
(:class:`PeerClientSettings`). The body is read up to ``max_bytes`` and no further, so a
peer answering a gigabyte costs a bounded read and a "too large" count, not the query
tier's memory.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from coeffd.base.endpoint import parse_endpoint
from coeffd.base.security import read_token

__all__ = [
    "PeerClient",
    "PeerClientSettings",
    "PeerError",
    "PeerSource",
    "parse_peers",
    "resolve_peers",
]

Resolver = Callable[[str, int], Sequence[str]]


class PeerError(Exception):
    """A peer that could not be asked or answered badly; ``reason`` is a metric label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class PeerSource:
    """One entry of a peer list: a fixed URL, or a DNS name to resolve each refresh."""

    scheme: str  # http | https
    host: str
    port: int
    dns: bool = False

    def url(self, host: str | None = None) -> str:
        h = host if host is not None else self.host
        h = f"[{h}]" if ":" in h else h
        return f"{self.scheme}://{h}:{self.port}"


def parse_peers(spec: str | Sequence[str], *, dns_scheme: str = "http") -> list[PeerSource]:
    """Parse a peer list; raises ``ValueError`` naming the bad entry.

    >>> [p.url() for p in parse_peers("http://10.0.0.5:9464, dns+coeffd-headless:9464")]
    ['http://10.0.0.5:9464', 'http://coeffd-headless:9464']
    >>> parse_peers("dns+coeffd-headless:9464")[0].dns
    True
    >>> parse_peers("ftp://x:1")
    Traceback (most recent call last):
    ...
    ValueError: peer 'ftp://x:1': expected http(s)://HOST:PORT or dns+HOST:PORT
    """
    entries = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[PeerSource] = []
    for raw in (e.strip() for e in entries):
        if not raw:
            continue
        bad = ValueError(f"peer {raw!r}: expected http(s)://HOST:PORT or dns+HOST:PORT")
        if raw.startswith("dns+"):
            try:
                host, port = parse_endpoint(raw[4:])
            except ValueError:
                raise bad from None
            if not host or port == 0:
                raise bad
            out.append(PeerSource(dns_scheme, host, port, dns=True))
            continue
        parts = urlsplit(raw)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
        ):
            raise bad
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise bad from None
        out.append(PeerSource(parts.scheme, parts.hostname, port))
    return out


def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def resolve_peers(
    sources: Sequence[PeerSource], resolver: Resolver = _getaddrinfo
) -> tuple[list[str], list[str]]:
    """Base URLs of every peer now, sorted; and one error line per name that did not resolve
    (its peers are then only missing from this refresh: their statistics age, not vanish).

    >>> fake = lambda host, port: ["10.0.0.7", "10.0.0.6"]
    >>> resolve_peers(parse_peers("dns+svc:9464,http://a:1"), fake)
    (['http://10.0.0.6:9464', 'http://10.0.0.7:9464', 'http://a:1'], [])
    """
    urls: set[str] = set()
    errors: list[str] = []
    for src in sources:
        if not src.dns:
            urls.add(src.url())
            continue
        try:
            urls.update(src.url(addr) for addr in resolver(src.host, src.port))
        except OSError as exc:
            errors.append(f"dns+{src.host}:{src.port}: {exc}")
    return sorted(urls), errors


class PeerClientSettings(BaseModel):
    """How the query tier asks its peers (``query.client``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: PEM CA bundle that peers' certificates must chain to ("" = the system's).
    ca_file: str = ""
    #: Client certificate and key for peers that require mutual TLS.
    cert_file: str = ""
    key_file: str = ""
    #: Name to verify peers' certificates against when they are reached by address (a
    #: headless Service resolves to pod IPs): e.g. the Service's DNS name in the cert's SANs.
    server_name: str = ""
    #: File holding the bearer token peers' ``http.auth`` expects ("" = none).
    bearer_token_file: str = ""
    timeout_seconds: float = Field(default=5.0, gt=0.0, le=300.0)
    #: Largest statistics answer read from one peer.
    max_bytes: int = Field(default=64 << 20, ge=1024, le=1 << 34)


class PeerClient:
    """GET a path from a peer, with TLS, token, timeout and a bounded body."""

    def __init__(self, settings: PeerClientSettings | None = None) -> None:
        self.settings = settings or PeerClientSettings()
        s = self.settings
        self._token = read_token(s.bearer_token_file).decode() if s.bearer_token_file else ""
        self._ctx: ssl.SSLContext | None = None

    def _context(self) -> ssl.SSLContext:
        if self._ctx is None:
            s = self.settings
            ctx = ssl.create_default_context(cafile=s.ca_file or None)
            if s.cert_file:
                ctx.load_cert_chain(s.cert_file, s.key_file or None)
            self._ctx = ctx
        return self._ctx

    def get(self, base_url: str, path: str) -> bytes:
        """The body of ``GET base_url + path``; raises :class:`PeerError`."""
        s = self.settings
        parts = urlsplit(base_url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = _VerifiedHTTPS(host, port, s.timeout_seconds, self._context(), s.server_name)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=s.timeout_seconds)
        headers = {"Accept": "application/json", "User-Agent": "coeffd-query"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            body = resp.read(s.max_bytes + 1)
        except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
            raise PeerError("unreachable", f"{base_url}: {exc}") from None
        finally:
            conn.close()
        if resp.status != 200:
            raise PeerError("http_error", f"{base_url}{path}: HTTP {resp.status}")
        if len(body) > s.max_bytes:
            raise PeerError("too_large", f"{base_url}{path}: over {s.max_bytes} bytes")
        return body


class _VerifiedHTTPS(http.client.HTTPSConnection):
    """HTTPS to an address, verifying the certificate against ``server_name`` if given."""

    def __init__(
        self, host: str, port: int, timeout: float, context: ssl.SSLContext, server_name: str
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name = server_name or host
        self._tls = context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self._server_name)
