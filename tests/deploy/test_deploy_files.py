"""deploy/: the example manifests validate against Kubernetes' strict schemas, the
sidecar example's config.toml loads with the daemon's settings and matches vLLM's flags,
the collector config routes by configuration, and the image build is what it claims."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import DEPLOY, K8S_VERSIONS, REPO, by_kind, one, validate_k8s

from coeffd.daemon.settings import Settings, load_settings
from coeffd.learners.features.config import ConfigurationSettings

SIDECAR = DEPLOY / "kubernetes" / "vllm-coeffd-sidecar.yaml"
COLLECTOR = DEPLOY / "otel-collector"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    "path", [SIDECAR, COLLECTOR / "kubernetes.yaml"], ids=lambda p: p.parent.name + "/" + p.name
)
def test_example_manifests_validate(path: Path, version: str) -> None:
    docs = _docs(path)
    assert docs
    for doc in docs:
        validate_k8s(doc, version)


def test_sidecar_example_config_loads_and_mirrors_vllm_flags(tmp_path: Path) -> None:
    docs = _docs(SIDECAR)
    text = one(docs, "ConfigMap")["data"]["config.toml"]
    data = tomllib.loads(text)
    ident = ConfigurationSettings(**data["configuration"])
    rest = {k: v for k, v in data.items() if k != "configuration"}
    if "configuration" in Settings.model_fields:
        cfg = tmp_path / "config.toml"
        cfg.write_text(text)
        settings = load_settings(config=cfg, environ={})
    else:  # [configuration] not yet a daemon section: the rest must still load
        settings = load_settings(overrides=rest, environ={})
    assert settings.receivers.otlp_grpc.endpoint == "127.0.0.1:4317"

    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    args: list[str] = vllm["args"]

    def flag(name: str) -> str:
        return args[args.index(name) + 1]

    assert flag("--model") == ident.model
    assert int(flag("--tensor-parallel-size")) == ident.tp
    assert int(flag("--max-num-batched-tokens")) == ident.max_num_batched_tokens
    assert int(flag("--max-num-seqs")) == ident.max_num_seqs
    assert int(flag("--max-model-len")) == ident.max_model_len
    assert ("--enable-chunked-prefill" in args) == bool(ident.chunked_prefill)
    assert ("--enable-prefix-caching" in args) == bool(ident.prefix_caching)
    port = settings.receivers.otlp_grpc.endpoint.rsplit(":", 1)[1]
    assert flag("--otlp-traces-endpoint") == f"http://localhost:{port}"
    assert {"--enable-journey-tracing", "--step-tracing-enabled"} <= set(args)
    for rate in ("--journey-tracing-sample-rate", "--step-tracing-sample-rate"):
        assert 0.0 <= float(flag(rate)) <= 1.0
    kv_config = json.loads(flag("--kv-events-config"))
    assert kv_config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
    }
    if "kv" in Settings.model_fields:
        kv_port = kv_config["endpoint"].rsplit(":", 1)[1]
        assert settings.kv.endpoints == [f"tcp://127.0.0.1:{kv_port}"]
        mounts = {m["mountPath"] for c in pod["initContainers"] for m in c["volumeMounts"]}
        for d in (settings.publish.snapshot_dir, settings.state.state_dir):
            assert any(d.startswith(m + "/") for m in mounts), f"{d} not on a volume"
    env = {e["name"]: e["value"] for e in vllm["env"]}
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] in {"grpc", "http/protobuf"}
    assert env["OTEL_EXPORTER_OTLP_TRACES_INSECURE"] == "true"
    assert env["OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"] == "otel,process"
    attrs = dict(kv.split("=", 1) for kv in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
    assert attrs["coeffd.model"] == ident.model
    assert attrs["coeffd.gpu"] == ident.gpu_name()
    assert int(attrs["coeffd.tp"]) == ident.tp

    sidecar = next(c for c in pod["initContainers"] if c["name"] == "coeffd")
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    assert sidecar["securityContext"]["capabilities"]["drop"] == ["ALL"]
    http_port = int(settings.http.endpoint.rsplit(":", 1)[1])
    assert {p["containerPort"] for p in sidecar["ports"]} == {http_port}
    volumes = {v["name"] for v in pod["volumes"]}
    assert {m["name"] for m in sidecar["volumeMounts"]} <= volumes
    cm_name = one(docs, "ConfigMap")["metadata"]["name"]
    assert {"name": "coeffd-config", "configMap": {"name": cm_name}} in pod["volumes"]


def test_collector_routes_each_configuration_to_one_replica() -> None:
    cfg = yaml.safe_load((COLLECTOR / "collector.yaml").read_text())
    lb = cfg["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "service"
    assert lb["protocol"]["otlp"]["tls"]["insecure"] is True
    assert list(lb["resolver"]) == ["k8s"]  # exactly one resolver
    traces = cfg["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and traces["exporters"] == ["loadbalancing"]
    assert set(traces["processors"]) <= set(cfg["processors"])
    assert {"grpc", "http"} <= set(cfg["receivers"]["otlp"]["protocols"])
    # kustomize wires collector.yaml into the Deployment's mounted ConfigMap
    kust = yaml.safe_load((COLLECTOR / "kustomization.yaml").read_text())
    (gen,) = kust["configMapGenerator"]
    assert gen["files"] == ["collector.yaml"]
    docs = _docs(COLLECTOR / "kubernetes.yaml")
    dep = one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert {"name": "config", "configMap": {"name": gen["name"]}} in pod["volumes"]
    container = pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert f"--config={mount['mountPath']}/collector.yaml" in container["args"]
    # RBAC for the k8s resolver covers the Service account the collector runs as
    role = one(docs, "Role")
    assert any("endpointslices" in r["resources"] for r in role["rules"])
    binding = one(docs, "RoleBinding")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    assert by_kind(docs, "Service")[0]["spec"]["ports"][0]["port"] == 4317


def _dockerfile() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dockerfile_is_multistage_nonroot_with_the_documented_entrypoint() -> None:
    instrs = _dockerfile()
    froms = [rest for op, rest in instrs if op == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS builder", "${PYTHON_IMAGE} AS runtime"]
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim") in instrs
    runtime = instrs[[i for i, (op, _) in enumerate(instrs) if op == "FROM"][1] :]
    users = [rest for op, rest in runtime if op == "USER"]
    assert users and users[-1].split(":")[0] not in {"0", "root"}
    assert ("ENTRYPOINT", '["coeffd"]') in runtime
    cmd = json.loads(next(rest for op, rest in runtime if op == "CMD"))
    assert cmd == ["serve", "--config", "/etc/coeffd/config.toml"]
    # the runtime stage takes only the venv from the builder, never the source tree
    copies = [rest for op, rest in runtime if op == "COPY"]
    assert all(c.startswith("--from=builder /opt/coeffd") or "config" in c for c in copies)
    # the builder installs the wheel (runtime deps only), not the [test]/[dev] extras
    build_runs = " ".join(rest for op, rest in instrs if op == "RUN")
    assert "pip wheel --no-deps" in build_runs and "coeffd-*.whl" in build_runs
    assert "[dev]" not in build_runs and "[test]" not in build_runs
    # the compiled OTLP decoder is built (a compiler in the builder only, setup.py copied)
    # and checked importable, so the image never quietly ships the pure-Python fallback
    builder = instrs[: [i for i, (op, _) in enumerate(instrs) if op == "FROM"][1]]
    builder_runs = " ".join(rest for op, rest in builder if op == "RUN")
    assert "gcc" in builder_runs and "n.AVAILABLE" in builder_runs
    assert not any("gcc" in rest for op, rest in runtime if op == "RUN")
    assert any("setup.py" in rest for op, rest in builder if op == "COPY")
    exposed = {int(p) for op, rest in runtime if op == "EXPOSE" for p in rest.split()}
    d = Settings()
    ports = {int(e.rsplit(":", 1)[1]) for e in (d.receivers.otlp_grpc.endpoint, d.http.endpoint)}
    assert ports | {int(d.receivers.otlp_http.endpoint.rsplit(":", 1)[1])} == exposed


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore semantics, enough for our file: last match wins, ! re-includes."""
    ignored = False
    for pat in patterns:
        neg = pat.startswith("!")
        pat = pat.lstrip("!").rstrip("/")
        candidates = [path] + [
            str(Path(*Path(path).parts[:i])) for i in range(1, len(Path(path).parts))
        ]
        if any(
            fnmatch.fnmatch(c, pat) or fnmatch.fnmatch(c, pat.replace("**/", ""))
            for c in candidates
        ):
            ignored = not neg
    return ignored


def test_dockerignore_lets_in_exactly_what_the_build_copies() -> None:
    ignore = DEPLOY / ".dockerignore"
    assert (DEPLOY / "Dockerfile.dockerignore").resolve() == ignore.resolve()
    patterns = [
        ln.strip()
        for ln in ignore.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    sources = [
        src
        for op, rest in _dockerfile()
        if op == "COPY" and not rest.startswith("--from")
        for src in rest.split()[:-1]
    ]
    assert sources
    for src in sources:
        assert not _ignored(src, patterns), f"{src} is copied but ignored"
    for unwanted in (
        ".venv/bin/python",
        ".git/config",
        "tests/deploy/test_deploy_files.py",
        "bench/__init__.py",
        "coeffd/daemon/__pycache__/cli.cpython-311.pyc",
    ):
        assert _ignored(unwanted, patterns), unwanted
    # the one package the wheel is built from is present in the repo, and so is every file
    assert "coeffd" in sources and (REPO / "coeffd" / "__init__.py").exists()
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: not in the repository"


def test_image_default_config_loads() -> None:
    """The config.toml baked into the image is valid for the daemon and listens on the
    ports the image EXPOSEs, on all interfaces (a container, not a sidecar)."""
    settings = load_settings(config=DEPLOY / "image-config.toml", environ={})
    exposed = {int(p) for op, rest in _dockerfile() if op == "EXPOSE" for p in rest.split()}
    endpoints = [
        settings.receivers.otlp_grpc.endpoint,
        settings.receivers.otlp_http.endpoint,
        settings.http.endpoint,
    ]
    assert {int(e.rsplit(":", 1)[1]) for e in endpoints} == exposed
    assert all(e.startswith("0.0.0.0:") for e in endpoints)


def test_alert_rules_are_well_formed() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "coeffd-alerts.yaml").read_text())
    names = [r["alert"] for g in rules["groups"] for r in g["rules"]]
    assert len(names) == len(set(names))
    assert {"CoeffdLearnedWorseThanBlisDefault", "CoeffdSnapshotStale"} <= set(names)
    for g in rules["groups"]:
        for r in g["rules"]:
            assert r["labels"]["severity"] in {"info", "warning", "critical"}
            assert r["annotations"]["summary"]
            assert r["expr"].count("(") == r["expr"].count(")")
    stale = next(
        r for g in rules["groups"] for r in g["rules"] if r["alert"] == "CoeffdSnapshotStale"
    )
    assert "time() - coeffd_snapshot_timestamp_seconds" in stale["expr"]
    regress = next(
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r["alert"] == "CoeffdLearnedWorseThanBlisDefault"
    )
    assert 'coefficients="learned"' in regress["expr"]
    assert 'coefficients="blis_default"' in regress["expr"]


def test_dashboard_is_valid_grafana_json() -> None:
    dash = json.loads((DEPLOY / "grafana" / "coeffd-dashboard.json").read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in (
        "blis default",
        "coefficient",
        "drift",
        "snapshot age",
        "events received",
        "join",
    ):
        assert topic in titles, topic
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        assert p["targets"] and all(t["expr"] for t in p["targets"])


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def _rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "coeffd-alerts.yaml").read_text())
    return [r for g in rules["groups"] for r in g["rules"]]


def test_alert_runbooks_point_at_sections_of_this_repository() -> None:
    with_runbook = {}
    for r in _rules():
        url = r["annotations"].get("runbook_url")
        if url is None:
            continue
        path, _, anchor = url.partition("#")
        doc = REPO / path
        assert doc.is_file(), f"{r['alert']}: {path} is not a file of the repository"
        assert anchor in _anchors(doc.read_text()), f"{r['alert']}: no section #{anchor}"
        with_runbook[r["alert"]] = url
    assert {
        "CoeffdDown",
        "CoeffdAbsent",
        "CoeffdThreadRestarts",
        "CoeffdQueryPeersStale",
        "CoeffdQueryPeerErrors",
        "CoeffdQueryNoPeers",
    } <= set(with_runbook)


def test_query_tier_alerts_and_dashboard_row() -> None:
    rules = {r["alert"]: r for r in _rules()}
    assert rules["CoeffdQueryPeersStale"]["expr"] == 'coeffd_query_peers{state="stale"} > 0'
    assert rules["CoeffdQueryPeersStale"]["for"] == "15m"
    assert "rate(coeffd_query_peer_errors_total" in rules["CoeffdQueryPeerErrors"]["expr"]
    dash = json.loads((DEPLOY / "grafana" / "coeffd-dashboard.json").read_text())
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert "Query tier" in rows
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    for family in (
        "coeffd_query_peers",
        "coeffd_query_peer_errors_total",
        "coeffd_query_peer_configurations",
        "coeffd_query_merge_duration_seconds_bucket",
        "coeffd_query_configuration_instances",
    ):
        assert family in exprs, family
