"""``/readyz`` is the sum of named readiness checks; each failing one is named in the 503."""

from __future__ import annotations

import functools
import urllib.error
import urllib.request

from coeffd.daemon.app import App
from coeffd.daemon.settings import Settings


def _ready(app: App, query: str = "") -> tuple[int, str]:
    url = f"http://127.0.0.1:{app.http_port}/readyz{query}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _settings() -> Settings:
    return Settings(
        http={"endpoint": "127.0.0.1:0"},
        receivers={"otlp_grpc": {"enabled": False}, "otlp_http": {"enabled": False}},
    )


def test_named_checks_decide_readiness() -> None:
    problems: dict[str, str | None] = {"disk": None}

    def broken() -> str | None:
        raise RuntimeError("check itself is buggy")

    with App(_settings()) as app:
        app.add_readiness_check("disk", lambda: problems["disk"])
        assert _ready(app) == (200, "ready\n")
        problems["disk"] = "state dir not writable"
        status, body = _ready(app)
        assert status == 503 and body == "disk: state dir not writable\n"
        app.add_readiness_check("buggy", broken)
        status, body = _ready(app)
        assert status == 503
        assert body.splitlines()[0] == "disk: state dir not writable"
        assert body.splitlines()[1].startswith("buggy: check failed: RuntimeError(")
        # a probe may leave checks out (kube-apiserver's ?exclude=)
        assert _ready(app, "?exclude=buggy")[1] == "disk: state dir not writable\n"
        assert _ready(app, "?exclude=buggy,disk") == (200, "ready\n")
        assert _ready(app, "?exclude=buggy&exclude=disk") == (200, "ready\n")
        problems["disk"] = None
        del app.readiness["buggy"]
        assert _ready(app) == (200, "ready\n")


def test_stopping_is_not_ready() -> None:
    with App(_settings()) as app:
        app.ready = False  # what stop() sets first
        assert _ready(app) == (503, "not ready\n")


def test_readiness_text_names_no_files() -> None:
    """``/readyz`` is public and answers the same for everyone: a reason holding a file
    path (an OSError of a checkpoint write) is told without it; URLs stay (issue 32)."""
    reasons = {
        "checkpoints": "last checkpoint write failed: [Errno 30] Read-only file system: "
        "'/var/lib/coeffd/state/checkpoint.bin.tmp'",
        "peers": "no answer from https://peer-0:9464/v1/statistics",
    }
    with App(_settings()) as app:
        for name in reasons:
            app.add_readiness_check(name, functools.partial(reasons.get, name))
        status, body = _ready(app)
    assert status == 503 and "/var/lib" not in body
    assert body.splitlines() == [
        "checkpoints: last checkpoint write failed: [Errno 30] Read-only file system: '<path>'",
        "peers: no answer from https://peer-0:9464/v1/statistics",
    ]
