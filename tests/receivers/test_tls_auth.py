"""TLS, mutual TLS and bearer tokens on the OTLP receivers and the HTTP API, over real
sockets with certificates generated here; the accepted paths go through the real OTel SDK
exporters, the refused ones through raw clients so the status can be asserted."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import make_settings
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from otlp_builders import core_span, journey, request
from prometheus_client.parser import text_string_to_metric_families
from tls_certs import Certs, make_certs
from vllm_spans import emit_engine

from coeffd.base.http import Response
from coeffd.daemon import cli
from coeffd.daemon.app import App
from coeffd.daemon.pipeline import CountingConsumer
from coeffd.daemon.settings import Settings

TOKEN = "s3cr3t-token-from-a-secret"
GOOD = request(("vllm.scheduler", [core_span(journey())]))
GOOD_RECORDS = 2  # the llm_core span and its QUEUED event


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("token") / "token"
    p.write_text(TOKEN + "\n")  # as `kubectl create secret --from-file` keeps a newline
    return p


def _tls(certs: Certs, mtls: bool = False) -> dict[str, str]:
    out = {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)}
    if mtls:
        out["client_ca_file"] = str(certs.ca)
    return out


def _start(settings: Settings) -> App:
    app = App(settings, consumer=CountingConsumer.keeping())
    app.router.add_route("GET", "/v1/ping", lambda req: Response.text(200, "pong"))
    return app.start()


@pytest.fixture
def secured(certs: Certs, token_file: Path) -> Iterator[App]:
    """Both receivers: TLS + token; the gRPC one also mTLS. API: TLS + token + mTLS."""
    s = make_settings()
    s.receivers.otlp_grpc.tls = s.receivers.otlp_grpc.tls.model_validate(_tls(certs, mtls=True))
    s.receivers.otlp_grpc.auth = s.receivers.otlp_grpc.auth.model_validate(
        {"bearer_token_file": str(token_file)}
    )
    s.receivers.otlp_http.tls = s.receivers.otlp_http.tls.model_validate(_tls(certs))
    s.receivers.otlp_http.auth = s.receivers.otlp_http.auth.model_validate(
        {"bearer_token_file": str(token_file)}
    )
    s.http.tls = s.http.tls.model_validate(_tls(certs, mtls=True))
    s.http.auth = s.http.auth.model_validate({"bearer_token_file": str(token_file)})
    app = _start(s)
    yield app
    app.stop()


def _client_ctx(certs: Certs, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def _get(
    url: str, ctx: ssl.SSLContext, token: str | None = None, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if body is not None:
        headers["Content-Type"] = "application/x-protobuf"
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _rejected(app: App, certs: Certs) -> dict[tuple[str, str], float]:
    """coeffd_auth_rejected_total by (listener, reason), from a real HTTPS scrape."""
    ctx = _client_ctx(certs, certs.client_cert, certs.client_key)
    status, _, text = _get(f"https://127.0.0.1:{app.http_port}/metrics", ctx)
    assert status == 200
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            if s.name == "coeffd_auth_rejected_total":
                out[(s.labels["listener"], s.labels["reason"])] = s.value
    return out


def _records(app: App) -> int:
    assert app.pipeline.wait_idle(10)
    consumer = app.consumer
    assert isinstance(consumer, CountingConsumer)
    return consumer.total


# ------------------------------------------------------------------------ OTLP/gRPC


def _grpc_creds(certs: Certs, cert: Path | None = None, key: Path | None = None) -> Any:
    return grpc.ssl_channel_credentials(
        root_certificates=certs.ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None,
    )


def test_grpc_sdk_exporter_over_mtls_with_token(secured: App, certs: Certs) -> None:
    exporter = GrpcExporter(
        endpoint=f"https://127.0.0.1:{secured.grpc_port}",
        credentials=_grpc_creds(certs, certs.client_cert, certs.client_key),
        headers={"authorization": f"Bearer {TOKEN}"},
    )
    provider = emit_engine(exporter, Resource.create({"service.name": "vllm"}))
    assert provider.force_flush(10_000)
    provider.shutdown()
    assert _records(secured) > 0
    assert _rejected(secured, certs).get(("otlp_grpc", "invalid_token"), 0) == 0


def _export(app: App, creds: Any, token: str | None) -> grpc.StatusCode:
    md = (("authorization", f"Bearer {token}"),) if token is not None else None
    with grpc.secure_channel(f"127.0.0.1:{app.grpc_port}", creds) as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        try:
            stub.Export(GOOD, metadata=md, timeout=10)
        except grpc.RpcError as e:
            return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_grpc_token_accept_and_reject(secured: App, certs: Certs) -> None:
    creds = _grpc_creds(certs, certs.client_cert, certs.client_key)
    assert _export(secured, creds, None) == grpc.StatusCode.UNAUTHENTICATED
    assert _export(secured, creds, "wrong") == grpc.StatusCode.UNAUTHENTICATED
    assert _export(secured, creds, TOKEN[:-1]) == grpc.StatusCode.UNAUTHENTICATED
    assert _records(secured) == 0
    assert _export(secured, creds, TOKEN) == grpc.StatusCode.OK
    assert _records(secured) == GOOD_RECORDS
    rejected = _rejected(secured, certs)
    assert rejected[("otlp_grpc", "missing_token")] == 1
    assert rejected[("otlp_grpc", "invalid_token")] == 2


@pytest.mark.parametrize("client", ["rogue", "none"])
def test_grpc_mtls_rejects_untrusted_or_missing_client_cert(
    secured: App, certs: Certs, client: str
) -> None:
    if client == "rogue":
        creds = _grpc_creds(certs, certs.rogue_cert, certs.rogue_key)
    else:
        creds = _grpc_creds(certs)
    # The handshake fails before any call: grpc reports the channel unavailable.
    assert _export(secured, creds, TOKEN) == grpc.StatusCode.UNAVAILABLE
    assert _records(secured) == 0


def test_grpc_plaintext_client_cannot_talk_to_tls_port(secured: App) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{secured.grpc_port}") as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.Export(GOOD, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=5)
    assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
    assert _records(secured) == 0


# ------------------------------------------------------------------------ OTLP/HTTP


def test_http_sdk_exporter_over_tls_with_token(
    secured: App, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    # requests lets these variables override the session's CA file (the exporter's
    # certificate_file); a machine-wide bundle would hide our test CA.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    exporter = HttpExporter(
        endpoint=f"https://127.0.0.1:{secured.otlp_http_port}/v1/traces",
        certificate_file=str(certs.ca),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    provider = emit_engine(exporter, Resource.create({"service.name": "vllm"}))
    assert provider.force_flush(10_000)
    provider.shutdown()
    assert _records(secured) > 0


def test_http_token_reject_is_401_with_challenge(secured: App, certs: Certs) -> None:
    url = f"https://127.0.0.1:{secured.otlp_http_port}/v1/traces"
    ctx = _client_ctx(certs)
    body = GOOD.SerializeToString()
    status, headers, _ = _get(url, ctx, None, body)
    assert (status, headers["WWW-Authenticate"]) == (401, 'Bearer realm="coeffd"')
    status, headers, _ = _get(url, ctx, "nope", body)
    assert status == 401 and 'error="invalid_token"' in headers["WWW-Authenticate"]
    assert _records(secured) == 0
    assert _get(url, ctx, TOKEN, body)[0] == 200
    assert _records(secured) == GOOD_RECORDS
    rejected = _rejected(secured, certs)
    assert rejected[("otlp_http", "missing_token")] == 1
    assert rejected[("otlp_http", "invalid_token")] == 1


def test_http_receiver_mtls_refuses_client_without_cert(certs: Certs) -> None:
    s = make_settings()
    s.receivers.otlp_http.tls = s.receivers.otlp_http.tls.model_validate(_tls(certs, mtls=True))
    app = _start(s)
    try:
        url = f"https://127.0.0.1:{app.otlp_http_port}/v1/traces"
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _get(url, _client_ctx(certs), None, GOOD.SerializeToString())
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _get(url, _client_ctx(certs, certs.rogue_cert, certs.rogue_key), None, b"")
        assert _records(app) == 0
        ok = _get(
            url,
            _client_ctx(certs, certs.client_cert, certs.client_key),
            None,
            GOOD.SerializeToString(),
        )
        assert ok[0] == 200 and _records(app) == GOOD_RECORDS
        # plaintext API here: scrape it directly
        with urllib.request.urlopen(f"http://127.0.0.1:{app.http_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        refused = sum(
            s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "coeffd_auth_rejected_total" and s.labels["listener"] == "otlp_http"
        )
        assert refused == 2
    finally:
        app.stop()


# ------------------------------------------------------------------------- HTTP API


def test_api_probes_and_metrics_public_routes_guarded(secured: App, certs: Certs) -> None:
    base = f"https://127.0.0.1:{secured.http_port}"
    anonymous = _client_ctx(certs)  # kubelet: no client certificate, no token
    for path in ("/healthz", "/readyz", "/metrics"):
        assert _get(base + path, anonymous)[0] == 200, path
    assert _get(base + "/v1/ping", anonymous, TOKEN)[0] == 403  # token but no client cert
    with_cert = _client_ctx(certs, certs.client_cert, certs.client_key)
    assert _get(base + "/v1/ping", with_cert)[0] == 401
    assert _get(base + "/v1/ping", with_cert, "bad")[0] == 401
    status, _, body = _get(base + "/v1/ping", with_cert, TOKEN)
    assert (status, body) == (200, b"pong\n")
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _get(base + "/healthz", _client_ctx(certs, certs.rogue_cert, certs.rogue_key))
    rejected = _rejected(secured, certs)
    assert rejected[("http", "client_certificate")] >= 2  # 403 + the rogue handshake
    assert rejected[("http", "missing_token")] == 1
    assert rejected[("http", "invalid_token")] == 1


def test_api_metrics_guarded_when_not_public(token_file: Path) -> None:
    s = make_settings()
    s.http.auth = s.http.auth.model_validate({"bearer_token_file": str(token_file)})
    s.http.metrics_public = False
    app = _start(s)
    try:
        base = f"http://127.0.0.1:{app.http_port}"
        plain = ssl.create_default_context()
        assert _get(base + "/healthz", plain)[0] == 200
        assert _get(base + "/metrics", plain)[0] == 401
        status, _, text = _get(base + "/metrics", plain, TOKEN)
        assert status == 200 and b"coeffd_auth_rejected_total" in text
    finally:
        app.stop()


def test_pull_sends_token_and_client_cert(
    secured: App,
    certs: Certs,
    token_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from coeffd.daemon import api
    from coeffd.daemon.publish.store import SnapshotStore

    # pull installs urllib's process-wide opener; put the old one back afterwards
    monkeypatch.setattr(urllib.request, "_opener", urllib.request._opener)  # type: ignore[attr-defined]

    api.mount(secured.router, SnapshotStore(tmp_path / "snapshots"))
    server = ["pull", "--server", f"https://127.0.0.1:{secured.http_port}"]
    tls = ["--cacert", str(certs.ca)]
    cert = ["--client-cert", str(certs.client_cert), "--client-key", str(certs.client_key)]
    assert cli.main([*server, *tls]) == 1
    assert "HTTP 403" in capsys.readouterr().err  # no client certificate
    assert cli.main([*server, *tls, *cert]) == 1
    assert "HTTP 401" in capsys.readouterr().err  # no token
    assert cli.main([*server, *tls, *cert, "--token-file", str(token_file)]) == 1
    # through: the API answered, and has nothing published yet
    assert "no configuration has published" in capsys.readouterr().err


def test_token_file_rotation_takes_effect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from coeffd.base import security

    monkeypatch.setattr(security, "TOKEN_RECHECK_SECONDS", 0.0)
    f = tmp_path / "token"
    f.write_text("old")
    tf = security.TokenFile(str(f))
    assert tf.matches(b"old") and not tf.matches(b"new")
    f.write_text("new-token")  # a different size: seen even within one mtime tick
    assert tf.matches(b"new-token") and not tf.matches(b"old")
    f.write_text("")  # a half-written Secret keeps the last good token
    assert tf.matches(b"new-token")


# ------------------------------------------------------------- invalid settings → exit 2


def _serve(capsys: pytest.CaptureFixture[str], tmp_path: Path, *sets: str) -> tuple[int, str]:
    argv = ["serve", "--state-dir", str(tmp_path / "st"), "--snapshot-dir", str(tmp_path / "sn")]
    for s in sets:
        argv += ["--set", s]
    code = cli.main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("sets", "key", "says"),
    [
        (
            (
                "receivers.otlp_grpc.tls.cert_file={missing}",
                "receivers.otlp_grpc.tls.key_file={key}",
            ),
            "receivers.otlp_grpc.tls.cert_file",
            "not found",
        ),
        (
            (
                "receivers.otlp_http.tls.cert_file={cert}",
                "receivers.otlp_http.tls.key_file={other}",
            ),
            "receivers.otlp_http.tls.key_file",
            "does not match cert_file",
        ),
        (("http.tls.cert_file={cert}",), "http.tls.key_file", "set both or neither"),
        (("http.tls.client_ca_file={ca}",), "http.tls.client_ca_file", "set cert_file too"),
        (("http.tls.cert_file={key}", "http.tls.key_file={key}"), "http.tls.cert_file", "PEM"),
        (("http.auth.bearer_token_file={missing}",), "http.auth.bearer_token_file", "not found"),
        (("receivers.otlp_grpc.auth.bearer_token_file={empty}",), "bearer_token_file", "empty"),
        (("http.auth.bearer_token_file={huge}",), "http.auth.bearer_token_file", "larger than"),
    ],
)
def test_invalid_tls_settings_exit_2_with_one_line(
    certs: Certs,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sets: tuple[str, ...],
    key: str,
    says: str,
) -> None:
    (tmp_path / "empty").write_text("  \n")
    (tmp_path / "huge").write_bytes(b"x" * (65 * 1024))
    paths = {
        "missing": tmp_path / "nope.pem",
        "key": certs.server_key,
        "cert": certs.server_cert,
        "other": certs.other_key,
        "ca": certs.ca,
        "empty": tmp_path / "empty",
        "huge": tmp_path / "huge",
    }
    code, err = _serve(capsys, tmp_path, *(s.format(**paths) for s in sets))
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert key in lines[0] and says in lines[0], lines[0]
    assert not (tmp_path / "st").exists()  # nothing started
