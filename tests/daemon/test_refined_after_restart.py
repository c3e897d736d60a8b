"""After a restart the publisher reads what the published numbers were fitted on from
the snapshot that carried them, not from a heartbeat after it (whose observation count
is larger): otherwise the first ``refined`` version comes later than it should.

A real learning consumer learns simfleet's telemetry, publishes (``first``, ``refined``)
and then a heartbeat; it checkpoints and dies. A second one restores the checkpoint and
the snapshots on disk, learns on, and must publish refined numbers once it has learned
twice what the published ones were fitted on.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
from daemon_support import fleet_requests
from prometheus_client import CollectorRegistry

from coeffd.daemon.assemble import build_consumer
from coeffd.daemon.learning import LearningConsumer
from coeffd.daemon.publish.snapshot import decode_snapshot
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.daemon.settings import load_settings
from coeffd.receivers.otlp.decode import Decoder

pytestmark = pytest.mark.slow  # run first: see tests/conftest.py

INTERVAL_S = 60.0


def _consumer(tmp: Path, restore: bool) -> tuple[LearningConsumer, SnapshotStore]:
    s = load_settings(
        overrides={
            # β is published when new (first), refined, or as the interval's heartbeat only
            "publish": {
                "snapshot_dir": str(tmp / "snap"),
                "interval_seconds": INTERVAL_S,
                "step_time_threshold": 10.0,
                "relative_threshold": 10.0,
                # the first version already fitted on steps (not the prior's numbers alone)
                "min_observations": 400,
            },
            "state": {"state_dir": str(tmp / "state"), "restore": restore},
        },
        environ={},
    )
    return build_consumer(s, CollectorRegistry(), live=False)


def _feed(c: LearningConsumer, requests: list[bytes], now: float) -> None:
    decoder = Decoder()
    for req in requests:
        c.consume(decoder.decode_bytes(req).records)
        c.tick(now)


def _strip_fitted_on(store: SnapshotStore, cid: str) -> None:
    """The files as a build before ``fitted_on`` was recorded wrote them."""
    for path in (store.directory / cid).glob("*.json"):
        raw = msgspec.json.decode(path.read_bytes())
        raw.pop("fitted_on", None)
        path.write_bytes(msgspec.json.encode(raw))
        assert decode_snapshot(path.read_bytes()).fitted_on is None


@pytest.fixture(scope="module")
def requests() -> list[bytes]:
    """80 s of simfleet's ``steady`` engine (every step sampled): ~2.5 s each, 32
    requests, the tests read 30 (the same bytes as the first 30 of a longer run)."""
    return [r.SerializeToString() for r in fleet_requests("steady", 80)]


@pytest.mark.parametrize("files", ["recorded", "older_build"])
def test_first_refined_version_after_a_restart(
    tmp_path: Path, requests: list[bytes], files: str
) -> None:
    t0 = time.time()
    a, store = _consumer(tmp_path, restore=False)
    _feed(a, requests[:14], t0)  # first
    _feed(a, requests[14:16], t0 + 3600)  # an hour on: the interval's heartbeats
    a.checkpoint()
    a.writer.close()  # the process dies here: no closing publish
    (cid,) = store.configurations()
    history = store.history(cid)
    heartbeat = history[-1]
    carriers = [s for s in history if (s.alpha, s.beta) == (heartbeat.alpha, heartbeat.beta)]
    fitted = carriers[0].observations["beta"]  # the version that published these numbers
    assert len(carriers) >= 2 and heartbeat.fitted_on == fitted
    assert 2 * fitted < 2 * heartbeat.observations["beta"]
    if files == "older_build":
        _strip_fitted_on(store, cid)

    b, store = _consumer(tmp_path, restore=True)
    assert b.restored
    # after the restart the first steps are not learned (their batches hold requests
    # whose journeys began before it); then new numbers are due once the β learner has
    # learned twice what the published ones were fitted on
    _feed(b, requests[16:30], t0 + 3601)
    b.writer.close()
    later = [s for s in store.history(cid) if s.version > heartbeat.version]
    refined = next((s for s in later if s.beta != heartbeat.beta), None)
    assert refined is not None, "no new numbers after the restart"
    learned = refined.observations["beta"]
    # twice what the numbers were fitted on, not twice the heartbeat's count
    assert 2 * fitted <= learned < 2 * heartbeat.observations["beta"]
    assert refined.fitted_on == learned
    # heartbeats after it carry what its numbers were fitted on
    assert all(s.fitted_on == learned for s in later if s.beta == refined.beta)
