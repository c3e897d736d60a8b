"""The demo as a newcomer meets it (issue 33): a log (stdout not a terminal) gets a table
when something changed, not every refresh (item 14), and every table says what the demo's
dense sampling means at vLLM's default rates (item 9). In-process, free ports; stopped by
SIGTERM (its own handler) a moment after it started."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from coeffd.daemon import cli


def _ours(*_: Any) -> None:  # a SIGTERM before the demo installs its handler: ignored
    pass


def _terminate_after_start(seconds: float) -> None:
    deadline = time.monotonic() + 120
    while signal.getsignal(signal.SIGTERM) is _ours and time.monotonic() < deadline:
        time.sleep(0.05)  # the demo has not installed its handler yet
    time.sleep(seconds)
    os.kill(os.getpid(), signal.SIGTERM)


def test_demo_log_is_not_a_table_per_refresh_and_says_what_sampling_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = signal.signal(signal.SIGTERM, _ours)
    stopper = threading.Thread(target=_terminate_after_start, args=(2.0,), daemon=True)
    stopper.start()
    try:
        code = cli.main(
            [
                "demo", "--refresh", "0.05", "--http-endpoint", "127.0.0.1:0",
                "--otlp-grpc-endpoint", "127.0.0.1:0", "--otlp-http-endpoint", "127.0.0.1:0",
                "--set", "kv.endpoints=", "--state-dir", str(tmp_path / "state"),
                "--snapshot-dir", str(tmp_path / "snap"),
            ]
        )  # fmt: skip
        stopper.join(timeout=120)
    finally:
        signal.signal(signal.SIGTERM, before)
    out = capsys.readouterr().out
    assert code == 0
    tables = out.count("coeffd demo —")
    # ~40 refreshes in 2 s; a table at the first refresh, when a configuration appears
    # (8 in this fleet), and the final one
    assert 2 <= tables <= 11, tables
    notes = [ln for ln in out.splitlines() if ln.startswith("note: the demo traces 50% of steps")]
    assert notes and "vLLM's default traces 1%" in notes[0] and "α0" in notes[0]
