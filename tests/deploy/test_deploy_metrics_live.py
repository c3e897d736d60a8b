"""The Grafana dashboard, the alert rules and the collector config use only metric names
the daemon really exports.

A real daemon is started (``python -m coeffd serve``) with the config.toml the chart
renders (the fleet ConfigMap, ports moved to free localhost ports), fed a short
``coeffd simfleet`` run (OTLP/gRPC spans + ZMQ KV events) when that command exists, and scraped over HTTP;
the scrape is parsed with ``prometheus_client.parser``.

Two paths (the test reports which one ran, as a warning and a junit property):

* **live-only** — once the scrape carries the per-configuration learned families
  (coefficients, prediction error, snapshots), every referenced name must be live.
* **live + contract** — before the learner/publisher are wired into ``serve``, names the
  scrape lacks must at least be in CONTRIBUTING.md's contract table, and every name the
  scrape has must be exported with the contract's type.

A second daemon runs the query tier's config.toml (``mode = "query"``) the chart renders for
the same values, with the fed daemon as its peer: its scrape (the ``coeffd_query_*``
families) is checked with the first one's, and it must serve the fed daemon's
configurations.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import (
    CHART,
    DEPLOY,
    REPO,
    config_toml,
    contract_metrics,
    dashboard_exprs,
    manifests,
    referenced_metrics,
    render,
    sample_names,
)
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow  # run first: see tests/conftest.py

#: Families that exist only once a configuration has been learned and published.
LEARNED = {"coeffd_coefficient_value", "coeffd_prediction_mape_ratio"}
#: Families the receivers/pipeline export from start-up, whatever else is wired.
BASIC = {"coeffd_events_received_total", "coeffd_receiver_requests_total", "coeffd_queue_depth"}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _wait_for(
    what: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], limit: float
) -> bool:
    """Poll ``check`` until true; a start-up wait, never a timing assertion."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited ({proc.returncode}) while waiting for {what}")
        try:
            if check():
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("COEFFD_", "OTEL_"))}


def _cli_has(command: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "coeffd", "--help"],
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return command in out.stdout


class Scrape:
    def __init__(self, text: str) -> None:
        families = list(text_string_to_metric_families(text))
        self.families = {f.name: f.type for f in families}
        self.samples: set[str] = set()
        for name, kind in self.families.items():
            self.samples |= sample_names(name, kind)
        #: series name → label names seen on it
        self.labels: dict[str, set[str]] = {}
        for f in families:
            for sample in f.samples:
                self.labels.setdefault(sample.name, set()).update(sample.labels)

    def absorb(self, other: Scrape) -> None:
        """Add another process's scrape (the query tier's)."""
        self.families.update(other.families)
        self.samples |= other.samples
        for name, labels in other.labels.items():
            self.labels.setdefault(name, set()).update(labels)


def _events_received(base: str) -> float:
    return sum(
        s.value
        for f in text_string_to_metric_families(_get(base + "/metrics")[1])
        if f.name == "coeffd_events_received"
        for s in f.samples
        if s.name == "coeffd_events_received_total"
    )


def _simfleet(grpc: int, kv: int | None = None) -> None:
    """A short simulated vLLM run (journey + step spans over OTLP/gRPC, KV events)."""
    args = [sys.executable, "-m", "coeffd", "simfleet", "--scenario", "steady"]
    args += ["--duration", "20", "--otlp-endpoint", f"127.0.0.1:{grpc}"]
    if kv is not None:
        args += ["--kv-endpoint", f"tcp://127.0.0.1:{kv}"]
    subprocess.run(args, cwd=REPO, env=_clean_env(), check=True, capture_output=True, timeout=240)


#: The sidecar container's probe (templates/_sidecar.tpl; rendered by the vLLM chart that
#: includes it, not by this chart in sidecar mode, which renders only the ConfigMap).
SIDECAR_READY = "/readyz?exclude=kv,checkpoints,snapshots"


def _readiness_path(docs: list[dict[str, Any]]) -> str:
    """The readiness probe path of the coeffd container the chart renders."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            probe = node.get("readinessProbe")
            # the learners' container (the query tier's is "coeffd-query")
            if node.get("name") == "coeffd" and isinstance(probe, dict):
                found.append(probe["httpGet"]["path"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(docs)
    return found[0] if found else SIDECAR_READY


@contextlib.contextmanager
def _daemon(
    values: dict[str, Any], work: Path, of: str | None = None, http: str | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`coeffd serve` on the config.toml the chart renders for ``values`` (a healthy,
    ready daemon), stopped with SIGTERM afterwards. ``of="query"``: the query tier's
    config.toml, its API moved to ``http`` (the chart gives it the learners' endpoint)."""
    settings = values.setdefault("settings", {})
    # the chart's absolute /var/lib/coeffd paths are a volume in a pod; here, a tmp dir
    settings["publish"] = {"snapshot_dir": str(work / "snapshots")}
    settings["state"] = {"state_dir": str(work / "state")}
    endpoint = http or settings["http"]["endpoint"]
    cfg = work / "config.toml"
    docs = manifests(render(CHART, values))
    cfg.write_text(config_toml(docs, of))
    # what the chart's probe asks (a sidecar's excludes some; the query tier's: /readyz)
    ready = "/readyz" if of == "query" else _readiness_path(docs)
    args = [sys.executable, "-m", "coeffd", "serve", "--config", str(cfg)]
    if http:
        args += ["--http-endpoint", http]
    with cfg.with_suffix(".log").open("wb") as log:
        proc = subprocess.Popen(
            args, cwd=REPO, env=_clean_env(), stdout=log, stderr=subprocess.STDOUT
        )
        base = f"http://{endpoint}"
        try:
            assert _wait_for("/healthz", lambda: _get(base + "/healthz")[0] == 200, proc, 60), (
                "daemon never became healthy"
            )
            assert _wait_for(ready, lambda: _get(base + ready)[0] == 200, proc, 60)
            yield proc, base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Fleet:
    """The fed daemon of the chart's fleet config.toml."""

    base: str
    path: str  # which check path the metric-name test runs
    values: dict[str, Any]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    grpc, http_otlp, http, kv = _free_ports(4)
    values: dict[str, Any] = {
        "settings": {
            "log": {"format": "json"},
            "receivers": {
                "otlp_grpc": {"endpoint": f"127.0.0.1:{grpc}"},
                "otlp_http": {"endpoint": f"127.0.0.1:{http_otlp}"},
            },
            "http": {"endpoint": f"127.0.0.1:{http}"},
            # fan-in: coeffd binds, simfleet's engines connect (vLLM's non-wildcard rule)
            "kv": {"endpoints": [f"tcp://127.0.0.1:{kv}"], "bind": True},
        }
    }
    with _daemon(values, tmp_path_factory.mktemp("fleet")) as (proc, base):
        path = "live + contract (no simfleet command)"
        if _cli_has("simfleet"):
            _simfleet(grpc, kv)
            assert _wait_for("ingest", lambda: _events_received(base) > 0, proc, 30), (
                "simfleet's spans never showed up in coeffd_events_received_total"
            )
            # learned families appear after the consumer's tick publishes
            learned = _wait_for(
                "learned families",
                lambda: set(Scrape(_get(base + "/metrics")[1]).families) >= LEARNED,
                proc,
                10,
            )
            path = "live-only (simfleet fed)" if learned else "live + contract (simfleet fed)"
        yield Fleet(base, path, values)


@pytest.fixture(scope="module")
def query_tier(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`coeffd serve` on the query tier's config.toml the chart renders for the same
    values, asking the fleet daemon (its one peer; in a cluster dns+ the headless
    Service); ready once it has asked its peers."""
    (http,) = _free_ports(1)
    values = copy.deepcopy(fleet.values)
    values["query"] = {"settings": {"peers": fleet.base, "refresh_interval_seconds": 1}}
    work = tmp_path_factory.mktemp("query")
    with _daemon(values, work, of="query", http=f"127.0.0.1:{http}") as (_, base):
        yield base


@pytest.fixture(scope="module")
def scrape(fleet: Fleet, query_tier: str) -> tuple[Scrape, str]:
    """The fleet daemon's scrape and the query tier's (its coeffd_query_* families)."""
    status, text = _get(fleet.base + "/metrics")
    assert status == 200
    live = Scrape(text)
    status, text = _get(query_tier + "/metrics")
    assert status == 200
    live.absorb(Scrape(text))
    return live, fleet.path


def test_query_tier_config_merges_the_fleet_daemon(fleet: Fleet, query_tier: str) -> None:
    """The chart's two config.toml files work together: the query tier asks the fleet
    daemon's /v1/statistics and serves its configurations."""
    _, wanted = _get(fleet.base + "/v1/configurations")
    ids = {c["id"] for c in json.loads(wanted)["configurations"]}
    assert ids or not fleet.path.startswith("live-only"), "the fed daemon published nothing"

    def merged() -> bool:
        text = _get(query_tier + "/metrics")[1]
        up = [
            s.value
            for f in text_string_to_metric_families(text)
            if f.name == "coeffd_query_peers"
            for s in f.samples
            if s.labels.get("state") == "up"
        ]
        if up != [1.0]:
            return False
        status, body = _get(query_tier + "/v1/configurations")
        return status == 200 and {c["id"] for c in json.loads(body)["configurations"]} >= ids

    deadline = time.monotonic() + 60
    while not merged():
        assert time.monotonic() < deadline, "the query tier never served the fleet's configurations"
        time.sleep(0.5)


def test_sidecar_configmap_boots_the_daemon_with_its_identity(
    tmp_path: Path,
) -> None:
    """The sidecar ConfigMap starts a real daemon whose configuration is the identity
    the values gave (as the daemon reports it on /v1/configurations)."""
    grpc, http_otlp, http, kv = _free_ports(4)
    values: dict[str, Any] = {
        "mode": "sidecar",
        "settings": {
            "configuration": {"model": "Qwen/Qwen2.5-7B-Instruct", "hardware": "L40S", "tp": 2},
            "receivers": {
                "otlp_grpc": {"endpoint": f"0.0.0.0:{grpc}"},
                "otlp_http": {"endpoint": f"0.0.0.0:{http_otlp}"},
            },
            "http": {"endpoint": f"127.0.0.1:{http}"},
        },
        "sidecar": {"vllm": {"kvEventsEndpoint": f"tcp://*:{kv}"}},
    }
    with _daemon(values, tmp_path) as (proc, base):
        # OTLP receivers pinned to localhost by the chart: reachable on 127.0.0.1
        with socket.create_connection(("127.0.0.1", grpc), timeout=5):
            pass
        if _cli_has("simfleet"):
            _simfleet(grpc)
            configs: list[dict[str, Any]] = []

            def published() -> bool:
                configs[:] = json.loads(_get(base + "/v1/configurations")[1])["configurations"]
                return bool(configs)

            assert _wait_for("a snapshot", published, proc, 30), "no configuration published"
            # whatever the simulated engines claim in their resource attributes, a sidecar
            # learns for the identity its ConfigMap names
            assert [c["labels"]["gpu"] for c in configs] == ["L40S"]
            assert configs[0]["labels"]["tp"] == "2"
            assert configs[0]["labels"]["model"] == "qwen2.5-7b-instruct"
    log = (tmp_path / "config.log").read_text()
    assert f"tcp://127.0.0.1:{kv}" in log  # subscribed to vLLM's KV publisher locally


def _referenced() -> dict[str, set[str]]:
    dashboard = json.loads((DEPLOY / "grafana" / "coeffd-dashboard.json").read_text())
    rules = yaml.safe_load((DEPLOY / "prometheus" / "coeffd-alerts.yaml").read_text())
    collector_text = (DEPLOY / "otel-collector" / "collector.yaml").read_text()
    assert yaml.safe_load(collector_text)["exporters"]["loadbalancing"]
    return {
        "dashboard": set().union(*(referenced_metrics(e) for e in dashboard_exprs(dashboard))),
        "alerts": set().union(
            *(referenced_metrics(r["expr"]) for g in rules["groups"] for r in g["rules"])
        ),
        "collector": referenced_metrics(collector_text),
    }


def _contract_samples() -> set[str]:
    out: set[str] = set()
    for name, kind in contract_metrics().items():
        out |= sample_names(name.removesuffix("_total") if kind == "counter" else name, kind)
    return out


def test_daemon_exports_the_basic_families(scrape: tuple[Scrape, str]) -> None:
    live, _ = scrape
    for name in BASIC:
        assert name in live.samples, f"{name} not in the live scrape"


def test_live_families_have_the_contract_type(scrape: tuple[Scrape, str]) -> None:
    live, _ = scrape
    contract = contract_metrics()
    checked = 0
    for name, kind in contract.items():
        family = name.removesuffix("_total") if kind == "counter" else name
        if family in live.families:
            assert live.families[family] == kind, (name, live.families[family], kind)
            checked += 1
    assert checked >= len(BASIC)


def test_dashboard_alerts_collector_use_only_exported_metrics(
    scrape: tuple[Scrape, str], record_property: Callable[[str, object], None]
) -> None:
    live, path = scrape
    record_property("metric_check_path", path)
    warnings.warn(f"deploy metric-name check ran the {path} path", stacklevel=1)
    refs = _referenced()
    assert refs["dashboard"] >= LEARNED | {"coeffd_drift_detections_total"}, refs["dashboard"]
    assert "coeffd_snapshot_timestamp_seconds" in refs["alerts"]
    assert "coeffd_prediction_mape_ratio" in refs["alerts"]
    allowed = live.samples if path.startswith("live-only") else live.samples | _contract_samples()
    for source, names in refs.items():
        unknown = names - allowed
        assert not unknown, f"{source} uses metrics the daemon does not export: {sorted(unknown)}"
    # Names the live daemon has must come from it, not just from the table.
    used = set().union(*refs.values())
    assert used & live.samples, "nothing the dashboard uses is live"


_SELECTOR = re.compile(r"(coeffd_[a-z0-9_]+)\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def test_dashboard_and_alert_label_matchers_exist_on_live_series(
    scrape: tuple[Scrape, str],
) -> None:
    """`metric{label=...}` in the dashboard and the alerts only name labels the live
    series carry (a typo'd label silently matches nothing in PromQL)."""
    live, _ = scrape
    dashboard = json.loads((DEPLOY / "grafana" / "coeffd-dashboard.json").read_text())
    rules = yaml.safe_load((DEPLOY / "prometheus" / "coeffd-alerts.yaml").read_text())
    exprs = dashboard_exprs(dashboard) + [r["expr"] for g in rules["groups"] for r in g["rules"]]
    checked = 0
    for expr in exprs:
        for metric, matchers in _SELECTOR.findall(expr):
            if metric not in live.labels:  # family without series yet: nothing to compare
                continue
            for label in _MATCHER.findall(matchers):
                assert label in live.labels[metric], f"{metric} has no label {label!r}"
                checked += 1
    assert checked > 0


def test_contract_parser_reads_the_table() -> None:
    contract = contract_metrics()
    assert contract["coeffd_prediction_mape_ratio"] == "gauge"
    assert contract["coeffd_receiver_decode_seconds"] == "histogram"
    assert contract["coeffd_kv_sequence_gaps_total"] == "counter"
    assert "coeffd_made_up_total" not in _contract_samples()
