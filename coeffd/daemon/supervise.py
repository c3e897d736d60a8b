"""Worker-thread supervision: a dead thread fails ``/readyz`` and is restarted, counted.

The daemon's work runs in a few long-lived threads (the pipeline worker, one per KV
subscriber, the HTTP servers). Each catches and counts what its input can throw at it,
but a thread can still die (a ``BaseException``, a bug in a library): before, the KV
subscriber then stopped for good while ``/healthz`` stayed 200 and later batches were
silently lost. The supervisor checks every worker about once a second; a dead one makes
the ``threads`` readiness check fail (so an orchestrator can see it), is restarted, and
``coeffd_thread_restarts_total{thread}`` counts the restart.

>>> from prometheus_client import CollectorRegistry
>>> sup = Supervisor(CollectorRegistry())
>>> state = {"alive": False}
>>> sup.watch("demo", lambda: state["alive"], lambda: state.update(alive=True))
>>> sup.dead()
['demo']
>>> sup.readiness()
'worker thread dead (restarting): demo'
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry, Counter

__all__ = ["Supervisor"]

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class _Worker:
    name: str
    alive: Callable[[], bool]
    restart: Callable[[], None]


class Supervisor:
    """Watches named workers; :meth:`check` restarts the dead ones."""

    def __init__(self, registry: CollectorRegistry, interval: float = 1.0) -> None:
        self.interval = interval
        self.restarts = Counter(
            "coeffd_thread_restarts_total",
            "Worker threads found dead and restarted, by thread (pipeline, kv, http, "
            "otlp_http). Any increase is a bug or an input no receiver handled: see the log.",
            ["thread"],
            registry=registry,
        )
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, name: str, alive: Callable[[], bool], restart: Callable[[], None]) -> None:
        """Supervise a worker; ``name`` is its ``thread`` label (keep the set small)."""
        with self._lock:
            self._workers.append(_Worker(name, alive, restart))
        self.restarts.labels(name)  # the series exists (at 0) before the first restart

    def dead(self) -> list[str]:
        """Names of the workers not running now."""
        with self._lock:
            workers = list(self._workers)
        return [w.name for w in workers if not w.alive()]

    def readiness(self) -> str | None:
        """The ``threads`` readiness check: None while every worker runs."""
        dead = self.dead()
        return f"worker thread dead (restarting): {', '.join(dead)}" if dead else None

    def check(self) -> list[str]:
        """Restart every dead worker; returns the names restarted."""
        with self._lock:
            workers = list(self._workers)
        restarted = []
        for w in workers:
            if self._stop.is_set() or w.alive():
                continue
            log.error("worker thread died; restarting it", thread=w.name)
            try:
                w.restart()
            except Exception as e:  # try again next round; readiness stays failing
                log.error("worker thread restart failed", thread=w.name, error=repr(e))
                continue
            self.restarts.labels(w.name).inc()
            restarted.append(w.name)
        return restarted

    def start(self) -> None:
        """Check every ``interval`` seconds in a background thread until :meth:`stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="coeffd-supervisor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop supervising (before the workers are stopped on purpose)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()
