"""The query tier's view over real HTTP peers: exact merge, bad peers skipped and counted,
stale peers kept until the TTL and across a restart of the query tier.

Peers are the daemon's own HTTP server with the API mounted, serving the statistics
document that ``export_statistics`` builds from real learner registries.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from coeffd.base.http import HttpServer
from coeffd.daemon import api
from coeffd.daemon.learning.checkpoints import CheckpointStore
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.daemon.query.config import QuerySettings
from coeffd.daemon.query.statistics import export_statistics, parse_statistics
from coeffd.daemon.query.view import FleetView
from coeffd.learners.config import LearnersConfig
from coeffd.learners.merge import merge_set_states
from coeffd.learners.registry import LearnerRegistry
from tests.learners.test_registry import _cfg, _steps

SETTINGS = LearnersConfig(forgetting=1.0, steady_forgetting=1.0)  # type: ignore[call-arg]
SHARED, OTHER = _cfg(), _cfg(model="qwen2.5-7b-instruct")


class Peer:
    """A real HTTP server answering /v1/statistics with a given body."""

    def __init__(self, body: bytes, tmp: Path) -> None:
        self.body = body
        self.server = HttpServer("127.0.0.1", 0, name="peer")
        api.mount(self.server.router, SnapshotStore(tmp), statistics=lambda: self.body)
        self.server.start()
        self.url = f"http://127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        self.server.stop()


def _learned(config: Any, seed: int, n: int = 250) -> LearnerRegistry:
    reg = LearnerRegistry(SETTINGS)
    for o in _steps(reg, config, n, seed=seed):
        reg.learn(config, o)
    return reg


@pytest.fixture(scope="module")
def registries() -> dict[str, LearnerRegistry]:
    return {"a": _learned(SHARED, 1), "b": _learned(SHARED, 2), "c": _learned(OTHER, 3)}


@pytest.fixture
def peers(registries: dict[str, LearnerRegistry], tmp_path: Path) -> Iterator[dict[str, Peer]]:
    out = {
        k: Peer(export_statistics(reg, {"name": k}), tmp_path / f"peer-{k}")
        for k, reg in registries.items()
    }
    yield out
    for p in out.values():
        p.stop()


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def _view(tmp: Path, urls: list[str], clock: Clock, metrics: CollectorRegistry) -> FleetView:
    settings = QuerySettings(
        peers=",".join(urls), refresh_interval_seconds=10, peer_ttl_seconds=600
    )
    return FleetView(
        settings,
        SETTINGS,
        SnapshotStore(tmp / "snapshots"),
        state=CheckpointStore(tmp / "state"),
        metrics=metrics,
        clock=clock,
    )


def _get(url: str) -> tuple[dict[str, Any], dict[str, str]]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read()), dict(r.headers)


def test_members_of_a_configuration_merge_exactly(
    peers: dict[str, Peer], registries: dict[str, LearnerRegistry], tmp_path: Path
) -> None:
    clock, metrics = Clock(), CollectorRegistry()
    view = _view(tmp_path, [p.url for p in peers.values()], clock, metrics)
    view.refresh()
    assert sorted(view.store.configurations()) == sorted([SHARED.id, OTHER.id, "fleet"])
    # the answer is the estimate of one set holding both members' summed statistics
    reference = LearnerRegistry(SETTINGS)
    states = [registries[k].get(SHARED.id).state_dict() for k in ("a", "b")]  # type: ignore[union-attr]
    reference.load_state({"sets": {SHARED.id: merge_set_states(states)}})
    expected = reference.estimate(SHARED.id)
    snap = view.store.latest(SHARED.id)
    assert snap is not None
    np.testing.assert_allclose(snap.beta, expected.beta, rtol=1e-9)
    np.testing.assert_allclose(snap.alpha, expected.alpha, rtol=1e-9)
    assert snap.observations["beta"] == sum(s["observations"] for s in states)
    # every answer names its instances, through the real API
    server = HttpServer("127.0.0.1", 0, name="query")
    api.mount(server.router, view.store, view, annotate=view.instances)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        body, headers = _get(f"{base}/v1/coefficients/{SHARED.id}")
        assert body["instance_count"] == 2 and headers["X-Coeffd-Instances"] == "2"
        assert {i["peer"] for i in body["instances"]} == {peers["a"].url, peers["b"].url}
        assert not any(i["stale"] for i in body["instances"])
        listing, _ = _get(f"{base}/v1/configurations")
        counts = {c["id"]: c["instance_count"] for c in listing["configurations"]}
        assert counts == {SHARED.id: 2, OTHER.id: 1, "fleet": 3}
        unseen, _ = _get(f"{base}/v1/predict?model=llama-3.1-70b-instruct&gpu=H100&tp=4")
        assert unseen["source"] != "configuration" and unseen["instance_count"] == 3
    finally:
        server.stop()
    assert metrics.get_sample_value("coeffd_query_peers", {"state": "up"}) == 3


def test_bad_peers_are_skipped_counted_and_never_fail_the_answer(
    peers: dict[str, Peer], tmp_path: Path
) -> None:
    garbage = Peer(b"\x00not json", tmp_path / "garbage")
    doc = orjson.loads(peers["c"].body)
    future = Peer(orjson.dumps(doc | {"version": 99}), tmp_path / "future")
    try:
        metrics = CollectorRegistry()
        view = _view(tmp_path, [peers["c"].url, garbage.url, future.url], Clock(), metrics)
        view.refresh()
        assert view.store.configurations() == [OTHER.id]
        assert (
            metrics.get_sample_value("coeffd_query_peer_errors_total", {"reason": "invalid"}) == 1
        )
        assert (
            metrics.get_sample_value("coeffd_query_peer_errors_total", {"reason": "version"}) == 1
        )
    finally:
        garbage.stop()
        future.stop()


def test_a_lost_peer_stays_stale_until_the_ttl_also_across_a_restart(
    peers: dict[str, Peer], tmp_path: Path
) -> None:
    clock = Clock()
    urls = [peers["a"].url, peers["b"].url]
    view = _view(tmp_path, urls, clock, CollectorRegistry())
    view.refresh()
    peers["b"].stop()
    clock.t += 60
    view.refresh()
    stale = {i["peer"]: i["stale"] for i in view.instances(SHARED.id) or []}
    assert stale == {peers["a"].url: False, peers["b"].url: True}
    # the query tier restarts: the lost peer's statistics come back from its state dir
    clock.t += 60
    again = _view(tmp_path, urls, clock, CollectorRegistry())
    assert again.restore() == 2
    again.refresh()
    assert len(again.instances(SHARED.id) or []) == 2
    snap = again.store.latest(SHARED.id)
    assert snap is not None and snap.observations["beta"] > 0
    # past the TTL it leaves the view: the answer is the live member's alone
    clock.t += 601
    again.refresh()
    assert [i["peer"] for i in again.instances(SHARED.id) or []] == [peers["a"].url]


def test_a_bad_configuration_costs_that_configuration_not_the_peer(
    registries: dict[str, LearnerRegistry],
) -> None:
    """Non-finite rows, a path for an id, an id that is not its configuration's: each
    skipped with its reason; the peer's good configuration is read."""
    doc = orjson.loads(export_statistics(registries["c"], {"name": "c"}))
    good = doc["configurations"][OTHER.id]
    nan_rows = orjson.loads(orjson.dumps(good))
    nan_rows["rows"]["y"][0] = None  # null: not a number
    doc["configurations"] |= {
        "../../etc": good,
        SHARED.id: good,  # describes OTHER: the id does not match
    }
    stats = parse_statistics(orjson.dumps(doc), LearnerRegistry(SETTINGS))
    assert list(stats.configurations) == [OTHER.id]
    assert "InvalidConfigurationIdError" in stats.skipped["../../etc"]
    assert "does not match" in stats.skipped[SHARED.id]
    doc["configurations"] = {OTHER.id: nan_rows}
    stats = parse_statistics(orjson.dumps(doc), LearnerRegistry(SETTINGS))
    assert not stats.configurations and "rows" in stats.skipped[OTHER.id]
