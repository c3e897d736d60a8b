"""Fixtures for publish tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from publish_support import serve

from coeffd.daemon.publish.store import SnapshotStore


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(tmp_path / "snapshots", retention=3)


@pytest.fixture
def server_url(store: SnapshotStore) -> Iterator[str]:
    server, url = serve(store)
    try:
        yield url
    finally:
        server.stop()
