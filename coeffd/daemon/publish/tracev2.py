"""BLIS's TraceV2 pair (header YAML + data CSV) from the requests coeffd saw (issue 31).

``blis replay --trace-header H --trace-data D`` runs recorded traffic through the simulator
and ``blis calibrate`` compares its TTFT and E2E with the recorded ones. This writes the
pair exactly as BLIS's ``sim/workload/tracev2.go`` (commit f90a1e3) reads it:

* header: the ``TraceHeader`` keys in yaml.v3's order (``trace_version: 3`` as ``blis
  observe`` writes, ``time_unit: us``, ``created_at``, ``mode: real``,
  ``warm_up_requests``, the ``server`` block: type, model, tensor_parallel,
  max_num_seqs, block_size, max_model_len — zero values omitted as ``omitempty`` does;
  BLIS decodes it with ``KnownFields(true)``, so no other key is ever written);
* data: the 27 base columns in ``traceV2Columns`` order and none of the conditional
  ones (no vLLM priority, SLO target, x-request-id, adapter or think time is known), one
  row per request, integers with ``%d`` (timestamps in integer µs), booleans as Go's
  ``FormatBool``, ``reason_ratio`` as ``FormatFloat(0, 'f', -1)`` = ``0``.

Times are µs since the first request's arrival (BLIS's simulated clock starts at 0;
``calibrate`` only uses differences). ``send_time_us`` is the arrival: the API server
saw the request arrive, there is no client send to record. ``first_chunk_time_us`` is
the first response (the first token plus its detokenisation when measured),
``last_chunk_time_us`` the departure; 0 where the request never got there, as BLIS
writes them. ``input_tokens`` and ``server_input_tokens`` are vLLM's prompt tokens.

What the trace cannot carry: prefix groups. coeffd sees token counts, not token ids, so
every prompt is written as unique (``prefix_group`` empty): ``blis replay`` simulates no
prefix-cache hits, and on a workload with shared prefixes (system prompts, multi-turn
chats) BLIS prefills tokens the real server served from cache, so the simulated TTFT is
too long there: judge coefficients on such traffic with that in mind, or on traffic
without shared prefixes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from coeffd.daemon.learning.requests import FinishedRequest

__all__ = ["COLUMNS", "ServerBlock", "data_rows", "header_yaml", "write_tracev2"]

#: ``traceV2Columns`` of BLIS's tracev2.go, in order.
COLUMNS = (
    "request_id", "client_id", "tenant_id", "slo_class", "session_id", "round_index",
    "prefix_group", "prefix_length", "streaming", "input_tokens", "output_tokens",
    "text_tokens", "image_tokens", "audio_tokens", "video_tokens", "reason_ratio",
    "model", "deadline_us", "server_input_tokens",
    "arrival_time_us", "send_time_us", "first_chunk_time_us", "last_chunk_time_us",
    "num_chunks", "status", "error_message", "finish_reason",
)  # fmt: skip

TRACE_VERSION = 3


@dataclass(frozen=True)
class ServerBlock:
    """``TraceServerConfig``: what the header says about the server (0/"" = omitted)."""

    model: str = ""
    tensor_parallel: int = 0
    max_num_seqs: int = 0
    block_size: int = 0
    max_model_len: int = 0
    type: str = "vllm"

    @classmethod
    def from_description(cls, desc: Mapping[str, Any]) -> ServerBlock:
        """From a configuration's description (``GET /v1/requests`` answers it)."""

        def num(key: str) -> int:
            v = desc.get(key)
            if v is None or isinstance(v, bool):
                return 0
            try:
                return max(0, int(v))
            except (TypeError, ValueError):
                return 0

        return cls(
            model=str(desc.get("model") or ""),
            tensor_parallel=num("tp"),
            max_num_seqs=num("max_num_seqs"),
            block_size=num("block_size"),
            max_model_len=num("max_model_len"),
        )


def _yaml_scalar(value: str) -> str:
    """A YAML string as yaml.v3 would read it back unchanged: plain when safe, else quoted.

    >>> _yaml_scalar("llama-3.1-8b-instruct"), _yaml_scalar("meta-llama/Llama-3.1-8B"), _yaml_scalar("true")
    ('llama-3.1-8b-instruct', 'meta-llama/Llama-3.1-8B', '"true"')
    """
    plain = (
        value
        and all(c.isalnum() or c in "-_./" for c in value)
        and value[0].isalpha()
        and value.lower() not in ("true", "false", "yes", "no", "on", "off", "null", "y", "n")
    )
    if plain:
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def header_yaml(server: ServerBlock, *, warm_up_requests: int = 0, created_at: str = "") -> str:
    """The header file's text (``TraceHeader`` marshalled, yaml.v3 key order).

    >>> print(header_yaml(ServerBlock("m", 1, 256, 16, 0), created_at="2026-01-01T00:00:00Z"), end="")
    trace_version: 3
    time_unit: us
    created_at: "2026-01-01T00:00:00Z"
    mode: real
    warm_up_requests: 0
    server:
        type: vllm
        model: m
        tensor_parallel: 1
        max_num_seqs: 256
        block_size: 16
    """
    if warm_up_requests < 0:
        raise ValueError(f"warm_up_requests must be >= 0, got {warm_up_requests}")
    lines = [f"trace_version: {TRACE_VERSION}", "time_unit: us"]
    if created_at:
        lines.append(f"created_at: {_yaml_scalar(created_at)}")
    lines += ["mode: real", f"warm_up_requests: {warm_up_requests}"]
    block = [
        ("type", _yaml_scalar(server.type) if server.type else ""),
        ("model", _yaml_scalar(server.model) if server.model else ""),
        ("tensor_parallel", str(server.tensor_parallel) if server.tensor_parallel else ""),
        ("max_num_seqs", str(server.max_num_seqs) if server.max_num_seqs else ""),
        ("block_size", str(server.block_size) if server.block_size else ""),
        ("max_model_len", str(server.max_model_len) if server.max_model_len else ""),
    ]
    shown = [(k, v) for k, v in block if v]
    if shown:
        lines.append("server:")
        lines += [f"    {k}: {v}" for k, v in shown]
    return "\n".join(lines) + "\n"


def _field(text: str) -> str:
    # Go's csv.Writer quotes these; nothing coeffd writes contains them.
    if any(c in text for c in ',"\r\n') or text[:1] in (" ", "\t"):
        raise ValueError(f"unexpected CSV field {text!r}")
    return text


def data_rows(requests: Sequence[FinishedRequest]) -> list[list[str]]:
    """The CSV rows (no header row), requests numbered 0… by arrival."""
    ordered = sorted(requests, key=lambda r: r.arrival_us)
    t0 = ordered[0].arrival_us if ordered else 0

    def rel(t: int) -> str:
        return str(max(0, t - t0)) if t else "0"

    rows = []
    for i, r in enumerate(ordered):
        arrival = str(r.arrival_us - t0)
        error = (r.finish_reason or "error") if r.status == "error" else ""
        rows.append(
            [
                str(i),
                "",
                "",
                "",
                "",
                "0",  # request, client, tenant, SLO, session, round
                "",
                "0",  # prefix group and length: not known (module docstring)
                "true" if r.streaming else "false",
                str(r.input_tokens),
                str(r.output_tokens),
                "0",
                "0",
                "0",
                "0",
                "0",  # text/image/audio/video tokens, reason ratio
                "",
                "0",
                str(r.input_tokens),  # model (default), deadline, server input
                arrival,
                arrival,
                rel(r.first_response_us),
                rel(r.departure_us),
                "0",  # num_chunks: not recorded
                _field(r.status),
                error,
                _field(r.finish_reason),
            ]
        )
    return rows


def write_tracev2(
    header_path: str | os.PathLike[str],
    data_path: str | os.PathLike[str],
    requests: Sequence[FinishedRequest],
    server: ServerBlock,
    *,
    warm_up_requests: int = 0,
) -> int:
    """Write the pair; returns the number of requests written."""
    rows = data_rows(requests)
    created = ""
    if requests:
        first = min(r.arrival_us for r in requests)
        created = datetime.fromtimestamp(first / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    text = header_yaml(server, warm_up_requests=warm_up_requests, created_at=created)
    Path(header_path).write_text(text, encoding="utf-8")
    lines = [",".join(COLUMNS)] + [",".join(row) for row in rows]
    Path(data_path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(rows)
