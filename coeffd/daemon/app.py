"""One daemon instance: settings → receivers + pipeline + HTTP server (:class:`App`).

The receivers hand their records to the :class:`~daemon.pipeline.Pipeline` (a bounded
queue and its one worker); the app starts and stops them, the HTTP routes ``/metrics``,
``/healthz`` and ``/readyz``, the KV subscribers and the supervisor of its threads.
"""

from __future__ import annotations

import functools
import platform
import re
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any, ClassVar

import prometheus_client
import structlog
from prometheus_client import CollectorRegistry, Gauge, Info, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from coeffd.base.blas import limit_blas_threads
from coeffd.base.endpoint import parse_endpoint
from coeffd.base.http import HttpServer, Request, Response, Router
from coeffd.base.security import AuthMetrics, http_guard
from coeffd.daemon.pipeline import Consumer, CountingConsumer, Pipeline
from coeffd.daemon.publish.snapshot import coeffd_version
from coeffd.daemon.settings import Settings
from coeffd.daemon.supervise import Supervisor
from coeffd.receivers.grpc.server import OtlpGrpcReceiver
from coeffd.receivers.http.server import OtlpHttpReceiver
from coeffd.receivers.metrics import ReceiverMetrics
from coeffd.receivers.occupancy import Occupancy
from coeffd.receivers.otlp import native as native_decoder
from coeffd.receivers.otlp.decode import Decoder
from coeffd.records.events import Record

__all__ = ["App", "ListenerError"]

log = structlog.get_logger(__name__)

#: An absolute file path in a readiness reason (an OSError's ``'/var/lib/...'``), not the
#: path part of a URL (``tcp://host:5557``, ``https://peer:9464/v1/...``).
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/[^\s'\"]+")


# Like other exporters: no ``*_created`` series (a timestamp per counter and histogram
# child, ~1/3 of the series, that no dashboard or alert reads). Process-wide by design.
prometheus_client.disable_created_metrics()


#: ``GET /``'s links: path, what it is.
INDEX: tuple[tuple[str, str], ...] = (
    ("/metrics", "Prometheus metrics"),
    ("/healthz", "liveness"),
    ("/readyz", "readiness, naming each failing check"),
    ("/v1/configurations", "learned configurations (JSON)"),
    ("/v1/coefficients/fleet", "the fleet vector; /v1/coefficients/{id} for one configuration"),
    ("/v1/predict?model=llama-3.1-8b-instruct&gpu=H100&tp=1", "coefficients for a setup"),
)


class ListenerError(OSError):
    """A listener could not start (a port in use, an address not here): the message names
    the listener, its endpoint and the flag that moves it, for a one-line stderr report.

    >>> str(ListenerError("http", "0.0.0.0:9464", OSError(98, "Address already in use")))
    'http endpoint 0.0.0.0:9464: Address already in use; move it with --http-endpoint HOST:PORT'
    """

    #: listener → the command-line flag that sets its endpoint
    FLAGS: ClassVar[dict[str, str]] = {
        "http": "--http-endpoint HOST:PORT",
        "otlp_grpc": "--otlp-grpc-endpoint HOST:PORT",
        "otlp_http": "--otlp-http-endpoint HOST:PORT",
        "kv": "--kv-endpoint tcp://HOST:PORT",
    }

    def __init__(self, listener: str, endpoint: str, cause: OSError) -> None:
        self.listener, self.endpoint = listener, endpoint
        reason = cause.strerror or str(cause)
        flag = self.FLAGS.get(listener)
        super().__init__(
            cause.errno,
            f"{listener} endpoint {endpoint}: {reason}"
            + (f"; move it with {flag}" if flag else ""),
        )

    def __str__(self) -> str:
        return str(self.strerror)

    def example(self) -> str:
        """The flag with the next port, e.g. ``--http-endpoint 127.0.0.1:9465``.

        >>> ListenerError("kv", "tcp://127.0.0.1:5557", OSError(98, "in use")).example()
        '--kv-endpoint tcp://127.0.0.1:5558'
        """
        flag = self.FLAGS.get(self.listener, "").split(" ")[0]
        head, _, port = self.endpoint.split(",")[0].rpartition(":")
        if not flag or not port.isdigit():
            return ""
        host = head if "//" in head else "127.0.0.1"
        return f"{flag} {host}:{int(port) + 1}"


def register_process_metrics(registry: CollectorRegistry) -> None:
    """``process_cpu_seconds_total``, ``process_resident_memory_bytes``, … (as every
    exporter) and ``coeffd_build_info``, whose ``otlp_decoder`` says whether the compiled
    OTLP decoder runs (``compiled``) or the ~4x slower pure-Python fallback (``python``:
    the install had no C compiler, or ``COEFFD_PURE_DECODE`` is set)."""
    ProcessCollector(registry=registry)
    Info("coeffd_build", "The running coeffd.", registry=registry).info(
        {
            "version": coeffd_version(),
            "python": platform.python_version(),
            "otlp_decoder": "compiled" if native_decoder.AVAILABLE else "python",
        }
    )


class App:
    """One daemon instance: settings → receivers + pipeline + HTTP server.

    The receivers' host (``receivers.host.Host``, structurally): what they are given.

    ``registry`` is this app's own Prometheus registry (never the global one).
    ``daemon.assemble`` builds the daemon and hands its parts in here; without them the
    app counts records (``consumer``) with a decoder, occupancy and router of its own:

    decoder
        The OTLP receivers' decoder (its ``source_filter`` is engine sampling's).
    grpc_occupancy
        How full the OTLP/gRPC receiver's worker pool runs (engine sampling reads it).
    kv_engine_filter
        Engine sampling for the KV streams: engine name → take its events?
    router
        Routes served besides ``/metrics``, ``/healthz`` and ``/readyz`` (the ``/v1``
        API), which this app adds to it.
    readiness
        Named readiness checks besides ``threads`` (see :meth:`add_readiness_check`).
    """

    def __init__(
        self,
        settings: Settings,
        consumer: Consumer | None = None,
        registry: CollectorRegistry | None = None,
        *,
        decoder: Decoder | None = None,
        grpc_occupancy: Occupancy | None = None,
        kv_engine_filter: Callable[[str], bool] | None = None,
        router: Router | None = None,
        readiness: Mapping[str, Callable[[], str | None]] | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry if registry is not None else CollectorRegistry()
        register_process_metrics(self.registry)
        self.metrics = ReceiverMetrics(self.registry)
        self.log_rate_limit_seconds = settings.log.rate_limit_seconds
        self.auth_metrics = AuthMetrics(self.registry, settings.log.rate_limit_seconds)
        self.consumer: Consumer = consumer if consumer is not None else CountingConsumer()
        self.pipeline = Pipeline(
            self.consumer,
            settings.pipeline.queue_capacity,
            self.metrics,
            tick_interval=settings.pipeline.tick_interval_seconds,
            rate_limit_seconds=settings.log.rate_limit_seconds,
        )
        self.decoder = decoder if decoder is not None else Decoder()
        #: Engine sampling for the KV streams (engine name → take its events?), like
        #: ``decoder.source_filter``.
        self.kv_engine_filter = kv_engine_filter
        #: How full the OTLP/gRPC receiver's worker pool runs (engine sampling reads it).
        self.grpc_occupancy = (
            grpc_occupancy
            if grpc_occupancy is not None
            else Occupancy(settings.receivers.otlp_grpc.workers)
        )
        self.router = router if router is not None else Router()
        self.router.add_route("GET", "/", self._index)
        self.router.add_route("GET", "/metrics", self._metrics)
        self.router.add_route("GET", "/healthz", self._healthz, inline=True)  # reads a flag
        self.router.add_route("GET", "/readyz", self._readyz)
        self.ready = False
        #: Named readiness checks: ``/readyz`` answers 503 naming every check that fails.
        #: A check returns None when fine, else one line saying what is wrong: threads,
        #: those handed in (state writes), KV streams (added at start).
        self.readiness: dict[str, Callable[[], str | None]] = {}
        #: Restarts dead worker threads; the ``threads`` readiness check names them.
        self.supervisor = Supervisor(self.registry)
        self.add_readiness_check("threads", self.supervisor.readiness)
        for name, check in (readiness or {}).items():
            self.add_readiness_check(name, check)
        self._stop_event = threading.Event()
        self._started = False
        self._stopped = False
        self._lock = threading.Lock()
        self._http: HttpServer | None = None
        self._grpc: OtlpGrpcReceiver | None = None
        self._otlp_http: OtlpHttpReceiver | None = None
        self._kv: list[Any] = []
        self._release_blas: Callable[[], None] | None = None

    # ------------------------------------------------------------------ HTTP routes
    def _metrics(self, req: Request) -> Response:
        return Response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)

    def _index(self, req: Request) -> Response:
        """``GET /``: a page of links, as Prometheus exporters answer (a 404 told a
        newcomer pointing a browser at the port nothing)."""
        links = "".join(f'<li><a href="{href}">{href}</a> {what}</li>\n' for href, what in INDEX)
        body = (
            "<!DOCTYPE html>\n<html><head><title>coeffd</title></head><body>\n"
            f"<h1>coeffd {coeffd_version()}</h1>\n"
            "<p>Learns BLIS latency-model coefficients from vLLM telemetry.</p>\n"
            f"<ul>\n{links}</ul>\n</body></html>\n"
        )
        return Response(200, body.encode(), "text/html; charset=utf-8")

    def _healthz(self, req: Request) -> Response:
        if self._started and not self._stopped and not self.pipeline.alive:
            return Response.text(503, "pipeline worker not running")
        return Response.text(200, "ok")

    def _readyz(self, req: Request) -> Response:
        if not self.ready:
            return Response.text(503, "not ready")
        # ?exclude=kv&exclude=snapshots (or comma-separated), as kube-apiserver's /readyz:
        # a sidecar's probe leaves out what must not take its vLLM out of the Service.
        excluded = {n.strip() for v in req.query.get("exclude", ()) for n in v.split(",")}
        failing = [(n, why) for n, why in self.readiness_failures() if n not in excluded]
        if failing:
            # the probe is public (kubelet has no token): the same answer for everyone,
            # so it names what fails but no file (the log line has the details)
            text = "\n".join(
                f"{name}: {_ABSOLUTE_PATH.sub('<path>', why)}" for name, why in failing
            )
            return Response.text(503, text)
        return Response.text(200, "ready")

    def add_readiness_check(self, name: str, check: Callable[[], str | None]) -> None:
        """Make ``/readyz`` fail while ``check()`` returns a reason (None = fine)."""
        self.readiness[name] = check

    def readiness_failures(self) -> list[tuple[str, str]]:
        """(name, reason) of every failing readiness check, in the order they were added.

        A check that raises counts as failing (its error is the reason) rather than
        turning the probe into a 500.
        """
        out: list[tuple[str, str]] = []
        for name, check in list(self.readiness.items()):
            try:
                why = check()
            except Exception as e:  # a broken check must not break the probe
                why = f"check failed: {e!r}"
            if why is not None:
                out.append((name, why))
        return out

    # ---------------------------------------------------------------------- ports
    @property
    def http_port(self) -> int | None:
        """Bound port of the metrics/health/API server."""
        return self._http.port if self._http else None

    @property
    def grpc_port(self) -> int | None:
        """Bound port of the OTLP/gRPC receiver."""
        return self._grpc.port if self._grpc else None

    @property
    def otlp_http_port(self) -> int | None:
        """Bound port of the OTLP/HTTP receiver."""
        return self._otlp_http.port if self._otlp_http else None

    # ------------------------------------------------------------------ lifecycle
    def offer(self, records: Sequence[Record], receiver: str) -> bool:
        """Shortcut for :meth:`Pipeline.offer`."""
        return self.pipeline.offer(records, receiver)

    def pause(self) -> None:
        """Pause the pipeline worker (tests: back-pressure)."""
        self.pipeline.pause()

    def resume(self) -> None:
        """Resume the pipeline worker."""
        self.pipeline.resume()

    def start(self) -> App:
        """Start the worker, the receivers and the HTTP server; then mark ready."""
        with self._lock:
            if self._started:
                return self
            self._started = True
        s = self.settings
        # Before the worker starts: its fleet refits are what the BLAS threads slowed down.
        self._release_blas = limit_blas_threads(s.pipeline.blas_threads)
        self.pipeline.start()
        sup = self.supervisor
        sup.watch("pipeline", lambda: self.pipeline.alive, self.pipeline.restart)
        listener, endpoint = "", ""
        try:
            if s.http.enabled:
                listener, endpoint = "http", s.http.endpoint
                host, port = parse_endpoint(endpoint)
                public = {"/healthz", "/readyz"} | (
                    {"/metrics"} if s.http.metrics_public else set()
                )
                tls, gate = http_guard("http", s.http.tls, s.http.auth, self.auth_metrics, public)
                self._http = HttpServer(
                    host, port, self.router, name="http", ssl_context=tls, gate=gate
                )
                self._http.start()
                sup.watch("http", lambda: bool(self._http and self._http.alive), self._http.restart)
            if s.receivers.otlp_grpc.enabled:
                listener, endpoint = "otlp_grpc", s.receivers.otlp_grpc.endpoint
                self._grpc = OtlpGrpcReceiver(self, s.receivers)
                self._grpc.start()
            if s.receivers.otlp_http.enabled:
                listener, endpoint = "otlp_http", s.receivers.otlp_http.endpoint
                self._otlp_http = OtlpHttpReceiver(self, s.receivers)
                self._otlp_http.start()
                otlp_http = self._otlp_http
                sup.watch("otlp_http", lambda: otlp_http.alive, otlp_http.restart)
            if s.kv.endpoints:
                listener, endpoint = "kv", ",".join(s.kv.endpoints)
                self._start_kv()
        except OSError as e:
            log.error("cannot start listener", listener=listener, endpoint=endpoint, error=str(e))
            self.stop()
            raise ListenerError(listener, endpoint, e) from e
        sup.start()
        self.ready = True
        log.info(
            "coeffd started",
            otlp_grpc=self.grpc_port,
            otlp_http=self.otlp_http_port,
            http=self.http_port,
            kv=self.kv_endpoints,
            queue_capacity=s.pipeline.queue_capacity,
            otlp_decoder="compiled" if native_decoder.AVAILABLE else "python",
        )
        if not native_decoder.AVAILABLE:  # works, but a quarter of the throughput
            log.warning("compiled OTLP decoder not in use", reason=native_decoder.UNAVAILABLE)
        return self

    def _start_kv(self) -> None:
        """One ZMQ SUB per configured KV endpoint, feeding the same pipeline."""
        import zmq

        from coeffd.receivers.kv.subscriber import KVMetrics, KVSubscriber

        kv = self.settings.kv
        if not kv.endpoints:
            return
        metrics = KVMetrics(
            self.registry,
            events_rejected=self.metrics.events_rejected,
            events_received=self.metrics.events_received,
            events_sampled_out=self.metrics.events_sampled_out,
        )
        connected = Gauge(
            "coeffd_kv_connected",
            "1 while the KV publisher this daemon connects to is connected, else 0 (ZMQ "
            "retries in the background; kv.bind endpoints are not listed).",
            ["endpoint"],
            registry=self.registry,
        )
        for endpoint in kv.endpoints:
            sub = KVSubscriber(
                endpoint,
                kv.topic,
                lambda records: self.pipeline.offer(records, "kv"),
                bind=kv.bind,
                metrics=metrics,
                replay_endpoint=kv.replay_endpoint,
                topic_sources=kv.topic_sources,
                count_received=False,
                engine_filter=self.kv_engine_filter,
            )
            try:
                sub.start()
            except zmq.ZMQError as e:
                raise OSError(f"kv endpoint {endpoint}: {e}") from e
            self._kv.append(sub)
            self.supervisor.watch("kv", functools.partial(getattr, sub, "alive"), sub.restart)
            if not kv.bind:
                connected.labels(endpoint).set_function(
                    functools.partial(lambda s: float(bool(s.connected)), sub)
                )
        # A publisher not (yet) connected is no readiness failure: coeffd serves without
        # KV events, and a fleet replica whose engines have not bound their socket would
        # drop out of the Service (and the Collector's routing). coeffd_kv_connected and
        # the CoeffdKvPublisherUnreachable alert say so instead.

    @property
    def kv_endpoints(self) -> list[str]:
        """Endpoints the KV subscribers are bound or connected to."""
        return [s.bound_endpoint or s.endpoint for s in self._kv]

    def stop(self) -> bool:
        """Graceful stop: refuse new requests, drain the queue, close the consumer.

        Returns True if the queue drained completely.
        """
        with self._lock:
            if self._stopped:
                return True
            self._stopped = True
        self.ready = False
        self.supervisor.stop()  # workers stopped on purpose are not restarted
        grace = min(self.settings.pipeline.drain_timeout_seconds, 5.0)
        if self._grpc is not None:
            self._grpc.stop(grace)
        if self._otlp_http is not None:
            self._otlp_http.stop()
        for sub in self._kv:
            sub.stop()
        drained = self.pipeline.close(self.settings.pipeline.drain_timeout_seconds)
        # The metrics server goes last so the final state can still be scraped while
        # draining.
        if self._http is not None:
            self._http.stop()
        if self._release_blas is not None:
            self._release_blas()
        self._stop_event.set()
        log.info("coeffd stopped", drained=drained)
        return drained

    def request_stop(self) -> None:
        """Ask :meth:`run` to shut down (signal-safe)."""
        self._stop_event.set()

    def run(self, install_signals: bool = True) -> int:
        """Start, serve until SIGTERM/SIGINT (or :meth:`request_stop`), stop; exit code."""
        if install_signals:

            def _on_signal(signum: int, frame: FrameType | None) -> None:
                log.info("signal received; shutting down", signal=signal.Signals(signum).name)
                self._stop_event.set()

            signal.signal(signal.SIGTERM, _on_signal)
            signal.signal(signal.SIGINT, _on_signal)
        self.start()
        while not self._stop_event.wait(0.5):
            pass
        self.stop()
        return 0

    def __enter__(self) -> App:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
