"""Names beside ids and /metrics like other exporters (issue 19), on a daemon that learned
a simulated fleet: a real HTTP scrape parsed with prometheus-client's parser (build info,
the process collector, no ``_created`` series, ``coeffd_configuration_info``,
``http.error_histograms`` sizing the per-configuration series) and ``coeffd
configurations`` against the live server and the snapshot directory."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import struct
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coeffd.daemon.assemble import build_app
from coeffd.daemon.commands import configurations
from coeffd.daemon.commands.replay import replay_settings, run_replay
from coeffd.daemon.learning import LearningConsumer
from coeffd.daemon.publish.snapshot import coeffd_version
from coeffd.daemon.settings import Settings, load_settings
from coeffd.receivers.otlp import native
from coeffd.simfleet import SampleRates, run

pytestmark = pytest.mark.slow  # run first: see tests/conftest.py


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One simulated fleet run, written as the Collector file exporter's ``format: proto``
    (length-prefixed protobuf frames). Replaying frames skips the JSON → protobuf
    conversion, which was most of a replay's time (the full daemon's JSON lines: 11.5 s
    CPU, frames 2.0 s); that JSON lines and frames replay alike is
    tests/receivers/test_replay_formats.py's."""
    path = tmp_path_factory.mktemp("traces") / "fleet.otlp"
    with path.open("wb") as frames:

        def frame(req: ExportTraceServiceRequest) -> None:
            data = req.SerializeToString()
            frames.write(struct.pack(">I", len(data)) + data)

        # 10 s: every configuration learns >= 350 steps (the tests want >= 100 for half
        # of them) and its full series set (235 per configuration, as CONTRIBUTING says)
        run("fleet", 10, 5, rates=SampleRates(1.0, 1.0, 0.02, 100), trace_sinks=[frame], drain_s=5)
    return path


def _configurations(**kw: Any) -> tuple[int, str]:
    args = argparse.Namespace(
        **{"server": "", "timeout": 30.0, "snapshot_dir": None, "json": False, **kw}
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = configurations.run(args)
    return code, out.getvalue()


def _settings(tmp: Path, histograms: str) -> Settings:
    overrides = {
        "http": {"endpoint": "127.0.0.1:0", "error_histograms": histograms},
        "receivers": {"otlp_grpc": {"enabled": False}, "otlp_http": {"enabled": False}},
        "publish": {"snapshot_dir": str(tmp / "snaps")},
        "state": {"state_dir": str(tmp / "state")},
        "log": {"level": "warning"},
    }
    return replay_settings(load_settings(overrides=overrides, environ={}), serve=True)


def _learn(traces: Path, tmp: Path, histograms: str) -> tuple[list[str], list[Any]]:
    """Replay the fleet into a daemon and stop it (every step learned and published).

    Returns the configuration ids and the daemon's final exposition, whose
    per-configuration series are complete (a restart keeps state, not histograms)."""
    first = build_app(_settings(tmp, histograms), live=False)
    first.start()
    run_replay(first, [str(traces)], show_progress=False)
    first.stop()
    assert isinstance(first.consumer, LearningConsumer)
    ids = list(first.consumer.registry.ids())
    return ids, list(text_string_to_metric_families(generate_latest(first.registry).decode()))


def _scrape(traces: Path, tmp: Path, histograms: str) -> tuple[list[Any], list[str], dict]:
    """:func:`_learn`, then start a second daemon on the same state and snapshots and
    scrape it over HTTP.

    Returns the live scrape, the configuration ids, the ``coeffd configurations``
    listings and (under ``"learned"``) the first daemon's final exposition."""
    ids, learned = _learn(traces, tmp, histograms)
    settings = _settings(tmp, histograms)
    app = build_app(settings)
    app.start()
    try:
        assert isinstance(app.consumer, LearningConsumer) and app.consumer.restored
        server = f"http://127.0.0.1:{app.http_port}"
        with urllib.request.urlopen(server + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        listings: dict[str, Any] = {"server": _configurations(server=server, json=True)}
        listings["table"] = _configurations(server=server)
    finally:
        app.stop()
    listings["dir"] = _configurations(snapshot_dir=str(tmp / "snaps"), json=True)
    listings["learned"] = learned
    return list(text_string_to_metric_families(text)), ids, listings


@pytest.fixture(scope="module")
def scrapes(traces: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``full``: the fleet replayed, restarted and scraped live. ``coarse``, ``off``: the
    same requests replayed, for their final expositions and ids only (what the tests read
    of them; ``(None, ids, {"learned": ...})``)."""
    out: dict[str, Any] = {"full": _scrape(traces, tmp_path_factory.mktemp("full"), "full")}
    for mode in ("coarse", "off"):
        ids, learned = _learn(traces, tmp_path_factory.mktemp(mode), mode)
        out[mode] = (None, ids, {"learned": learned})
    return out


def _samples(families: list[Any]) -> list[Any]:
    return [s for f in families for s in f.samples]


def test_build_info_process_collector_and_no_created_series(scrapes: dict[str, Any]) -> None:
    families, _, _ = scrapes["full"]
    samples = _samples(families)
    build = [s for s in samples if s.name == "coeffd_build_info"]
    assert len(build) == 1 and build[0].value == 1.0
    assert build[0].labels["version"] == coeffd_version()
    assert build[0].labels["otlp_decoder"] == ("compiled" if native.AVAILABLE else "python")
    names = {s.name for s in samples}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names
    assert not [n for n in names if n.endswith("_created")]


def test_configuration_info_names_every_id(scrapes: dict[str, Any]) -> None:
    families, ids, _ = scrapes["full"]
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
    counts = {m: _per_config(scrapes[m][2]["learned"], scrapes[m][1]) for m in scrapes}
    ids = scrapes["full"][1]
    # the same requests under each setting: the same configurations
    assert sorted(scrapes["coarse"][1]) == sorted(scrapes["off"][1]) == sorted(ids)
    for cid in ids:
        assert counts["full"][cid] > counts["coarse"][cid] > counts["off"][cid] > 0
    for mode in counts:  # CONTRIBUTING "Reference" (Operations) states these
        print(mode, "series per configuration: max", max(counts[mode].values()))
    off = {s.name for s in _samples(scrapes["off"][2]["learned"])}
    assert not [n for n in off if n.startswith("coeffd_prediction_relative_error_ratio")]
    # coarse: 4 finite buckets + Inf per histogram
    coarse = [
        s
        for s in _samples(scrapes["coarse"][2]["learned"])
        if s.name == "coeffd_prediction_relative_error_ratio_bucket"
    ]
    per_child = Counter(
        tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in coarse
    )
    assert set(per_child.values()) == {5}


def test_configurations_lists_names_beside_ids(scrapes: dict[str, Any]) -> None:
    families, ids, listings = scrapes["full"]
    code, out = listings["server"]
    assert code == 0
    # (the daemon's own log lines share stdout in this process)
    listed = [json.loads(line) for line in out.splitlines() if line.startswith('{"id"')]
    # the fleet model (one α/β over every configuration) is listed too, by that name
    fleet = [r for r in listed if r["id"] not in ids]
    assert all(r["name"] == "fleet model (all configurations)" for r in fleet)
    assert all(r["knobs"] == {} for r in fleet) and listed[len(listed) - len(fleet) :] == fleet
    rows = [r for r in listed if r["id"] in ids]
    assert sorted(r["id"] for r in rows) == sorted(ids)
    info = {
        s.labels["config"]: s.labels
        for s in _samples(families)
        if s.name == "coeffd_configuration_info"
    }
    for r in rows:
        labels = info[r["id"]]
        assert (r["model"], r["gpu"], r["tp"]) == (labels["model"], labels["gpu"], labels["tp"])
        assert r["name"].startswith(f"{labels['model']}/{labels['gpu']}/tp{labels['tp']}")
        assert sum(r["observations"].values()) > 0 and r["version"] >= 1
    # learned beats BLIS's shipped defaults on the simulated fleet (its truth is a
    # perturbation of them), and both are reported once steps were learned
    stepped = [r for r in rows if r["observations"].get("beta", 0) >= 100]
    assert len(stepped) >= len(rows) // 2
    assert all(0 < r["step_mape_learned"] < r["step_mape_blis_default"] for r in stepped)
    # the snapshot directory tells the same (the server may publish once more at stop)
    code, out = listings["dir"]
    assert code == 0
    from_dir = {
        json.loads(line)["id"]: json.loads(line)
        for line in out.splitlines()
        if line.startswith('{"id"')
    }
    assert set(from_dir) == {r["id"] for r in listed}
    assert all(from_dir[r["id"]]["name"] == r["name"] for r in listed)
    code, table = listings["table"]
    lines = [ln for ln in table.splitlines() if ln.split(" ")[0] in {"id", *ids}]
    assert code == 0 and lines[0].startswith("id ") and len(lines) == len(rows) + 1
    assert all(any(r["id"] in ln and r["name"] in ln for ln in lines) for r in rows)
    # knobs every configuration shares are said once, under the table
    shared = [ln for ln in table.splitlines() if ln.startswith("all configurations: ")]
    assert len(shared) == 1 and "max_num_seqs=" in shared[0]


def test_configurations_without_a_server_fails_plainly(tmp_path: Path) -> None:
    code, _ = _configurations(server="http://127.0.0.1:9", timeout=2.0)
    assert code == 1
    code, _ = _configurations(snapshot_dir=str(tmp_path / "none"))
    assert code == 1
