"""The daemon limits numpy's BLAS thread pool (``pipeline.blas_threads``): with one
thread per core on a 2-core machine shared with vLLM, the fleet refit's small inverses
ran ~20× slower (``python -m bench blas`` measures the ratio)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from threadpoolctl import threadpool_limits

from coeffd.base.blas import blas_threads
from coeffd.daemon.assemble import build_app
from coeffd.daemon.settings import Settings, SettingsError, load_settings


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The BLAS pool at 2 threads (its default on 2 cores), so a limit of 1 shows."""
    with threadpool_limits(limits=2):
        if blas_threads() != {2}:
            pytest.skip(f"this BLAS cannot run 2 threads here: {blas_threads()}")
        yield


def _settings(tmp_path: Path, blas: int | None) -> Settings:
    pipeline = {} if blas is None else {"blas_threads": blas}
    return load_settings(
        overrides={
            "pipeline": pipeline,
            "receivers": {"otlp_grpc": {"enabled": False}, "otlp_http": {"enabled": False}},
            "http": {"enabled": False},
            "publish": {"snapshot_dir": str(tmp_path / "snap")},
            "state": {"state_dir": str(tmp_path / "state")},
        },
        environ={},
    )


@pytest.mark.parametrize(("blas", "running"), [(None, 1), (1, 1), (0, 2)])
def test_a_running_daemon_limits_blas_threads_and_restores_them(
    tmp_path: Path, two_threads: None, blas: int | None, running: int
) -> None:
    app = build_app(_settings(tmp_path, blas))
    assert blas_threads() == {2}
    with app:
        # the default (None) is 1; 0 leaves the library's own size
        assert blas_threads() == {running}
    assert blas_threads() == {2}


def test_overlapping_daemons_restore_the_size_when_the_last_stops(
    tmp_path: Path, two_threads: None
) -> None:
    a = build_app(_settings(tmp_path / "a", 1))
    b = build_app(_settings(tmp_path / "b", 1))
    a.start()
    b.start()
    a.stop()
    assert blas_threads() == {1}  # b still runs
    b.stop()
    assert blas_threads() == {2}


@pytest.mark.parametrize("value", ["-1", "1025", "many"])
def test_blas_threads_is_validated_naming_the_key(value: str) -> None:
    with pytest.raises(SettingsError, match=r"^invalid setting pipeline\.blas_threads=") as e:
        load_settings(environ={"COEFFD_PIPELINE__BLAS_THREADS": value})
    assert "\n" not in str(e.value)
