"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

Answers honestly (spec §1.2, §1.5): success only after the records are in the pipeline
queue; ``UNAVAILABLE`` with a RetryInfo when the queue is full, so the SDK exporter
sleeps our delay and resends instead of dropping; ``partial_success`` naming what was
rejected. The RetryInfo goes out twice: as the standard ``grpc-status-details-bin``
(a ``google.rpc.Status`` with the RetryInfo in ``details``) and as
``google.rpc.retryinfo-bin``, the trailer the OpenTelemetry Python exporter reads.

Every request is counted (``coeffd_receiver_requests_total``): one over
``receivers.limits`` is refused before parsing (``INVALID_ARGUMENT``), one over
``max_message_bytes`` by grpc before reading it (``RESOURCE_EXHAUSTED``), which
``Export`` sees because it is served as a client-streaming handler.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import structlog
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from coeffd.base.endpoint import parse_endpoint
from coeffd.base.security import grpc_server_credentials, grpc_token_interceptor
from coeffd.receivers.config import ReceiverSettings
from coeffd.receivers.host import Host
from coeffd.receivers.occupancy import Occupancy
from coeffd.receivers.otlp.fastproto import parse_request
from coeffd.receivers.otlp.ingest import Ingestor, Outcome
from coeffd.receivers.otlp.limits import RequestLimits, check_request

__all__ = ["RECEIVER", "OtlpGrpcReceiver", "retry_trailers"]

log = structlog.get_logger(__name__)

RECEIVER = "otlp_grpc"


def retry_trailers(delay_seconds: float, message: str) -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata telling a gRPC client to retry after ``delay_seconds``."""
    secs = int(delay_seconds)
    delay = duration_pb2.Duration(seconds=secs, nanos=round((delay_seconds - secs) * 1e9))
    info = error_details_pb2.RetryInfo(retry_delay=delay)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message, details=[detail])
    return (
        ("grpc-status-details-bin", status.SerializeToString()),
        ("google.rpc.retryinfo-bin", info.SerializeToString()),
    )


SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
#: grpc says only "Failed to bind"; with SO_REUSEPORT off, that is nearly always this.
_IN_USE = "is another process (another coeffd?) listening on it?"


class _Undecodable:
    """Stands for a body that is not a request, or one refused for crossing a limit
    (grpc treats a ``None`` request as an internal deserialization failure, so a marker
    object is needed). ``limit`` is the limit's label, ``""`` for undecodable bytes."""

    __slots__ = ("limit", "reason", "size")

    def __init__(self, reason: str, size: int, limit: str = "") -> None:
        self.reason = reason
        self.size = size
        self.limit = limit


def _deserializer(limits: RequestLimits) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        over = check_request(data, limits)
        if over is not None:
            return _Undecodable(str(over), len(data), over.limit)
        # upb checks the bytes; the decoder reads them (fastproto.parse_request)
        try:
            return parse_request(data)
        except DecodeError as e:
            return _Undecodable(f"invalid protobuf: {e}", len(data))

    return parse


def _still_active(context: Any) -> bool:
    """Whether the call lives on after its message stream ended without a message.

    grpc ends the stream of a refused message before it marks the call cancelled, so
    give that a moment (a real client always sends its one message: this path is only
    taken by refused messages and broken clients)."""
    for _ in range(20):
        if not context.is_active():
            return False
        time.sleep(0.005)
    return True


def _serialize(resp: trace_service_pb2.ExportTraceServiceResponse) -> bytes:
    return resp.SerializeToString()


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(
        self, ingestor: Ingestor, retry_after: float, occupancy: Occupancy, max_bytes: int
    ) -> None:
        self._ingestor = ingestor
        self._max_bytes = max_bytes
        self._occupancy = occupancy
        self._trailers = retry_trailers(retry_after, "coeffd pipeline full, retry later")

    def Export(
        self,
        requests: Iterator[Any],
        context: Any,
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        """The unary Export, served as a client-streaming handler: a unary handler is
        never called when grpc refuses the message (over ``max_message_bytes``), so it
        could not be counted; here reading the one message is ours, and so is its error.
        """
        self._occupancy.enter()
        try:
            try:
                request = next(requests)
            except (StopIteration, grpc.RpcError):
                if _still_active(context):  # the client sent no message: not an export
                    request = _Undecodable("no request message", 0)
                else:
                    # grpc refused the message: over max_message_bytes (the client already
                    # has RESOURCE_EXHAUSTED "received message larger than max"), or the
                    # client went away while sending it.
                    self._ingestor.refused(
                        "message_bytes",
                        f"message over {self._max_bytes} bytes (or the client cancelled)",
                        context.peer(),
                    )
                    return trace_service_pb2.ExportTraceServiceResponse()
            return self._export(request, context)
        finally:
            self._occupancy.exit()

    def _export(self, request: Any, context: Any) -> trace_service_pb2.ExportTraceServiceResponse:
        if isinstance(request, _Undecodable):
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            if request.limit:
                self._ingestor.refused(request.limit, request.reason, context.peer(), request.size)
                context.set_details(f"request refused: {request.reason}")
            else:
                self._ingestor.invalid(request.reason, context.peer(), request.size)
                context.set_details("request is not a valid ExportTraceServiceRequest")
            return trace_service_pb2.ExportTraceServiceResponse()
        got = self._ingestor.ingest(request, peer=context.peer())
        if got.outcome is Outcome.RETRY:
            context.set_trailing_metadata(self._trailers)
            context.set_code(grpc.StatusCode.UNAVAILABLE)
            context.set_details("coeffd pipeline full, retry later")
            return trace_service_pb2.ExportTraceServiceResponse()
        if got.outcome is Outcome.PARTIAL:
            res = got.result
            return trace_service_pb2.ExportTraceServiceResponse(
                partial_success=trace_service_pb2.ExportTracePartialSuccess(
                    rejected_spans=res.rejected_spans, error_message=res.error_message()
                )
            )
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpGrpcReceiver:
    """A grpcio server bound to ``settings.otlp_grpc.endpoint``, feeding ``host``."""

    def __init__(self, host: Host, settings: ReceiverSettings) -> None:
        cfg = settings.otlp_grpc
        self.ingestor = Ingestor.for_host(host, RECEIVER)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="coeffd-grpc"),
            interceptors=grpc_token_interceptor(RECEIVER, cfg.auth, host.auth_metrics),
            options=[
                # grpc refuses a larger message unread; Export counts it.
                ("grpc.max_receive_message_length", cfg.max_message_bytes),
                ("grpc.max_send_message_length", 4 * 1024 * 1024),
                # grpcio sets SO_REUSEPORT by default: a second daemon on the same port
                # would bind too and silently take part of the traffic.
                ("grpc.so_reuseport", 0),
                ("grpc.max_connection_idle_ms", int(cfg.idle_timeout_seconds * 1000)),
            ],
        )
        servicer = _Servicer(
            self.ingestor,
            settings.retry_after_seconds,
            host.grpc_occupancy,
            cfg.max_message_bytes,
        )
        # Registered by hand rather than with add_TraceServiceServicer_to_server so that an
        # undecodable body reaches us (counted, INVALID_ARGUMENT) instead of failing in
        # grpc's deserializer with an uncounted INTERNAL.
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {
                        # Client-streaming on our side, unary on the wire (the framing is
                        # the same): see _Servicer.Export.
                        "Export": grpc.stream_unary_rpc_method_handler(
                            servicer.Export,
                            request_deserializer=_deserializer(settings.limits),
                            response_serializer=_serialize,
                        )
                    },
                ),
            )
        )
        address, port = parse_endpoint(cfg.endpoint)
        target = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        try:
            creds = grpc_server_credentials(cfg.tls)
            if creds is None:
                bound = self._server.add_insecure_port(target)
            else:
                bound = self._server.add_secure_port(target, creds)
        except RuntimeError as e:  # grpcio ≥1.60 raises instead of returning 0
            raise OSError(f"cannot bind OTLP/gRPC receiver to {target}: {_IN_USE} ({e})") from None
        if not bound:
            raise OSError(f"cannot bind OTLP/gRPC receiver to {target}: {_IN_USE}")
        self.port: int = bound

    def start(self) -> None:
        """Start serving."""
        self._server.start()

    def stop(self, grace: float = 5.0) -> None:
        """Stop accepting; let in-flight calls finish for up to ``grace`` seconds."""
        self._server.stop(grace).wait(grace + 1.0)
