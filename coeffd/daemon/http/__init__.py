"""The daemon's HTTP server and router (``/metrics``, ``/healthz``, ``/readyz``, API)."""

from coeffd.daemon.http.server import Handler, HttpServer, Request, Response, Router

__all__ = ["Handler", "HttpServer", "Request", "Response", "Router"]
