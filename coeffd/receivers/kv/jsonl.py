"""Replay of KV-event recordings (JSON lines), e.g. those ``simfleet`` writes.

One line per batch: ``{"source": {resource attrs}, "topic": str, "seq": int,
"payload": <base64 of the exact msgpack frame 2>}`` (``simfleet.kv.KVJsonlWriter``).
``payload`` may also be the decoded batch itself as JSON (``[ts, events, dp_rank, ...]``,
array or map events; hashes then can only be ints). Each line goes through the same
``parse_batch``/``batch_records`` as live ZMQ messages, so replay and live decoding can't
diverge. Bad lines are counted in ``counts`` (``bad_line`` or the message-level reason) and
skipped.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from coeffd.receivers.kv.decode import (
    KVDecodeError,
    KVMessage,
    batch_records,
    parse_batch,
    parse_payload,
)
from coeffd.receivers.source import source_from_attributes
from coeffd.records.events import KVRecord, Source

BAD_LINE = "bad_line"


def _message(obj: Any, counts: Counter[str]) -> KVMessage:
    if not isinstance(obj, dict) or not isinstance(obj.get("seq"), int) or "payload" not in obj:
        raise KVDecodeError(BAD_LINE, "expected an object with seq and payload")
    topic = obj.get("topic", "")
    if not isinstance(topic, str):
        raise KVDecodeError(BAD_LINE, "topic is not a string")
    payload = obj["payload"]
    if isinstance(payload, str):
        try:
            raw = base64.b64decode(payload, validate=True)
        except binascii.Error as exc:
            raise KVDecodeError(BAD_LINE, "payload is not base64") from exc
        batch = parse_payload(raw, counts)
    else:
        batch = parse_batch(payload, counts)
    return KVMessage(topic, obj["seq"], batch)


def iter_kv_jsonl(
    lines: Iterable[str], counts: Counter[str] | None = None, default_source: Source | None = None
) -> Iterator[tuple[KVMessage, list[KVRecord]]]:
    """Yield ``(message, records)`` per good line; skipped lines are counted by reason."""
    if counts is None:
        counts = Counter()
    sources: dict[str, Source] = {}
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            msg = _message(obj, counts)
        except json.JSONDecodeError:
            counts[BAD_LINE] += 1
            continue
        except KVDecodeError as exc:
            counts[exc.reason] += 1
            continue
        attrs = obj.get("source")
        if isinstance(attrs, dict) and attrs:
            key = json.dumps(attrs, sort_keys=True)
            source = sources.get(key)
            if source is None:
                source = sources[key] = source_from_attributes(attrs)
        else:
            source = default_source or source_from_attributes({"kv.file": "replay"})
        yield msg, batch_records(msg.batch, source, msg.topic, msg.seq)


def read_kv_jsonl(
    path: str | os.PathLike[str] | IO[str], counts: Counter[str] | None = None
) -> Iterator[list[KVRecord]]:
    """Records per batch from a KV JSON-lines file (path or open text file)."""
    if isinstance(path, str | os.PathLike):
        with Path(path).open(encoding="utf-8") as fh:
            for _msg, records in iter_kv_jsonl(fh, counts):
                yield records
    else:
        for _msg, records in iter_kv_jsonl(path, counts):
            yield records
