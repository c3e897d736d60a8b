"""``GET /`` answers a page of links, as exporters do (issue 33, item 14); over real HTTP."""

from __future__ import annotations

import re
import urllib.request

from coeffd.daemon.app import App
from coeffd.daemon.settings import Settings


def test_root_is_a_page_of_links_that_answer() -> None:
    settings = Settings()
    settings.http.endpoint = "127.0.0.1:0"
    settings.receivers.otlp_grpc.enabled = False
    settings.receivers.otlp_http.enabled = False
    with App(settings) as app:
        base = f"http://127.0.0.1:{app.http_port}"
        with urllib.request.urlopen(base + "/", timeout=10) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/html")
            page = resp.read().decode()
        links = re.findall(r'href="([^"]+)"', page)
        assert {"/metrics", "/healthz", "/readyz", "/v1/configurations"} <= set(links)
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            assert resp.status == 200
