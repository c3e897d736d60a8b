"""The receivers' own settings: the ``[receivers]`` section of the daemon's settings.

The daemon lists this section in its ``Settings`` and hands it to the receivers it
starts; a receiver reads nothing else of the daemon's settings (the OpenTelemetry
Collector's shape: a receiver knows its own config and the next consumer).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from coeffd.base.endpoint import Endpoint
from coeffd.base.security import AuthSettings, TlsSettings
from coeffd.receivers.otlp.limits import RequestLimits

__all__ = ["OtlpGrpcSettings", "OtlpHttpSettings", "ReceiverSettings"]


class _Section(BaseModel):
    """Like every settings section: unknown keys are errors, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class OtlpGrpcSettings(_Section):
    """OTLP/gRPC receiver (``TraceService/Export``)."""

    enabled: bool = True
    endpoint: Endpoint = "0.0.0.0:4317"
    #: gRPC's default is 4 MiB; a batch of 512 ``llm_core`` spans is ~1 MB and step
    #: spans can carry large snapshot events, so allow more.
    max_message_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    workers: int = Field(default=4, ge=1, le=256)
    #: Close a connection idle this long (grpc ``max_connection_idle``); exporters
    #: reconnect on their next export.
    idle_timeout_seconds: float = Field(default=300.0, gt=0.0, le=86_400.0)
    tls: TlsSettings = Field(default_factory=TlsSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)


class OtlpHttpSettings(_Section):
    """OTLP/HTTP receiver (``POST /v1/traces`` and ``POST /``)."""

    enabled: bool = True
    endpoint: Endpoint = "0.0.0.0:4318"
    #: Limit on the body, compressed and decompressed.
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024)
    #: Connections served at once (one thread each); more are answered 503 and closed.
    max_connections: int = Field(default=64, ge=1, le=10_000)
    #: Close a connection that sends nothing for this long, or whose request takes longer
    #: than this to arrive whole: a silent or trickling client must not hold a thread.
    idle_timeout_seconds: float = Field(default=60.0, gt=0.0, le=86_400.0)
    tls: TlsSettings = Field(default_factory=TlsSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)


class ReceiverSettings(_Section):
    """All receivers."""

    otlp_grpc: OtlpGrpcSettings = Field(default_factory=OtlpGrpcSettings)
    otlp_http: OtlpHttpSettings = Field(default_factory=OtlpHttpSettings)
    #: Seconds a client is told to wait before retrying when the pipeline is full.
    retry_after_seconds: float = Field(default=1.0, gt=0.0, le=60.0)
    #: Bounds on the work of one OTLP request (counts and sizes, checked before parsing).
    limits: RequestLimits = Field(default_factory=RequestLimits)
