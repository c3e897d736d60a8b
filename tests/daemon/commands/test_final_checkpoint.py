"""A daemon whose state dir becomes unwritable says so: /readyz fails on the next
checkpoint, and it exits 1, not 0, when the final checkpoint cannot be written
(issue 17.8: it used to exit 0 and lose the state silently)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from serve_support import start_daemon, wait_drained

from coeffd.simfleet import SampleRates, run

WAIT_S = 60.0  # a safety net, not a timing assertion


def test_unwritable_state_dir_fails_readiness_and_the_exit_code(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--set", "state.checkpoint_interval_seconds=0.5")
    try:
        run("steady", 5, 1, rates=SampleRates(1.0, 1.0, 0.02, 100), drain_s=1,
            otlp_endpoint=f"127.0.0.1:{d.ports['otlp_grpc']}")  # fmt: skip
        wait_drained(d)
        assert d.get("/readyz")[0] == 200
        # the volume goes away: a file where the state directory was
        shutil.rmtree(tmp_path / "state", ignore_errors=True)
        (tmp_path / "state").write_text("not a directory")
        deadline = time.monotonic() + WAIT_S
        while d.get("/readyz")[0] == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        status, body = d.get("/readyz")
        assert status == 503 and b"checkpoints: last checkpoint write failed" in body
        assert d.scrape()[("coeffd_checkpoint_failures_total", ())] >= 1
    finally:
        code = d.stop()
    assert code == 1
    assert d.named("exiting without a final checkpoint")
    assert len(d.named("checkpoint not written")) == 1  # logged once, counted every time
