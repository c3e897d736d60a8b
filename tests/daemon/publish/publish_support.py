"""Helpers for publish tests (unique module name: tests dirs have no __init__.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from coeffd.base.http import HttpServer
from coeffd.daemon import api
from coeffd.daemon.publish.snapshot import ConfigurationRef, ErrorStats, Snapshot
from coeffd.daemon.publish.store import SnapshotStore

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
BLIS_DEFAULTS = FIXTURES / "blis_defaults.yaml"

ALPHA = (15000.123456789, 700.5, 44.25)
BETA = (0.15, 0.0, 1.3625, 0.75, 32.1, 4.4, 126.0, 481.0, 0.0, 1.95, 0.75)


def make_snapshot(
    config_id: str = "llama8b-h100-tp1",
    version: int = 1,
    alpha: tuple[float, ...] = ALPHA,
    beta: tuple[float, ...] = BETA,
) -> Snapshot:
    return Snapshot(
        configuration=ConfigurationRef(
            id=config_id, labels={"model": "llama-3.1-8b", "gpu": "H100"}, description={"tp": 1}
        ),
        version=version,
        wall_ns=1_767_225_600_000_000_000 + version,
        alpha=alpha,
        beta=beta,
        extended={"gamma_cpu": 1.5},
        queue_wait={"per_waiting": 3.0},
        observations={"step_period": 100 * version},
        prequential={
            "step_period": {
                "learned": ErrorStats(mape=0.05, rmse=120.0, count=100),
                "blis_default": ErrorStats(mape=0.3, rmse=900.0, count=100),
            }
        },
        unidentified=("beta[7]",),
    )


def serve(store: SnapshotStore) -> tuple[HttpServer, str]:
    """The daemon's own HTTP server on a free loopback port with the API mounted."""
    server = HttpServer("127.0.0.1", 0, name="test-api")
    api.mount(server.router, store)
    server.start()
    return server, f"http://127.0.0.1:{server.port}"


def run_pull(*args: str) -> subprocess.CompletedProcess[str]:
    """``coeffd pull ARGS`` as a real subprocess (``python -m coeffd pull``)."""
    return subprocess.run(
        [sys.executable, "-m", "coeffd", "pull", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
