"""Replay OTLP/JSON files as the OpenTelemetry Collector's file exporter writes them.

One ``ExportTraceServiceRequest`` per line; a line may hold several concatenated JSON
objects (collectors merge requests, some writers omit newlines); ``.gz`` files (detected
by their magic bytes, not the name) are decompressed on the fly. A line that is not
JSON, or JSON that is not a request, is counted and skipped.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import orjson
import structlog

from receivers.otlp.decode import JsonDecodeError, count_kinds, parse_json_request
from receivers.otlp.ingest import Ingestor, Outcome

__all__ = ["RECEIVER", "ReplaySummary", "iter_json_objects", "open_trace_file", "replay_files"]

log = structlog.get_logger(__name__)

RECEIVER = "replay"
_DECODER = json.JSONDecoder()


@dataclass(slots=True)
class ReplaySummary:
    """What a replay did."""

    files: int = 0
    requests: int = 0
    bad_lines: int = 0
    records: int = 0
    records_by_kind: Counter[str] = field(default_factory=Counter)
    rejected: int = 0
    rejected_by_reason: Counter[str] = field(default_factory=Counter)
    ignored: int = 0

    def lines(self) -> list[str]:
        """Human-readable summary lines."""
        out = [
            f"files: {self.files}  requests: {self.requests}  bad lines: {self.bad_lines}",
            f"records: {self.records}  rejected: {self.rejected}  ignored: {self.ignored}",
        ]
        out += [f"  {k}: {n}" for k, n in sorted(self.records_by_kind.items())]
        if self.rejected_by_reason:
            out.append("rejected by reason:")
            out += [f"  {k}: {n}" for k, n in self.rejected_by_reason.most_common()]
        return out


def open_trace_file(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open ``path`` for binary reading, transparently gunzipping gzip content."""
    f = open(path, "rb")  # noqa: SIM115 (returned to the caller)
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    return f


def iter_json_objects(line: bytes) -> Iterator[Any]:
    """Yield every JSON value on ``line`` (one, or several concatenated).

    >>> list(iter_json_objects(b'{"a":1}{"b":2} {"c":3}'))
    [{'a': 1}, {'b': 2}, {'c': 3}]
    """
    try:
        yield orjson.loads(line)  # the common case, in C
        return
    except orjson.JSONDecodeError:
        pass
    text = line.decode("utf-8")
    pos, end = 0, len(text)
    while pos < end:
        while pos < end and text[pos].isspace():
            pos += 1
        if pos >= end:
            return
        obj, pos = _DECODER.raw_decode(text, pos)
        yield obj


def replay_files(
    paths: Iterable[str | os.PathLike[str]],
    ingestor: Ingestor,
    progress: Callable[[int], None] | None = None,
) -> ReplaySummary:
    """Feed every request of every file through ``ingestor`` (waiting when full).

    ``progress(n)`` is called with the number of raw bytes consumed per line.
    """
    summary = ReplaySummary()
    for path in paths:
        summary.files += 1
        with open_trace_file(path) as f:
            for lineno, line in enumerate(f, 1):
                if progress is not None:
                    progress(len(line))
                if not line.strip():
                    continue
                _replay_line(line, str(path), lineno, ingestor, summary)
    return summary


def _replay_line(
    line: bytes, path: str, lineno: int, ingestor: Ingestor, summary: ReplaySummary
) -> None:
    try:
        objs = list(iter_json_objects(line))
    except (ValueError, UnicodeDecodeError) as e:
        summary.bad_lines += 1
        ingestor.invalid(f"{path}:{lineno}: invalid JSON: {e}")
        return
    for obj in objs:
        try:
            req = parse_json_request(obj)
        except JsonDecodeError as e:
            summary.bad_lines += 1
            ingestor.invalid(f"{path}:{lineno}: {e}")
            continue
        got = ingestor.ingest(req, peer=f"{path}:{lineno}", wait=True)
        if got.outcome is Outcome.RETRY:  # pipeline closed under us
            return
        res = got.result
        summary.requests += 1
        summary.records += len(res.records)
        summary.rejected += res.rejected
        summary.rejected_by_reason.update(res.reasons)
        summary.ignored += res.ignored
        summary.records_by_kind.update(count_kinds(res.records))
