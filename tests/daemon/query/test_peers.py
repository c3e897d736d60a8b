"""Peer lists, their DNS re-resolution, and the bounded peer client against real servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from coeffd.base.http import HttpServer, Request, Response
from coeffd.daemon.query.config import QuerySettings
from coeffd.daemon.query.peers import (
    PeerClient,
    PeerClientSettings,
    PeerError,
    parse_peers,
    resolve_peers,
)
from coeffd.daemon.settings import SettingsError, load_settings


@pytest.mark.parametrize(
    "bad", ["10.0.0.5:9464", "dns+svc", "dns+svc:0", "http://h:1/v1", "http://h:99999"]
)
def test_a_bad_peer_entry_fails_start_up_naming_the_key(bad: str) -> None:
    with pytest.raises(SettingsError, match=r"query\.peers"):
        load_settings(overrides={"mode": "query", "query": {"peers": bad}})


def test_dns_entries_resolve_to_every_address_and_a_failure_only_costs_that_name() -> None:
    answers = {"svc": ["10.1.0.2", "10.1.0.1", "fd00::3"]}

    def resolver(host: str, port: int) -> list[str]:
        if host not in answers:
            raise OSError("Name or service not known")
        return answers[host]

    urls, errors = resolve_peers(parse_peers("dns+svc:9464,dns+gone:9464,https://x:1"), resolver)
    assert urls == [
        "http://10.1.0.1:9464",
        "http://10.1.0.2:9464",
        "http://[fd00::3]:9464",
        "https://x:1",
    ]
    assert errors == ["dns+gone:9464: Name or service not known"]
    tls = parse_peers("dns+svc:9464", dns_scheme="https")
    assert resolve_peers(tls, resolver)[0][0] == "https://10.1.0.1:9464"
    assert QuerySettings(peers="dns+svc:9464").peer_ttl_seconds == 3600.0  # the 1 h default


@pytest.fixture
def server() -> tuple[HttpServer, list[Request]]:
    seen: list[Request] = []
    srv = HttpServer("127.0.0.1", 0, name="peer")

    def small(req: Request) -> Response:
        seen.append(req)
        return Response(200, b"{}", "application/json")

    srv.router.add_route("GET", "/small", small)
    srv.router.add_route("GET", "/big", lambda req: Response(200, b"x" * 5000))
    srv.router.add_route("GET", "/missing", lambda req: Response(404, b"no"))
    srv.start()
    yield srv, seen
    srv.stop()


def test_client_sends_the_token_bounds_the_body_and_names_each_failure(
    server: tuple[HttpServer, list[Request]], tmp_path: Path
) -> None:
    srv, seen = server
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    client = PeerClient(PeerClientSettings(bearer_token_file=str(token), max_bytes=1024))
    base = f"http://127.0.0.1:{srv.port}"
    assert client.get(base, "/small") == b"{}"
    assert seen[-1].headers.get("authorization") == "Bearer s3cret"
    for path, reason in (("/big", "too_large"), ("/missing", "http_error")):
        with pytest.raises(PeerError) as info:
            client.get(base, path)
        assert info.value.reason == reason
    srv.stop()
    with pytest.raises(PeerError) as info:
        client.get(base, "/small")
    assert info.value.reason == "unreachable"
