"""kill -9 while snapshots and checkpoints are being written as fast as the daemon can;
restart on the same directories: no torn file, state restored, learning continues."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from serve_support import Daemon, start_daemon, wait_quiet

from coeffd.daemon.learning.checkpoints import CheckpointStore
from coeffd.daemon.publish.snapshot import decode_snapshot, validate_for_blis
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.simfleet import SampleRates, run, run_in_thread

pytestmark = pytest.mark.slow

CADENCE_S = 0.2
TICK_S = 0.05
#: Snapshot retention: pruning runs from version RETENTION + 1 on.
RETENTION = 5
#: Versions written before the kill: pruning has run twice.
VERSIONS = RETENTION + 2
# Write on every tick: snapshots whenever anything moved, checkpoints every CADENCE_S.
HEAVY = (
    "--set", "publish.interval_seconds=0.01", "--set", "publish.relative_threshold=0.000001",
    "--set", "publish.min_observations=1", "--set", f"state.checkpoint_interval_seconds={CADENCE_S}",
    "--set", f"pipeline.tick_interval_seconds={TICK_S}", "--set", f"publish.retention={RETENTION}",
    "--set", "joiner.window_s=1",
)  # fmt: skip
RATES = SampleRates(1.0, 0.5, 0.05, 100)


def _feed(d: Daemon, seconds: float, seed: int) -> None:
    # 4x real time: the joiner finishes an idle source's last window (joiner.window_s=1)
    # on the receiver's clock, so wait_quiet sees every step learned before the scrape.
    run("steady", seconds, seed, rates=RATES, otlp_endpoint=f"127.0.0.1:{d.ports['otlp_grpc']}",
        max_events=100_000, speed=4.0, drain_s=1.0)  # fmt: skip


def _observations(store: SnapshotStore) -> dict[str, int]:
    out = {}
    for cid in store.configurations():
        snap = store.latest(cid)
        assert snap is not None
        out[cid] = snap.observations.get("beta", 0)
    return out


def test_kill_9_during_heavy_writes_then_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The feed, stopped at the kill, flushes into the dead daemon: its exporter retries
    # each batch until this deadline (the SDK's default, 10 s, was most of the test's end).
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "3")
    d = start_daemon(tmp_path, *HEAVY)
    thread, stop, _ = run_in_thread(
        "steady", 600, 5, rates=RATES, otlp_endpoint=f"127.0.0.1:{d.ports['otlp_grpc']}",
        max_events=100_000, speed=20.0,
    )  # fmt: skip
    store = SnapshotStore(tmp_path / "snapshots")
    ckpt = CheckpointStore(tmp_path / "state")
    try:
        _crash_and_restart(d, stop, store, ckpt, tmp_path)
    finally:
        # The feed, stopped at the kill, flushes into the dead daemon: its exporter retries
        # until it gives up (OTEL_EXPORTER_OTLP_TRACES_TIMEOUT). It does so while the
        # restarted daemon (on newly bound ports) learns, instead of before.
        stop.set()
        thread.join(30)


def _crash_and_restart(
    d: Daemon, stop: threading.Event, store: SnapshotStore, ckpt: CheckpointStore, tmp_path: Path
) -> None:
    try:
        deadline = time.monotonic() + 120
        # Heavy writing is under way: retention has pruned versions, two checkpoints exist.
        while not (
            store.configurations()
            and max(store.versions(store.configurations()[0]) or [0]) >= VERSIONS
            and ckpt.latest_path.exists()
            and ckpt.previous_path.exists()
        ):
            assert time.monotonic() < deadline, "daemon never wrote snapshots/checkpoints"
            assert d.proc.poll() is None
            time.sleep(0.1)
        time.sleep(0.37)  # somewhere inside the write cycle
        killed_at = time.time()
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
    finally:
        stop.set()
        if d.proc.poll() is None:
            d.proc.kill()

    # Nothing torn: every snapshot file parses and holds a vector BLIS accepts.
    files = list((tmp_path / "snapshots").glob("*/*.json"))
    assert files
    for f in files:
        snap = decode_snapshot(f.read_bytes())
        validate_for_blis(snap.alpha, snap.beta)
    before = _observations(store)
    assert before and all(n > 0 for n in before.values())
    # The checkpoint decodes (checksummed) and is at most one cadence (+ a tick and
    # scheduling slack on a loaded 2-core machine) older than the kill.
    restored = ckpt.restore()
    assert restored is not None and not restored.fell_back
    age = killed_at - restored.mtime_wall_ns / 1e9
    assert age < CADENCE_S + TICK_S + 2.0, age
    sets = restored.state["registry"]["sets"]
    assert set(sets) == set(before)

    # Restart on the same directories: state comes back, learning continues from it.
    restored_n = {cid: int(st["learners"]["beta"]["n_learned"]) for cid, st in sets.items()}
    d2 = start_daemon(tmp_path, *HEAVY)
    try:
        assert d2.named("learner state restored")
        _feed(d2, 8, 6)
        wait_quiet(d2)
        m = d2.scrape()
    finally:
        assert d2.stop() == 0
    after = _observations(store)
    for cid in before:
        learned_now = m[
            ("coeffd_learner_observations_total", (("config", cid), ("target", "step_period")))
        ]
        assert learned_now > 0
        # exactly the checkpointed learner plus what the restarted daemon learned
        assert after[cid] == restored_n[cid] + learned_now, (cid, after[cid], restored_n[cid])
