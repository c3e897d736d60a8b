"""coeffd: learns BLIS latency-model coefficients online from live vLLM telemetry.

Rooms, arrows pointing down only (see CONTRIBUTING.md; tests/test_rooms.py checks)::

    coeffd.daemon      wiring, settings, load control, publishing, HTTP API, CLI
      ├── coeffd.receivers   OTLP gRPC/HTTP, ZMQ KV, replay, the joiner
      ├── coeffd.learners    features, RLS learners, registry, fleet model
      └── coeffd.simfleet    the synthetic vLLM fleet
            └── coeffd.records   the records they all share
                coeffd.base      listener and logging plumbing (HTTP server, TLS, tokens)
"""
