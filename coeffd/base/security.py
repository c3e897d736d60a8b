"""TLS and bearer-token authentication of every HTTP and gRPC listener: the OTLP receivers
and the HTTP API.

Not of the KV-event stream: vLLM's ZMQ publisher has neither (plain ZMQ, no CURVE), so
coeffd's SUB socket cannot ask for them. KV must stay on localhost (a sidecar) or behind
a NetworkPolicy that admits only coeffd and the engines: whoever reaches a publisher reads
the token ids of every cached block, and whoever reaches a bound coeffd (``kv.bind``)
can feed it (counted and bounded, but believed).

Settings follow the OpenTelemetry Collector's ``configtls`` server shape (``cert_file``,
``key_file``, ``client_ca_file``) and its ``bearertokenauth`` extension (a token read
from a file, typically a mounted Kubernetes Secret), one ``tls`` and one ``auth`` table
per listener::

    [receivers.otlp_grpc.tls]
    cert_file = "/etc/coeffd/tls/tls.crt"
    key_file = "/etc/coeffd/tls/tls.key"
    client_ca_file = "/etc/coeffd/tls/ca.crt"   # optional: mTLS
    [receivers.otlp_grpc.auth]
    bearer_token_file = "/etc/coeffd/token/token"

The files are checked while the settings load, so a missing file or a key that does not
belong to its certificate stops ``coeffd serve`` before anything listens (exit 2, one
line naming the key). Certificates are read once at start-up; the token file is re-read
when it changes (a rotated Secret needs no restart).

>>> TlsSettings().enabled, AuthSettings().enabled
(False, False)
>>> bearer("Bearer abc"), bearer("bearer  abc "), bearer("Basic abc"), bearer(None)
(b'abc', b'abc', None, None)
"""

from __future__ import annotations

import hmac
import os
import ssl
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import grpc
import structlog
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from coeffd.base.ratelimit import RateLimiter

__all__ = [
    "AuthMetrics",
    "AuthSettings",
    "Gate",
    "TlsSettings",
    "TokenFile",
    "bearer",
    "grpc_server_credentials",
    "grpc_token_interceptor",
    "http_guard",
    "server_ssl_context",
]

log = structlog.get_logger(__name__)

#: How often a token file's mtime is looked at (a rotated Secret takes effect this late).
TOKEN_RECHECK_SECONDS = 1.0
#: A token file larger than this is a wrong path, not a token (and never read whole).
MAX_TOKEN_BYTES = 64 * 1024


def read_token(path: str) -> bytes:
    """The token in ``path`` without surrounding whitespace; ``ValueError`` if the file
    is larger than :data:`MAX_TOKEN_BYTES`."""
    with open(path, "rb") as f:
        data = f.read(MAX_TOKEN_BYTES + 1)
    if len(data) > MAX_TOKEN_BYTES:
        raise ValueError(f"token file larger than {MAX_TOKEN_BYTES} bytes; is it the token?")
    return data.strip()


def _readable(path: str, what: str) -> Path:
    p = Path(path)
    try:
        with p.open("rb") as f:
            f.read(1)
    except FileNotFoundError:
        raise ValueError(f"{what} not found; mount it or fix the path") from None
    except OSError as e:
        raise ValueError(f"cannot read {what}: {e.strerror}") from None
    return p


def _certificates(path: str, what: str, kind: str) -> None:
    """``ValueError`` unless ``path`` is readable and holds PEM certificates (``what``
    names the file, ``kind`` what it should hold)."""
    _readable(path, what)
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError as e:
        raise ValueError(f"not a {kind} ({e.reason or e})") from None


class TlsSettings(BaseModel):
    """Server TLS of one listener (the Collector's ``configtls.ServerConfig`` keys).

    Empty ``cert_file`` = plaintext. ``client_ca_file`` turns on mutual TLS: clients must
    present a certificate signed by that CA (on the HTTP API only for the routes that are
    not public, see ``http.metrics_public``).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    #: PEM server certificate (chain), e.g. a Secret's ``tls.crt``.
    cert_file: str = Field(default="", validate_default=True)
    #: PEM private key of ``cert_file`` (unencrypted), e.g. ``tls.key``.
    key_file: str = Field(default="", validate_default=True)
    #: PEM CA bundle that client certificates must chain to; "" = no client certificates.
    client_ca_file: str = Field(default="", validate_default=True)

    @property
    def enabled(self) -> bool:
        """Whether this listener speaks TLS."""
        return bool(self.cert_file)

    @field_validator("cert_file")
    @classmethod
    def _cert(cls, v: str) -> str:
        if v:
            _certificates(v, "certificate file", "PEM certificate")
        return v

    @field_validator("key_file")
    @classmethod
    def _key(cls, v: str, info: ValidationInfo) -> str:
        cert = info.data.get("cert_file")
        if cert is None:  # cert_file itself was invalid; that error is reported
            return v
        if bool(v) != bool(cert):
            raise ValueError("cert_file and key_file go together; set both or neither")
        if v:
            _readable(v, "key file")
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                # password="": an encrypted key fails here instead of prompting on a TTY
                ctx.load_cert_chain(cert, v, password="")
            except ssl.SSLError as e:
                reason = e.reason or str(e)
                raise ValueError(
                    f"does not match cert_file {cert!r} or is not an unencrypted PEM key "
                    f"({reason}); use the key the certificate was issued for"
                ) from None
        return v

    @field_validator("client_ca_file")
    @classmethod
    def _client_ca(cls, v: str, info: ValidationInfo) -> str:
        if v:
            if not info.data.get("cert_file"):
                raise ValueError("client certificates need server TLS; set cert_file too")
            _certificates(v, "client CA file", "PEM CA bundle")
        return v


class AuthSettings(BaseModel):
    """Bearer-token authentication of one listener (the Collector's ``bearertokenauth``).

    Clients send ``Authorization: Bearer <token>`` (gRPC: ``authorization`` metadata; the
    OTel SDK's ``OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer <token>"``). The token
    is compared in constant time.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    #: File holding the token (surrounding whitespace ignored), e.g. a mounted Secret's
    #: key. "" = no token needed.
    bearer_token_file: str = ""

    @property
    def enabled(self) -> bool:
        """Whether a token is required."""
        return bool(self.bearer_token_file)

    @field_validator("bearer_token_file")
    @classmethod
    def _token(cls, v: str) -> str:
        if v:
            _readable(v, "token file")
            if not read_token(v):
                raise ValueError("token file is empty; put the token in it")
        return v


def bearer(header: str | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip().encode()


class TokenFile:
    """The expected token, re-read when its file changes (Secret rotation).

    A file that disappears or empties keeps the last good token (a Secret update swaps a
    symlink; a transient read error must not lock every client out).
    """

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp: tuple[float, int] | None = None
        self._token = b""
        self._next_check = 0.0
        self._reload()

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime, st.st_size)
            if stamp == self._stamp:
                return
            token = read_token(self.path)
        except (OSError, ValueError) as e:
            log.warning(
                "token file unreadable; keeping the last token", path=self.path, error=str(e)
            )
            return
        if token:
            self._token, self._stamp = token, stamp

    def matches(self, presented: bytes | None) -> bool:
        """Whether ``presented`` is the token (constant time in the token's content)."""
        now = self._clock()
        if now >= self._next_check:
            with self._lock:
                if now >= self._next_check:
                    self._next_check = now + TOKEN_RECHECK_SECONDS
                    self._reload()
        return presented is not None and hmac.compare_digest(presented, self._token)


class AuthMetrics:
    """``coeffd_auth_rejected_total{listener, reason}``: requests refused before handling."""

    def __init__(self, registry: CollectorRegistry, rate_limit_seconds: float = 10.0) -> None:
        self.rejected = Counter(
            "coeffd_auth_rejected",
            "Requests or connections refused by authentication, by listener and reason "
            "(missing_token, invalid_token, client_certificate, tls_handshake)",
            ["listener", "reason"],
            registry=registry,
        )
        self._limiter = RateLimiter(rate_limit_seconds)

    def reject(self, listener: str, reason: str, client: str) -> None:
        """Count one refusal and log it (rate-limited per listener and reason)."""
        self.rejected.labels(listener, reason).inc()
        ok, suppressed = self._limiter.allow(f"{listener}:{reason}")
        if ok:
            log.warning(
                "request refused",
                listener=listener,
                reason=reason,
                client=client,
                suppressed=suppressed,
            )


class Gate:
    """Who may use one HTTP listener: the token and, with mTLS, a verified client
    certificate, except on ``public_paths`` (probes; see ``http.metrics_public``)."""

    def __init__(
        self,
        listener: str,
        auth: AuthSettings,
        metrics: AuthMetrics,
        *,
        require_client_cert: bool = False,
        public_paths: Collection[str] = (),
    ) -> None:
        self.listener = listener
        self.token = TokenFile(auth.bearer_token_file) if auth.enabled else None
        self.require_client_cert = require_client_cert
        self.public_paths = frozenset(public_paths)
        self.metrics = metrics

    @classmethod
    def build(
        cls,
        listener: str,
        auth: AuthSettings,
        tls: TlsSettings,
        metrics: AuthMetrics,
        public_paths: Collection[str] = (),
    ) -> Gate | None:
        """A gate if the listener has a token or TLS (whose failed handshakes it counts);
        client certificates are checked per route when public paths exist. None =
        everyone passes."""
        per_route_cert = bool(tls.client_ca_file) and bool(public_paths)
        if not auth.enabled and not tls.enabled:
            return None
        return cls(
            listener, auth, metrics, require_client_cert=per_route_cert, public_paths=public_paths
        )

    def handshake_failed(self, error: Exception, client: str) -> None:
        """Count a failed TLS handshake (a client without a valid certificate under
        mTLS, plaintext sent to a TLS port, a timeout)."""
        reason = getattr(error, "reason", None) or ""
        self.metrics.reject(
            self.listener,
            "client_certificate" if "CERTIFICATE" in reason else "tls_handshake",
            client,
        )

    def check(
        self, path: str, authorization: str | None, has_cert: bool, client: str
    ) -> str | None:
        """None if the request may pass, else the refusal reason (already counted)."""
        if path in self.public_paths:
            return None
        reason = None
        if self.require_client_cert and not has_cert:
            reason = "client_certificate"
        elif self.token is not None:
            presented = bearer(authorization)
            if presented is None:
                reason = "missing_token"
            elif not self.token.matches(presented):
                reason = "invalid_token"
        if reason is not None:
            self.metrics.reject(self.listener, reason, client)
        return reason


def server_ssl_context(
    tls: TlsSettings, *, client_cert_optional: bool = False
) -> ssl.SSLContext | None:
    """The server context of an HTTP listener, or None without TLS.

    With ``client_ca_file``, client certificates are required at the handshake, or — with
    ``client_cert_optional`` (the API port, whose probes cannot present one) — verified
    when presented and required per route by :class:`Gate`.
    """
    if not tls.enabled:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file, password="")
    ctx.set_alpn_protocols(["http/1.1"])
    if tls.client_ca_file:
        ctx.load_verify_locations(cafile=tls.client_ca_file)
        ctx.verify_mode = ssl.CERT_OPTIONAL if client_cert_optional else ssl.CERT_REQUIRED
    return ctx


def grpc_server_credentials(tls: TlsSettings) -> grpc.ServerCredentials | None:
    """gRPC server credentials (client certificates required with ``client_ca_file``)."""
    if not tls.enabled:
        return None
    ca = Path(tls.client_ca_file).read_bytes() if tls.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(Path(tls.key_file).read_bytes(), Path(tls.cert_file).read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )


class _TokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, listener: str, token: TokenFile, metrics: AuthMetrics) -> None:
        self._listener = listener
        self._token = token
        self._metrics = metrics

        def deny(request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        header = None
        for key, value in handler_call_details.invocation_metadata or ():  # type: ignore[attr-defined]
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
                break
        presented = bearer(header)
        if presented is not None and self._token.matches(presented):
            return continuation(handler_call_details)
        reason = "missing_token" if presented is None else "invalid_token"
        self._metrics.reject(self._listener, reason, "")
        return self._deny


def grpc_token_interceptor(
    listener: str, auth: AuthSettings, metrics: AuthMetrics
) -> list[grpc.ServerInterceptor]:
    """The interceptors of a gRPC server: one that answers ``UNAUTHENTICATED`` without the
    token, or none."""
    if not auth.enabled:
        return []
    return [_TokenInterceptor(listener, TokenFile(auth.bearer_token_file), metrics)]


def http_guard(
    listener: str,
    tls: TlsSettings,
    auth: AuthSettings,
    metrics: AuthMetrics,
    public_paths: Collection[str] = (),
) -> tuple[ssl.SSLContext | None, Gate | None]:
    """``(ssl_context, gate)`` for an :class:`~coeffd.base.http.HttpServer`."""
    ctx = server_ssl_context(tls, client_cert_optional=bool(public_paths))
    return ctx, Gate.build(listener, auth, tls, metrics, public_paths)
