"""The :class:`Source` of a telemetry stream from its resource attributes: one place.

Every receiver (OTLP/gRPC, OTLP/HTTP, replay, the ZMQ KV stream, KV JSON lines) names
its streams with this id, and the joiner pairs an engine's KV transfers with its spans
by it, so the hash must be computed exactly one way.

The id is a short hash of the sorted attributes: stable across restarts of an identically
configured process, whatever the attributes' order.

>>> a = source_from_attributes({"service.name": "vllm", "coeffd.tp": 2})
>>> b = source_from_attributes([("coeffd.tp", 2), ("service.name", "vllm")])
>>> a == b, a.id
(True, 'a6fcde3d4d8e')
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

from coeffd.records.events import AttrValue, Source

__all__ = ["source_from_attributes"]


def source_from_attributes(
    attributes: Mapping[str, AttrValue] | Iterable[tuple[str, AttrValue]],
) -> Source:
    """The :class:`Source` of a stream with these resource attributes.

    A mapping or (key, value) pairs; pairs may repeat a key (OTLP forbids it, a sender may
    still do it): such values are ordered by type, then value, so that a key given once
    as a number and once as text is hashed, not a ``TypeError``.
    """
    pairs = attributes.items() if isinstance(attributes, Mapping) else attributes
    attrs = tuple(sorted(pairs, key=_order))
    return Source(id=_digest(attrs), attributes=attrs)


def _order(kv: tuple[str, AttrValue]) -> tuple[str, str, AttrValue]:
    # (key, type, value): values are compared only with values of their own type
    return kv[0], type(kv[1]).__name__, kv[1]


def _digest(attrs: tuple[tuple[str, AttrValue], ...]) -> str:
    # The JSON text of the pairs, as ``json.dumps(attrs, separators=(",", ":"))`` spells
    # it (ids persist in snapshots and checkpoints: the spelling must not change).
    return hashlib.blake2b(
        json.dumps(attrs, separators=(",", ":")).encode(), digest_size=6
    ).hexdigest()
