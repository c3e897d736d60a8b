"""A real ``coeffd serve`` subprocess for end-to-end tests (ports bound at :0, read back)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Daemon:
    """A running daemon: its process, its JSON log events and its bound ports."""

    proc: subprocess.Popen[str]
    events: list[dict[str, Any]] = field(default_factory=list)
    ports: dict[str, Any] = field(default_factory=dict)
    stderr: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.ports['http']}{path}"

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url(path), timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def scrape(
        self, families: Sequence[str] = ()
    ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """``/metrics`` over HTTP, parsed with prometheus-client's parser.

        ``families``: parse only these metric families' lines (their ``# HELP``/``# TYPE``
        and samples) — a poll reading two gauges need not parse a fleet's thousands of
        histogram series every quarter second (that parse was most of a wait's CPU)."""
        status, body = self.get("/metrics")
        assert status == 200
        text = body.decode()
        if families:
            text = "".join(
                line for line in text.splitlines(keepends=True) if _family_of(line) in families
            )
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e.get("event") == event]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90.0) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def _family_of(line: str) -> str:
    """The metric name a line of the text exposition belongs to (``# HELP name ...``,
    ``# TYPE name ...`` or ``name{labels} value``); a counter's samples end in ``_total``."""
    if line.startswith("# "):
        parts = line.split(" ", 3)
        name = parts[2] if len(parts) > 2 else ""
    else:
        name = line.split("{", 1)[0].split(" ", 1)[0]
    return name.removesuffix("_total")


def start_daemon(tmp: Path, *args: str, env: dict[str, str] | None = None) -> Daemon:
    """Start ``python -m coeffd serve`` with JSON logs; wait until it listens."""
    cmd: Sequence[str] = [
        sys.executable, "-m", "coeffd", "serve",
        "--log-format", "json",
        "--http-endpoint", "127.0.0.1:0",
        "--otlp-grpc-endpoint", "127.0.0.1:0",
        "--otlp-http-endpoint", "127.0.0.1:0",
        "--snapshot-dir", str(tmp / "snapshots"),
        "--state-dir", str(tmp / "state"),
        *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    d = Daemon(proc)

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                try:
                    d.events.append(json.loads(line))
                except ValueError:
                    continue

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            d.stderr.append(line)

    threading.Thread(target=read_out, daemon=True).start()
    threading.Thread(target=read_err, daemon=True).start()
    deadline = time.monotonic() + 60
    while not d.named("coeffd started"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"daemon did not start: {''.join(d.stderr)[-2000:]}")
        time.sleep(0.05)
    started = d.named("coeffd started")[0]
    d.ports = {
        "http": started["http"],
        "otlp_grpc": started["otlp_grpc"],
        "otlp_http": started["otlp_http"],
        "kv": started.get("kv") or [],
    }
    return d


#: What :func:`wait_quiet` reads of each scrape.
QUIET_FAMILIES = ("coeffd_queue_depth", "coeffd_learner_observations")


def wait_quiet(d: Daemon, timeout: float = 60.0, settle: float = 2.0) -> None:
    """Wait until the daemon's queue is empty and its observation count stops moving."""
    deadline = time.monotonic() + timeout
    last: float = -1.0
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        m = d.scrape(QUIET_FAMILIES)
        depth = m.get(("coeffd_queue_depth", ()), 0.0)
        obs = sum(v for (n, _), v in m.items() if n == "coeffd_learner_observations_total")
        if depth == 0 and obs == last:
            if time.monotonic() - stable_since >= settle:
                return
        else:
            stable_since = time.monotonic()
        last = obs
        time.sleep(0.25)
    raise AssertionError("daemon did not become quiet")


def wait_drained(d: Daemon, timeout: float = 60.0, settle: float = 1.0) -> None:
    """Wait until everything sent has been received and taken off the queue: the queue is
    empty and the count of received records stops moving.

    Unlike :func:`wait_quiet` it does not wait for the joiner, which holds each source's
    last ``joiner.window_s`` (30 s by default) of data until that source's clock has run
    on that long in real time; a SIGTERM then flushes it (``Joiner.flush``) and publishes
    a last time."""
    deadline = time.monotonic() + timeout
    last: float = -1.0
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        m = d.scrape(("coeffd_queue_depth", "coeffd_events_received"))
        depth = m.get(("coeffd_queue_depth", ()), 0.0)
        received = sum(v for (n, _), v in m.items() if n == "coeffd_events_received_total")
        if depth == 0 and received == last:
            if time.monotonic() - stable_since >= settle:
                return
        else:
            stable_since = time.monotonic()
        last = received
        time.sleep(0.25)
    raise AssertionError("daemon did not drain its queue")
