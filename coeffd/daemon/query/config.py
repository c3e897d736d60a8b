"""Settings of the query tier (``[query]``, ``coeffd serve --mode query --peers ...``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from coeffd.daemon.query.peers import PeerClientSettings, parse_peers

__all__ = ["QuerySettings"]


class QuerySettings(BaseModel):
    """The query tier (``[query]``): which peers, how often, how long a lost one stays."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    #: Comma-separated base URLs and/or ``dns+HOST:PORT`` entries (``--peers``).
    peers: str = ""
    #: Scheme of the addresses a ``dns+`` entry resolves to (``https`` when peers serve TLS).
    dns_scheme: str = Field(default="http", pattern="^https?$")
    refresh_interval_seconds: float = Field(default=10.0, gt=0.0, le=3600.0)
    #: How long a peer that stopped answering keeps its last statistics (marked stale).
    peer_ttl_seconds: float = Field(default=3600.0, ge=0.0, le=30 * 86_400.0)
    #: Peers asked at once.
    concurrency: int = Field(default=8, ge=1, le=256)
    client: PeerClientSettings = Field(default_factory=PeerClientSettings)
    #: Every instance (not only the query tier): how often it rebuilds its own
    #: ``/v1/statistics`` document for query tiers to read.
    statistics_interval_seconds: float = Field(default=5.0, gt=0.0, le=3600.0)

    @field_validator("peers")
    @classmethod
    def _peers(cls, v: str) -> str:
        parse_peers(v)  # a bad entry stops start-up with the key named
        return v
