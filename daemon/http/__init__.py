"""The daemon's HTTP server and router (``/metrics``, ``/healthz``, ``/readyz``, API)."""

from daemon.http.server import Handler, HttpServer, Request, Response, Router

__all__ = ["Handler", "HttpServer", "Request", "Response", "Router"]
