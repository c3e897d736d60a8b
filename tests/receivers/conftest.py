"""Fixtures: a real App (real gRPC server, real HTTP servers) on free local ports."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from coeffd.daemon.app import App
from coeffd.daemon.pipeline import CountingConsumer
from coeffd.daemon.settings import Settings


def make_settings(**pipeline: Any) -> Settings:
    return Settings.model_validate(
        {
            "receivers": {
                "otlp_grpc": {"endpoint": "127.0.0.1:0"},
                "otlp_http": {"endpoint": "127.0.0.1:0"},
                "retry_after_seconds": 0.2,
            },
            "http": {"endpoint": "127.0.0.1:0"},
            "pipeline": {"drain_timeout_seconds": 5.0, **pipeline},
            "log": {"rate_limit_seconds": 0.0},
        }
    )


@pytest.fixture
def app() -> Iterator[App]:
    a = App(make_settings(), consumer=CountingConsumer.keeping())
    a.start()
    yield a
    a.stop()


def scrape(app: App) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics over HTTP and parse it: {(sample name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{app.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
