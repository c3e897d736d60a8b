"""HTTP API through a real ThreadingHTTPServer: 200/404/400, formats parse back exactly."""

from __future__ import annotations

import urllib.error
import urllib.request

import orjson
import pytest
import yaml as pyyaml
from publish_support import make_snapshot

from coeffd.daemon import api
from coeffd.daemon.publish.snapshot import decode_snapshot
from coeffd.daemon.publish.store import SnapshotStore


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture
def populated(store: SnapshotStore) -> SnapshotStore:
    for v in (1, 2, 3, 4):
        store.publish(make_snapshot("llama8b-h100-tp1", v, beta=(0.1 * v,) + (1.0,) * 10))
    store.publish(make_snapshot("mixtral-h100-tp2", 1))
    return store


def test_configurations(populated: SnapshotStore, server_url: str) -> None:
    status, headers, body = _get(f"{server_url}/v1/configurations")
    assert status == 200 and headers["Content-Type"] == "application/json"
    configs = orjson.loads(body)["configurations"]
    assert [(c["id"], c["latest_version"]) for c in configs] == [
        ("llama8b-h100-tp1", 4),
        ("mixtral-h100-tp2", 1),
    ]
    assert configs[0]["labels"]["gpu"] == "H100"


def test_coefficients_latest_and_version(populated: SnapshotStore, server_url: str) -> None:
    status, _, body = _get(f"{server_url}/v1/coefficients/llama8b-h100-tp1")
    assert status == 200
    snap = decode_snapshot(body)
    assert snap == populated.latest("llama8b-h100-tp1")
    status, headers, body = _get(f"{server_url}/v1/coefficients/llama8b-h100-tp1?version=3")
    assert status == 200 and headers["X-Coeffd-Version"] == "3"
    assert decode_snapshot(body).beta[0] == pytest.approx(0.3)


def test_flags_and_yaml_parse_back(populated: SnapshotStore, server_url: str) -> None:
    snap = populated.latest("llama8b-h100-tp1")
    assert snap is not None
    status, headers, body = _get(f"{server_url}/v1/coefficients/llama8b-h100-tp1?format=flags")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    args = body.decode().split()
    assert tuple(float(x) for x in args[1].split(",")) == snap.alpha
    assert tuple(float(x) for x in args[3].split(",")) == snap.beta
    status, headers, body = _get(f"{server_url}/v1/coefficients/llama8b-h100-tp1?format=yaml")
    assert status == 200 and headers["Content-Type"] == "application/yaml"
    block = pyyaml.safe_load(body)["trained_physics_coefficients"]
    assert tuple(block["alpha_coeffs"]) == snap.alpha
    assert tuple(block["beta_coeffs"]) == snap.beta


def test_history(populated: SnapshotStore, server_url: str) -> None:
    status, _, body = _get(f"{server_url}/v1/coefficients/llama8b-h100-tp1/history")
    assert status == 200
    versions = [v["version"] for v in orjson.loads(body)["versions"]]
    assert versions == [2, 3, 4]  # retention 3


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v1/coefficients/nope", 404),
        ("/v1/coefficients/nope/history", 404),
        ("/v1/coefficients/..%2F..%2Fetc", 404),
        ("/v1/coefficients/llama8b-h100-tp1?version=1", 404),  # pruned
        ("/v1/coefficients/llama8b-h100-tp1/other", 404),
        ("/v1/coefficients/llama8b-h100-tp1?format=xml", 400),
        ("/v1/coefficients/llama8b-h100-tp1?version=abc", 400),
        ("/v1/coefficients/llama8b-h100-tp1?version=0", 400),
    ],
)
def test_errors_are_json(populated: SnapshotStore, server_url: str, path: str, status: int) -> None:
    got, headers, body = _get(server_url + path)
    assert got == status
    assert headers["Content-Type"] == "application/json"
    assert orjson.loads(body)["error"]["status"] == status


def test_handle_unit(populated: SnapshotStore) -> None:
    assert api.handle(populated, "GET", "/metrics") is None
    resp = api.handle(populated, "POST", "/v1/configurations")
    assert resp is not None and resp.status == 405
    resp = api.handle(populated, "GET", "/v1/configurations/")
    assert resp is not None and resp.status == 200
