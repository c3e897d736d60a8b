"""Metrics by the book (issue 33, item 13), on the exposition of a freshly built daemon
parsed with prometheus-client's parser: unitless ratios end in ``_ratio``, durations in
``_seconds``, counters in ``_total``; labelled counters whose label values are known
exist at 0 before their first event (a dashboard shows 0, not "No data"); the KV counters
have one series per subscriber, not per engine; the dashboard and the alerts use only
names the daemon exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coeffd.daemon.assemble import build_app
from coeffd.daemon.learning.metrics import (
    UNCONFIGURED_REASONS,
    ServeMetrics,
    coefficient_unit,
    describe_configuration,
)
from coeffd.daemon.settings import load_settings
from coeffd.learners.features.basis import TERM_NAMES
from coeffd.learners.features.config import ServingConfig

REPO = Path(__file__).resolve().parents[2]
#: Help text saying the value is a unitless ratio.
RATIO_WORDS = re.compile(
    r"\b(ratio|share|fraction|error|mape|relative)\b|/ measured", re.IGNORECASE
)
#: Families whose ``unit`` label says what each series is measured in.
WITH_UNIT_LABEL = {"coeffd_coefficient_value"}
#: Help text saying the value is a time.
TIME_WORDS = re.compile(r"^(time|wall time)\b|\bseconds\b", re.IGNORECASE)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The exposition of a daemon started as `serve` starts it (KV subscriber included),
    before any telemetry."""
    tmp = tmp_path_factory.mktemp("names")
    settings = load_settings(
        overrides={
            "http": {"endpoint": "127.0.0.1:0"},
            "receivers": {
                "otlp_grpc": {"endpoint": "127.0.0.1:0"},
                "otlp_http": {"endpoint": "127.0.0.1:0"},
            },
            "kv": {"endpoints": ["tcp://127.0.0.1:0"], "bind": True},
            "publish": {"snapshot_dir": str(tmp / "snaps")},
            "state": {"state_dir": str(tmp / "state")},
            "log": {"level": "warning"},
        },
        environ={},
    )
    app = build_app(settings).start()  # the KV subscribers' families appear at start
    try:
        text = generate_latest(app.registry).decode()
    finally:
        app.stop()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _coeffd(families: dict[str, Any]) -> list[Any]:
    return [f for name, f in families.items() if name.startswith("coeffd_")]


def test_unitless_gauges_and_histograms_end_in_ratio(families: dict[str, Any]) -> None:
    wrong = [
        f.name
        for f in _coeffd(families)
        if f.type in ("gauge", "histogram")
        and RATIO_WORDS.search(f.documentation)
        and not f.name.endswith("_ratio")
        and f.name not in WITH_UNIT_LABEL
    ]
    assert not wrong, f"unitless ratios without _ratio: {wrong}"
    # the families the issue named, under their new names
    for name in ("coeffd_prediction_mape_ratio", "coeffd_fleet_loco_error_ratio"):
        assert name in families, name
    assert "coeffd_engine_sample_ratio" in families
    assert "coeffd_prediction_relative_error_ratio" in families


def test_times_end_in_seconds_and_counters_in_total(families: dict[str, Any]) -> None:
    for f in _coeffd(families):
        if f.type in ("gauge", "histogram") and TIME_WORDS.search(f.documentation):
            assert f.name.endswith("_seconds"), f.name
        if f.type == "gauge":
            assert not f.name.endswith("_total"), f.name
        for sample in f.samples:
            if f.type == "counter":
                assert sample.name.endswith("_total"), sample.name
        # base units only: no milli/micro in a name (coefficients carry a unit label)
        assert not re.search(r"_(ms|us|micro\w*|milli\w*)(_|$)", f.name), f.name


def test_coefficients_say_their_unit() -> None:
    registry = CollectorRegistry()
    metrics = ServeMetrics(registry)
    for i in range(len(TERM_NAMES)):
        metrics.coefficient.labels("c", "beta", str(i)).set(1.0)
    metrics.coefficient.labels("c", "alpha", "0").set(1.0)
    units = {
        (s.labels["vector"], s.labels["index"]): s.labels["unit"]
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        if f.name == "coeffd_coefficient_value"
        for s in f.samples
    }
    assert units[("alpha", "0")] == "microseconds"
    assert units[("beta", str(TERM_NAMES.index("T_pf_compute")))] == "ratio"
    assert units[("beta", str(TERM_NAMES.index("one")))] == "microseconds"
    assert {coefficient_unit("beta", i) for i in range(len(TERM_NAMES))} == {
        "ratio",
        "microseconds",
    }


def _series(families: dict[str, Any], name: str) -> list[dict[str, str]]:
    return [s.labels for s in families[name].samples if s.name.endswith("_total")]


def test_labelled_counters_exist_before_their_first_event(families: dict[str, Any]) -> None:
    reasons = {s["reason"] for s in _series(families, "coeffd_observations_unconfigured")}
    assert reasons == set(UNCONFIGURED_REASONS)
    assert len(_series(families, "coeffd_checkpoint_unusable")) == 6
    assert {s["thread"] for s in _series(families, "coeffd_thread_restarts")} >= {"pipeline"}
    rejected = {(s["receiver"], s["reason"]) for s in _series(families, "coeffd_events_rejected")}
    assert {("otlp_grpc", "undecodable"), ("otlp_http", "undecodable")} <= rejected
    assert ("kv", "duplicate") in rejected
    for name in ("coeffd_kv_batches", "coeffd_kv_sequence_gaps", "coeffd_kv_sequence_jumps"):
        assert [set(s) for s in _series(families, name)] == [{"endpoint"}], name


def test_a_described_configuration_has_its_counters_at_zero() -> None:
    registry = CollectorRegistry()
    metrics = ServeMetrics(registry)
    cfg = ServingConfig(model="llama-3.1-8b-instruct", gpu="H100", tp=1)
    describe_configuration(metrics, cfg)
    value = registry.get_sample_value
    assert value("coeffd_drift_detections_total", {"config": cfg.id, "target": "step_period"}) == 0
    assert value("coeffd_snapshot_refused_total", {"config": cfg.id}) == 0
    assert value("coeffd_snapshot_write_failures_total", {"config": cfg.id}) == 0


def _referenced() -> set[str]:
    dashboard = (REPO / "deploy" / "grafana" / "coeffd-dashboard.json").read_text()
    exprs = re.findall(r'"(?:expr|query|definition)": "([^"\\]*(?:\\.[^"\\]*)*)"', dashboard)
    json.loads(dashboard)  # well-formed
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "coeffd-alerts.yaml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    return {m for e in exprs for m in re.findall(r"\bcoeffd_[a-z0-9_]+\b", e)}


def test_dashboard_and_alerts_use_only_exported_names(families: dict[str, Any]) -> None:
    exported: set[str] = set()
    for f in _coeffd(families):
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",),
            "info": ("_info",),
        }.get(f.type, ("",))
        exported |= {f.name + s for s in suffixes}
    # the query tier's own families come from its view (tests/deploy/test_deploy_metrics_live.py)
    used = {n for n in _referenced() if not n.startswith("coeffd_query_")}
    assert used, "no coeffd_ names found in the dashboard and alerts"
    assert not used - exported, sorted(used - exported)
