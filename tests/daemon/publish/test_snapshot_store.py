"""SnapshotStore: versions, retention, latest, refusal of invalid vectors, torn files."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from publish_support import make_snapshot

from coeffd.daemon.publish.atomic import atomic_write_bytes
from coeffd.daemon.publish.policy import PublishPolicy, step_time_change
from coeffd.daemon.publish.snapshot import (
    InvalidCoefficientsError,
    InvalidConfigurationIdError,
    decode_snapshot,
    validate_for_blis,
)
from coeffd.daemon.publish.store import SnapshotStore, StaleVersionError


def test_versions_increase_retention_prunes_latest_stable(store: SnapshotStore) -> None:
    cid = "llama8b-h100-tp1"
    assert store.next_version(cid) == 1
    for v in range(1, 6):
        store.publish(make_snapshot(cid, v))
        assert store.next_version(cid) == v + 1
    assert store.versions(cid) == [3, 4, 5]  # retention=3
    latest = store.latest(cid)
    assert latest is not None and latest.version == 5
    assert store.get(cid, 5) == latest
    assert store.get(cid, 1) is None
    assert [s.version for s in store.history(cid)] == [3, 4, 5]
    assert store.configurations() == [cid]
    with pytest.raises(StaleVersionError):
        store.publish(make_snapshot(cid, 5))
    files = sorted(p.name for p in (store.directory / cid).iterdir())
    assert files == ["latest.json", "v3.json", "v4.json", "v5.json"]
    assert (store.directory / cid / "latest.json").read_bytes() == (
        store.directory / cid / "v5.json"
    ).read_bytes()


def test_round_trip_preserves_every_field(store: SnapshotStore) -> None:
    snap = make_snapshot()
    path = store.publish(snap)
    assert decode_snapshot(path.read_bytes()) == snap
    assert store.latest(snap.config_id) == snap


@pytest.mark.parametrize(
    ("alpha", "beta", "message"),
    [
        ((1.0, 2.0), (1.0,) * 11, "AlphaCoeffs requires at least 3"),
        ((1.0, math.nan, 3.0), (1.0,) * 11, "AlphaCoeffs[1] is NaN"),
        ((1.0, 2.0, math.inf), (1.0,) * 11, "AlphaCoeffs[2] is Inf"),
        ((1.0, -2.0, 3.0), (1.0,) * 11, "must be non-negative"),
        ((1.0, 2.0, 3.0), (1.0,) * 6, "BetaCoeffs requires at least 7"),
        ((1.0, 2.0, 3.0), (1.0,) * 10, "exactly 11"),
        ((1.0, 2.0, 3.0, 4.0), (1.0,) * 11, "exactly 3"),
        ((1.0, 2.0, 3.0), (1.0,) * 10 + (-0.5,), "BetaCoeffs[10]"),
        ((1.0, 2.0, 3.0), (1.0,) * 5 + (math.nan,) + (1.0,) * 5, "BetaCoeffs[5] is NaN"),
        ((1.0, 2.0, 3.0), (0.0,) * 11, "all zeros"),
    ],
)
def test_invalid_vectors_refused_nothing_written(
    store: SnapshotStore, alpha: tuple[float, ...], beta: tuple[float, ...], message: str
) -> None:
    with pytest.raises(
        InvalidCoefficientsError, match=message.replace("[", r"\[").replace("]", r"\]")
    ):
        store.publish(make_snapshot("cfg-a", 1, alpha, beta))
    assert store.configurations() == []
    assert not (store.directory / "cfg-a").exists() or not any(
        (store.directory / "cfg-a").iterdir()
    )


def test_invalid_does_not_replace_valid(store: SnapshotStore) -> None:
    store.publish(make_snapshot("cfg", 1))
    with pytest.raises(InvalidCoefficientsError):
        store.publish(make_snapshot("cfg", 2, beta=(math.nan,) * 11))
    assert store.versions("cfg") == [1]
    latest = store.latest("cfg")
    assert latest is not None and latest.version == 1


def test_blis_minimums_without_exact_lengths() -> None:
    validate_for_blis([1, 2, 3, 4], [1.0] * 7, exact_lengths=False)
    with pytest.raises(InvalidCoefficientsError):
        validate_for_blis([1, 2, 3], [True] * 11)


@pytest.mark.parametrize("bad", ["..", "a/b", "", ".hidden", "x" * 200, "a b"])
def test_config_ids_are_safe_path_components(store: SnapshotStore, bad: str) -> None:
    with pytest.raises(InvalidConfigurationIdError):
        store.publish(make_snapshot(bad, 1))


def test_leftover_temp_file_ignored(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, retention=5)
    store.publish(make_snapshot("cfg", 1))
    cdir = tmp_path / "cfg"
    # A crash mid-write leaves a hidden, truncated temp file next to the real ones.
    (cdir / ".v2.json.abc123.tmp").write_bytes(b'{"configuration": {"id": "cf')
    (cdir / ".latest.json.def456.tmp").write_bytes(b"")
    assert store.versions("cfg") == [1]
    assert [s.version for s in store.history("cfg")] == [1]
    assert store.configurations() == ["cfg"]
    store.publish(make_snapshot("cfg", 2))
    latest = store.latest("cfg")
    assert latest is not None and latest.version == 2
    # A new store (restart) removes stale temp files only.
    SnapshotStore(tmp_path, retention=5, stale_temp_age_s=0.0)
    assert not list(cdir.glob("*.tmp"))


def test_concurrent_reader_never_sees_torn_file(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, retention=2)
    store.publish(make_snapshot("cfg", 1))
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []

    def reader() -> None:
        latest = tmp_path / "cfg" / "latest.json"
        while not stop.is_set():
            try:
                snap = decode_snapshot(latest.read_bytes())  # raw read: no store-side retries
                seen.append(snap.version)
                for s in store.history("cfg"):
                    assert s.version >= 1
            except BaseException as exc:  # pragma: no cover - the failure we test for
                errors.append(exc)
                return

    t = threading.Thread(target=reader)
    t.start()
    try:
        for v in range(2, 150):
            store.publish(make_snapshot("cfg", v))
    finally:
        stop.set()
        t.join()
    assert not errors
    assert seen and seen == sorted(seen)  # versions seen by a reader never go backwards


def test_metrics_exported(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    store = SnapshotStore(tmp_path, registry=registry)
    store.publish(make_snapshot("cfg", 4))
    assert registry.get_sample_value("coeffd_snapshot_version", {"config": "cfg"}) == 4
    ts = registry.get_sample_value("coeffd_snapshot_timestamp_seconds", {"config": "cfg"})
    assert ts == pytest.approx(1_767_225_600.0)


def test_atomic_write_keeps_mode(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old")
    target.chmod(0o600)
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_publish_policy() -> None:
    policy = PublishPolicy(interval_s=60, relative_threshold=0.05, min_observations=10)
    prev = make_snapshot("cfg", 1)
    now = prev.wall_ns + 1_000_000_000
    beta = list(prev.beta)
    assert policy.decide(None, prev.alpha, beta, now, 100) == (True, "first")
    assert policy.decide(prev, prev.alpha, beta, now, 5) == (False, "too_few_observations")
    assert policy.decide(prev, prev.alpha, beta, now, 100) == (False, "unchanged")
    assert policy.decide(prev, prev.alpha, beta, now + 60 * 10**9, 100) == (True, "interval")
    moved = [*beta]
    moved[4] *= 1.2
    assert policy.decide(prev, prev.alpha, moved, now, 100) == (True, "significant_change")
    moved[0] = math.nan
    assert policy.decide(prev, prev.alpha, moved, now + 60 * 10**9, 100) == (False, "invalid")


def test_publish_policy_judges_beta_by_the_step_times_of_recent_batches() -> None:
    import numpy as np

    policy = PublishPolicy(interval_s=60, relative_threshold=0.05, step_time_threshold=0.005)
    prev = make_snapshot("cfg", 1)
    now = prev.wall_ns + 1_000_000_000
    base = np.asarray(prev.beta)
    # recent batches excite terms 0 and 9 only, and share the step between them
    recent = np.zeros((4, 11))
    recent[:, 0] = [1000.0, 2000.0, 500.0, 0.0]
    recent[:, 9] = [2000.0, 1000.0, 1500.0, 3000.0]
    moved = base.copy()
    moved[4] *= 1.5  # a term no recent batch excites: nothing BLIS predicts here moves
    assert policy.decide(prev, prev.alpha, moved, now, 0, recent) == (False, "unchanged")
    assert policy.decide(prev, prev.alpha, moved, now + 60 * 10**9, 0, recent) == (
        True,
        "interval",
    )
    small = base.copy()
    small[9] *= 1.004  # < 0.5 % on every batch
    assert step_time_change(base, small, recent) < 0.004
    assert policy.decide(prev, prev.alpha, small, now, 0, recent) == (False, "unchanged")
    big = base.copy()
    big[9] *= 1.02  # 0.5–2 % depending on the batch: over the threshold on average
    assert 0.005 < step_time_change(base, big, recent) <= 0.02
    assert policy.decide(prev, prev.alpha, big, now, 0, recent) == (True, "significant_change")
    # α still judged coefficient by coefficient
    alpha = [a * 1.1 for a in prev.alpha]
    assert policy.decide(prev, alpha, base, now, 0, recent) == (True, "significant_change")


def test_publish_policy_refines_an_estimate_learned_from_twice_the_observations() -> None:
    """Below the threshold, numbers are republished once the β learner has learned twice
    what the published ones were fitted on (an early estimate must not stay for good),
    and never when they did not change."""
    import numpy as np

    policy = PublishPolicy(interval_s=60, relative_threshold=0.05, step_time_threshold=0.005)
    prev = make_snapshot("cfg", 1)
    now = prev.wall_ns + 1_000_000_000
    recent = np.zeros((2, 11))
    recent[:, 9] = [2000.0, 1000.0]
    small = np.asarray(prev.beta).copy()
    small[9] *= 1.004  # < 0.5 % on every batch
    decide = policy.decide
    assert decide(prev, prev.alpha, small, now, 0, recent, 1999, 1000) == (False, "unchanged")
    assert decide(prev, prev.alpha, small, now, 0, recent, 2000, 1000) == (True, "refined")
    same = tuple(prev.beta)
    assert decide(prev, prev.alpha, same, now, 0, recent, 4000, 1000) == (False, "unchanged")
    # no record of what the numbers were fitted on: the threshold alone decides
    assert decide(prev, prev.alpha, small, now, 0, recent, 4000, None) == (False, "unchanged")
