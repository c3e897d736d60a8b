"""ZMQ KV-event receiver: msgpack decode (fork positional and upstream map forms),
SUB socket with sequence tracking, and JSON-lines replay.

Public API: ``decode_kv_message``, ``KVSubscriber``, ``KVMetrics``, ``SequenceTracker``,
``read_kv_jsonl``/``iter_kv_jsonl``.
"""

from coeffd.receivers.kv.decode import decode_kv_message, parse_message, parse_payload
from coeffd.receivers.kv.jsonl import iter_kv_jsonl, read_kv_jsonl
from coeffd.receivers.kv.sequence import SequenceTracker
from coeffd.receivers.kv.subscriber import KVMetrics, KVSubscriber

__all__ = [
    "KVMetrics",
    "KVSubscriber",
    "SequenceTracker",
    "decode_kv_message",
    "iter_kv_jsonl",
    "parse_message",
    "parse_payload",
    "read_kv_jsonl",
]
