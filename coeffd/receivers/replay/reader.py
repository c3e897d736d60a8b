"""Replay OTLP trace files as the OpenTelemetry Collector's file exporter writes them.

Two layouts, told apart by the file's first bytes (never its name):

* ``format: json`` without compression: one ``ExportTraceServiceRequest`` per line; a line
  may hold several concatenated JSON objects (collectors merge requests, some writers
  omit newlines). A whole file compressed with gzip or zstd (``.gz``, ``.zst``) is
  decompressed on the fly.
* ``format: proto``, or any ``compression: zstd``: each request framed by a 4-byte
  big-endian length, its bytes zstd-compressed when the exporter compresses, holding
  protobuf or JSON.

A line or frame that is not JSON, JSON that is not an object (``42``, ``[1,2]``,
``null``), or an object that is not a request is counted as bad and skipped.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import orjson
import structlog
import zstandard
from google.protobuf.message import DecodeError as ProtoDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from coeffd.receivers.otlp.decode import count_kinds
from coeffd.receivers.otlp.ingest import Ingestor, Outcome
from coeffd.receivers.otlp.jsonbody import JsonDecodeError, parse_json_request

__all__ = ["RECEIVER", "ReplaySummary", "iter_json_objects", "open_trace_file", "replay_files"]

log = structlog.get_logger(__name__)

RECEIVER = "replay"
_DECODER = json.JSONDecoder()
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Largest frame believed (the Collector's default gRPC receive limit is 4 MiB; its
#: batches stay well under this). A larger length prefix means the file is not framed.
_MAX_FRAME = 256 << 20


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
    #: The first bad line's message (shown once in the summary).
    first_bad: str | None = None

    def lines(self) -> list[str]:
        """Human-readable summary lines."""
        out = [
            f"files: {self.files}  requests: {self.requests}  bad lines: {self.bad_lines}",
            f"records: {self.records}  rejected: {self.rejected}  ignored: {self.ignored}",
        ]
        if self.first_bad is not None:
            out.insert(1, f"  first bad line: {self.first_bad}")
        out += [f"  {k}: {n}" for k, n in sorted(self.records_by_kind.items())]
        if self.rejected_by_reason:
            out.append("rejected by reason:")
            out += [f"  {k}: {n}" for k, n in self.rejected_by_reason.most_common()]
        return out


def open_trace_file(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open ``path`` for binary reading, transparently decompressing a gzip or zstd file."""
    f = open(path, "rb")  # noqa: SIM115 (returned to the caller)
    magic = f.read(4)
    f.seek(0)
    if magic[:2] == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    if magic == _ZSTD_MAGIC:
        # the zstd reader has no readline: buffer it for line iteration
        reader = zstandard.ZstdDecompressor().stream_reader(
            f, closefd=True, read_across_frames=True
        )
        return io.BufferedReader(reader)  # type: ignore[arg-type]
    return f


def is_framed(head: bytes) -> bool:
    r"""Whether a file starting with ``head`` holds length-prefixed frames (the file
    exporter's ``format: proto`` or compressed layout): JSON text never starts with a
    NUL byte, while a frame's length prefix does (below 16 MiB).

    >>> is_framed(b"\x00\x00\x01\x00\x28\xb5\x2f\xfd"), is_framed(b'{"resourceSpans"')
    (True, False)
    """
    return len(head) >= 4 and head[0] == 0 and 0 < struct.unpack(">I", head[:4])[0] <= _MAX_FRAME


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

    ``progress(n)`` is called with the number of raw bytes consumed per line or frame.
    """
    summary = ReplaySummary()
    for path in paths:
        summary.files += 1
        with open(path, "rb") as f:
            head = f.read(8)
        if is_framed(head):
            _replay_frames(str(path), ingestor, summary, progress)
            continue
        with open_trace_file(path) as f:
            for lineno, line in enumerate(f, 1):
                if progress is not None:
                    progress(len(line))
                if not line.strip():
                    continue
                _replay_line(line, str(path), lineno, ingestor, summary)
    return summary


def _replay_frames(
    path: str,
    ingestor: Ingestor,
    summary: ReplaySummary,
    progress: Callable[[int], None] | None,
) -> None:
    """Length-prefixed frames: zstd-compressed or not, protobuf or JSON."""
    unzstd = zstandard.ZstdDecompressor()
    with open(path, "rb") as f:
        index = 0
        while prefix := f.read(4):
            index += 1
            where = f"{path}:frame {index}"
            size = struct.unpack(">I", prefix)[0] if len(prefix) == 4 else -1
            data = f.read(size) if 0 <= size <= _MAX_FRAME else b""
            if progress is not None:
                progress(len(prefix) + len(data))
            if len(data) != size:
                _bad(ingestor, summary, f"{where}: truncated frame (file cut short?)")
                return  # the framing is lost: nothing after this can be read
            try:
                if data[:4] == _ZSTD_MAGIC:
                    data = unzstd.decompressobj().decompress(data)
                if data.lstrip()[:1] == b"{":
                    _replay_line(data, path, index, ingestor, summary)
                    continue
                req = ExportTraceServiceRequest()
                req.ParseFromString(data)
            except (zstandard.ZstdError, ProtoDecodeError) as e:
                _bad(ingestor, summary, f"{where}: not an OTLP request: {e}")
                continue
            if not _ingest(req, where, ingestor, summary):
                return


def _bad(ingestor: Ingestor, summary: ReplaySummary, message: str) -> None:
    summary.bad_lines += 1
    if summary.first_bad is None:
        summary.first_bad = message
    ingestor.invalid(message)


def _replay_line(
    line: bytes, path: str, lineno: int, ingestor: Ingestor, summary: ReplaySummary
) -> None:
    try:
        objs = list(iter_json_objects(line))
    except UnicodeDecodeError:
        _bad(
            ingestor,
            summary,
            f"{path}:{lineno}: not OTLP/JSON text (binary data: a protobuf file must be "
            "length-prefixed, as the Collector file exporter's format: proto writes it)",
        )
        return
    except ValueError as e:
        _bad(ingestor, summary, f"{path}:{lineno}: invalid JSON: {e}")
        return
    for obj in objs:
        if not isinstance(obj, dict):
            _bad(
                ingestor,
                summary,
                f"{path}:{lineno}: expected a JSON object (an OTLP ExportTraceServiceRequest),"
                f" got {type(obj).__name__ if obj is not None else 'null'}",
            )
            continue
        try:
            req = parse_json_request(obj)
        except JsonDecodeError as e:
            _bad(ingestor, summary, f"{path}:{lineno}: {e}")
            continue
        if not _ingest(req, f"{path}:{lineno}", ingestor, summary):
            return


def _ingest(req: Any, peer: str, ingestor: Ingestor, summary: ReplaySummary) -> bool:
    """Ingest one request and count it; False when the pipeline closed under us."""
    got = ingestor.ingest(req, peer=peer, wait=True)
    if got.outcome is Outcome.RETRY:  # pipeline closed under us
        return False
    res = got.result
    summary.requests += 1
    summary.records += len(res.records)
    summary.rejected += res.rejected
    summary.rejected_by_reason.update(res.reasons)
    summary.ignored += res.ignored
    summary.records_by_kind.update(count_kinds(res.records))
    return True
