"""Fuzzing the HTTP API (issue 17, "Done when": every entry point): random methods, paths
and query strings on the API port of a real App that has published snapshots. For each
request: an answer the API documents (never a 500), a body that is JSON when it says so,
and no dead thread; the server still answers ``/healthz`` afterwards.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from daemon_support import fleet_requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coeffd.daemon.app import App
from coeffd.daemon.assemble import build_app
from coeffd.daemon.settings import load_settings
from coeffd.receivers.otlp.decode import Decoder

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)
DOCUMENTED = {200, 304, 400, 401, 403, 404, 405, 413, 414, 431, 503}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    tmp: Path = tmp_path_factory.mktemp("api")
    s = load_settings(
        overrides={
            "http": {"endpoint": "127.0.0.1:0"},
            "receivers": {"otlp_grpc": {"enabled": False}, "otlp_http": {"enabled": False}},
            "publish": {"snapshot_dir": str(tmp / "snap"), "min_observations": 1},
            "state": {"state_dir": str(tmp / "state")},
            "joiner": {"window_s": 2.0},
        },
        environ={},
    )
    with build_app(s) as a:
        dec = Decoder()
        for r in fleet_requests("steady", 8):
            assert a.offer(dec.decode_bytes(r.SerializeToString()).records, "test")
        assert a.pipeline.wait_idle(60)
        deadline = time.time() + 30
        while time.time() < deadline and not list((tmp / "snap").rglob("latest.json")):
            time.sleep(0.2)
        yield a


SEGMENT = st.one_of(
    st.sampled_from(["v1", "coefficients", "configurations", "predict", "latest", "fleet", ".."]),
    st.text(min_size=0, max_size=40),
    st.from_regex(r"[0-9a-f]{12}", fullmatch=True),
)
QUERY_KEY = st.one_of(
    st.sampled_from(["version", "format", "model", "gpu", "tp", "dp", "ep", "coeffd.model"]),
    st.text(max_size=20),
)
QUERY_VALUE = st.one_of(
    st.sampled_from(["1", "0", "-1", "1_0", "٣", "9" * 300, "H100", "../etc/passwd", "json"]),
    st.text(max_size=60),
)


@FUZZ
@given(
    method=st.sampled_from(["GET", "GET", "GET", "HEAD", "POST", "PUT", "DELETE"]),
    prefix=st.sampled_from(["/v1/coefficients/", "/v1/predict", "/v1/configurations", "/"]),
    segments=st.lists(SEGMENT, max_size=4),
    query=st.lists(st.tuples(QUERY_KEY, QUERY_VALUE), max_size=4),
)
def test_fuzz_http_api(
    app: App, method: str, prefix: str, segments: list[str], query: list[tuple[str, str]]
) -> None:
    path = prefix + "/".join(quote(s, safe="") for s in segments)
    if query:
        path += "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query)
    conn = http.client.HTTPConnection("127.0.0.1", app.http_port or 0, timeout=30)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        body = r.read()
    finally:
        conn.close()
    assert r.status in DOCUMENTED, (method, path, r.status, body[:200])
    if body and (r.getheader("Content-Type") or "").startswith("application/json"):
        json.loads(body)
    assert app.supervisor.dead() == []


def test_api_still_answers_after_the_fuzz(app: App) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", app.http_port or 0, timeout=30)
    try:
        conn.request("GET", "/healthz")
        ok = conn.getresponse()
        ok.read()
        assert ok.status == 200
        conn.request("GET", "/v1/configurations")
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["configurations"]
    finally:
        conn.close()
