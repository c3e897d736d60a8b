"""/metrics like other exporters (issue 19), read by a real HTTP scrape parsed with
prometheus-client's parser: build info, the process collector, no ``_created`` series,
names beside ids (``coeffd_configuration_info``), and ``http.error_histograms`` sizing the
per-configuration series."""

from __future__ import annotations

import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.commands.replay import replay_settings, run_replay
from daemon.commands.serve import build_app
from daemon.learning import LearningConsumer
from daemon.publish.snapshot import coeffd_version
from daemon.settings import load_settings
from simfleet import SampleRates, run


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("traces") / "fleet.jsonl"
    with path.open("wb") as out:
        run("fleet", 20, 5, rates=SampleRates(1.0, 1.0, 0.02, 100), trace_out=out, drain_s=5)
    return path


def _scrape(traces: Path, tmp: Path, histograms: str) -> tuple[list[Any], list[str]]:
    settings = load_settings(
        overrides={
            "http": {"endpoint": "127.0.0.1:0", "error_histograms": histograms},
            "receivers": {"otlp_grpc": {"enabled": False}, "otlp_http": {"enabled": False}},
            "publish": {"snapshot_dir": str(tmp / "snaps")},
            "state": {"state_dir": ""},
            "log": {"level": "warning"},
        },
        environ={},
    )
    app = build_app(replay_settings(settings, serve=True), live=False)
    app.start()
    try:
        run_replay(app, [str(traces)], show_progress=False)
        assert isinstance(app.consumer, LearningConsumer)
        app.consumer.publish_due(0.0, force=True)
        ids = list(app.consumer.registry.ids())
        url = f"http://127.0.0.1:{app.http_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as resp:
            text = resp.read().decode()
    finally:
        app.stop()
    return list(text_string_to_metric_families(text)), ids


@pytest.fixture(scope="module")
def scrapes(traces: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return {
        mode: _scrape(traces, tmp_path_factory.mktemp(mode), mode)
        for mode in ("full", "coarse", "off")
    }


def _samples(families: list[Any]) -> list[Any]:
    return [s for f in families for s in f.samples]


def test_build_info_process_collector_and_no_created_series(scrapes: dict[str, Any]) -> None:
    families, _ = scrapes["full"]
    samples = _samples(families)
    build = [s for s in samples if s.name == "coeffd_build_info"]
    assert len(build) == 1 and build[0].value == 1.0
    assert build[0].labels["version"] == coeffd_version()
    names = {s.name for s in samples}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names
    assert not [n for n in names if n.endswith("_created")]


def test_configuration_info_names_every_id(scrapes: dict[str, Any]) -> None:
    families, ids = scrapes["full"]
    info = {
        s.labels["config"]: s for s in _samples(families) if s.name == "coeffd_configuration_info"
    }
    assert len(ids) >= 4 and set(info) == set(ids)
    for s in info.values():
        assert s.value == 1.0
        assert s.labels["model"] and s.labels["gpu"] and int(s.labels["tp"]) >= 1


def _per_config(families: list[Any], ids: list[str]) -> Counter[str]:
    return Counter(s.labels["config"] for s in _samples(families) if s.labels.get("config") in ids)


def test_error_histograms_setting_sizes_the_series_per_configuration(
    scrapes: dict[str, Any],
) -> None:
    counts = {mode: _per_config(*scrapes[mode]) for mode in scrapes}
    ids = scrapes["full"][1]
    for cid in ids:
        assert counts["full"][cid] > counts["coarse"][cid] > counts["off"][cid] > 0
    for mode in counts:  # README "Settings" states these
        print(mode, "series per configuration: max", max(counts[mode].values()))
    off = {s.name for s in _samples(scrapes["off"][0])}
    assert not [n for n in off if n.startswith("coeffd_prediction_relative_error")]
    # coarse: 4 finite buckets + Inf per histogram
    coarse = [
        s
        for s in _samples(scrapes["coarse"][0])
        if s.name == "coeffd_prediction_relative_error_bucket"
    ]
    per_child = Counter(
        tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in coarse
    )
    assert set(per_child.values()) == {5}
