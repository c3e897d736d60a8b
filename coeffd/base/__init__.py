"""coeffd: base — plumbing with no telemetry or coefficient knowledge, shared by the
receivers and the daemon: the small HTTP server (:mod:`coeffd.base.http`), TLS and
bearer-token guards of every HTTP and gRPC listener (:mod:`coeffd.base.security`; the ZMQ
KV stream has none), ``HOST:PORT``
endpoints (:mod:`coeffd.base.endpoint`) and the rate limiter of recurring log lines
(:mod:`coeffd.base.ratelimit`). It imports nothing else of coeffd (``tests/test_rooms.py``).
"""
