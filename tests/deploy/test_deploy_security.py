"""The chart's security wiring: Secret-mounted TLS material and bearer token, probes and
ServiceMonitor that follow the http listener's scheme, and the NetworkPolicy; rendered
and linted with the real Helm SDK, validated against Kubernetes' strict schemas, and the
rendered config.toml loaded by the daemon's own settings against real certificates laid
out like the mounted Secrets."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import (
    CHART,
    DEPLOY,
    K8S_VERSIONS,
    component,
    config_toml,
    lint,
    manifests,
    one,
    render,
    validate_k8s,
    wrapper_chart,
)
from test_deploy_chart import SIDECAR_VALUES

from coeffd.daemon.settings import load_settings
from tests.receivers.tls_certs import make_certs

#: The query tier's pods (templates/_helpers.tpl, "coeffd.query.selectorLabels").
QUERY_SELECTOR = {
    "app.kubernetes.io/name": "coeffd-query",
    "app.kubernetes.io/instance": "coeffd",
    "app.kubernetes.io/component": "query",
}

SECURED: dict[str, Any] = {
    "security": {
        "tls": {"secretName": "coeffd-tls", "clientCA": True},
        "token": {"secretName": "coeffd-token"},
    },
    "settings": {"http": {"metrics_public": False}},
    "fleet": {
        "serviceMonitor": {
            "enabled": True,
            "tlsConfig": {"ca": {"secret": {"name": "coeffd-tls", "key": "ca.crt"}}},
        }
    },
    "networkPolicy": {
        "receivers": [
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "otel-collector"}}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "serving"}}},
        ],
        "api": [{"podSelector": {"matchLabels": {"app": "blis"}}}],
    },
}


def _container(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = one(docs, "StatefulSet")["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "coeffd"]
    return pod, c


def test_secured_chart_lints_and_validates() -> None:
    assert lint(CHART, SECURED) == []
    for version in K8S_VERSIONS:
        for doc in manifests(render(CHART, SECURED)):
            validate_k8s(doc, version)


def test_secrets_are_mounted_where_the_config_points() -> None:
    docs = manifests(render(CHART, SECURED))
    pod, c = _container(docs)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["coeffd-tls"]["secret"]["secretName"] == "coeffd-tls"
    assert volumes["coeffd-token"]["secret"]["items"] == [{"key": "token", "path": "token"}]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["coeffd-tls"] == {
        "name": "coeffd-tls",
        "mountPath": "/etc/coeffd/tls",
        "readOnly": True,
    }
    cfg = tomllib.loads(config_toml(docs))
    for section in (cfg["receivers"]["otlp_grpc"], cfg["receivers"]["otlp_http"], cfg["http"]):
        assert section["tls"] == {
            "cert_file": "/etc/coeffd/tls/tls.crt",
            "key_file": "/etc/coeffd/tls/tls.key",
            "client_ca_file": "/etc/coeffd/tls/ca.crt",
        }
        assert section["auth"] == {"bearer_token_file": "/etc/coeffd/token/token"}
    # every path the config names lies under a mount of the container
    for path in ("/etc/coeffd/tls/tls.crt", "/etc/coeffd/token/token"):
        assert any(path.startswith(m["mountPath"] + "/") for m in c["volumeMounts"]), path
    assert cfg["http"]["metrics_public"] is False


def test_probes_and_scrape_follow_the_http_scheme() -> None:
    docs = manifests(render(CHART, SECURED))
    _, c = _container(docs)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS"
        path = c[probe]["httpGet"]["path"].partition("?")[0]
        assert path in ("/healthz", "/readyz")  # never guarded
    ep = one(docs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert ep["scheme"] == "https"
    assert ep["tlsConfig"] == SECURED["fleet"]["serviceMonitor"]["tlsConfig"]
    assert ep["authorization"]["credentials"] == {"name": "coeffd-token", "key": "token"}

    plain = manifests(render(CHART, {"fleet": {"serviceMonitor": {"enabled": True}}}))
    _, c = _container(plain)
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTP"
    ep = one(plain, "ServiceMonitor")["spec"]["endpoints"][0]
    assert "scheme" not in ep and "authorization" not in ep


def test_explicit_setting_wins_and_listeners_can_be_chosen() -> None:
    values = {
        "security": {"tls": {"secretName": "t", "listeners": ["otlp_grpc"]}},
        "settings": {"receivers": {"otlp_grpc": {"tls": {"cert_file": "/custom/c.pem"}}}},
    }
    cfg = tomllib.loads(config_toml(manifests(render(CHART, values))))
    assert cfg["receivers"]["otlp_grpc"]["tls"]["cert_file"] == "/custom/c.pem"
    assert cfg["receivers"]["otlp_grpc"]["tls"]["key_file"] == "/etc/coeffd/tls/tls.key"
    assert cfg["receivers"]["otlp_grpc"]["tls"]["client_ca_file"] == ""
    assert cfg["receivers"]["otlp_http"]["tls"]["cert_file"] == ""
    assert cfg["http"]["tls"]["cert_file"] == ""


def test_network_policy_admits_only_the_configured_peers() -> None:
    np = one(manifests(render(CHART, SECURED)), "NetworkPolicy")
    assert np["spec"]["policyTypes"] == ["Ingress"]
    assert np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "coeffd"
    rules = np["spec"]["ingress"]
    by_ports = {tuple(p["port"] for p in r["ports"]): r["from"] for r in rules}
    assert by_ports[(4317, 4318)] == SECURED["networkPolicy"]["receivers"]
    prometheus = {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    query_tier = {"podSelector": {"matchLabels": QUERY_SELECTOR}}
    assert by_ports[(9464,)] == [prometheus, *SECURED["networkPolicy"]["api"], query_tier]
    assert len(rules) == 2

    closed = {"networkPolicy": {"receivers": [], "metrics": [], "api": []}}
    np = one(manifests(render(CHART, closed)), "NetworkPolicy")
    # allow-lists with nothing on them: only the query tier reaches the API port
    assert np["spec"]["ingress"] == [
        {"from": [query_tier], "ports": [{"protocol": "TCP", "port": 9464}]}
    ]
    np = one(manifests(render(CHART, {**closed, "query": {"enabled": False}})), "NetworkPolicy")
    assert not np["spec"].get("ingress")  # deny all ingress
    # sidecar mode: the vLLM chart owns its pods' policy; only the query tier's is rendered
    sidecar = manifests(render(CHART, SIDECAR_VALUES))
    assert [component(d) for d in sidecar if d["kind"] == "NetworkPolicy"] == ["query"]


def test_rendered_config_loads_against_secrets_laid_out_as_mounted(tmp_path: Path) -> None:
    # The Secrets' files where the chart mounts them (mountPath moved under tmp_path):
    # the daemon's own settings validation checks the files exist and the key matches.
    tls_dir, token_dir = tmp_path / "tls", tmp_path / "token"
    tls_dir.mkdir()
    token_dir.mkdir()
    certs = make_certs(tmp_path)
    (tls_dir / "tls.crt").write_bytes(certs.server_cert.read_bytes())
    (tls_dir / "tls.key").write_bytes(certs.server_key.read_bytes())
    (tls_dir / "ca.crt").write_bytes(certs.ca.read_bytes())
    (token_dir / "token").write_text("t0ken\n")
    values = {
        **SECURED,
        "security": {
            "tls": {"secretName": "s", "clientCA": True, "mountPath": str(tls_dir)},
            "token": {"secretName": "t", "mountPath": str(token_dir)},
        },
    }
    path = tmp_path / "config.toml"
    path.write_text(config_toml(manifests(render(CHART, values))))
    s = load_settings(path, None, {})
    assert s.receivers.otlp_grpc.tls.client_ca_file == str(tls_dir / "ca.crt")
    assert s.http.auth.bearer_token_file == str(token_dir / "token")
    (tls_dir / "tls.key").write_bytes(certs.other_key.read_bytes())  # a wrong Secret
    with pytest.raises(Exception, match=r"tls\.key_file.*does not match"):
        load_settings(path, None, {})


def test_sidecar_vllm_gets_the_token_header(tmp_path: Path) -> None:
    chart = wrapper_chart(tmp_path)
    values = {"coeffd": {**SIDECAR_VALUES, "security": {"token": {"secretName": "tok"}}}}
    pod = one(manifests(render(chart, values)), "Deployment")["spec"]["template"]["spec"]
    (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    env = {e["name"]: e for e in vllm["env"]}
    assert env["COEFFD_OTLP_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "tok", "key": "token"}
    header = env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"]["value"]
    assert header == "authorization=Bearer%20$(COEFFD_OTLP_TOKEN)"
    # the reference resolves: the variable it names is defined before it
    names = [e["name"] for e in vllm["env"]]
    assert names.index("COEFFD_OTLP_TOKEN") < names.index("OTEL_EXPORTER_OTLP_TRACES_HEADERS")


def test_default_policy_admits_the_collector_of_deploy_otel_collector() -> None:
    # The collector tier of deploy/otel-collector (kustomize namespace = the chart's
    # documented namespace) must match the default receivers peer, or a default install
    # would cut the collector off.
    kustomize = yaml.safe_load((DEPLOY / "otel-collector" / "kustomization.yaml").read_text())
    docs = list(yaml.safe_load_all((DEPLOY / "otel-collector" / "kubernetes.yaml").read_text()))
    (collector,) = [d for d in docs if d and d["kind"] == "Deployment"]
    pod_labels = collector["spec"]["template"]["metadata"]["labels"]
    np = one(manifests(render(CHART, namespace=kustomize["namespace"])), "NetworkPolicy")
    receivers_rule = np["spec"]["ingress"][0]
    assert {p["port"] for p in receivers_rule["ports"]} == {4317, 4318}
    (peer,) = receivers_rule["from"]
    assert set(peer) == {"podSelector"}  # same namespace as the release
    assert peer["podSelector"]["matchLabels"].items() <= pod_labels.items()


#: What the memory arithmetic in values.yaml rests on (measured: bench soak's idle RSS,
#: bench serve's 100-configuration RSS, the decoder's bytes per queued record, parsed
#: bytes per OTLP item and the body-to-peak factor of a parsed and decoded request).
IDLE_MIB, LEARNERS_MIB, RECORD_BYTES, ITEM_BYTES, BODY_FACTOR = 80, 70, 300, 40, 6


def _mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / 2**20


@pytest.mark.parametrize("mode", ["fleet", "sidecar"])
def test_memory_limit_holds_the_receivers_bounds(mode: str) -> None:
    values = {} if mode == "fleet" else SIDECAR_VALUES
    docs = manifests(render(CHART, values))
    cfg = tomllib.loads(config_toml(docs))
    if mode == "fleet":
        limit = _container(docs)[1]["resources"]["limits"]["memory"]
    else:
        limit = yaml.safe_load((CHART / "values.yaml").read_text())["resources"]["limits"]["memory"]
    r = cfg["receivers"]
    threads = r["otlp_grpc"]["workers"] + r["otlp_http"]["max_connections"]
    body = max(r["otlp_grpc"]["max_message_bytes"], r["otlp_http"]["max_body_bytes"]) / 2**20
    per_request = max(BODY_FACTOR * body, body + r["limits"]["max_items"] * ITEM_BYTES / 2**20)
    queue = cfg["pipeline"]["queue_capacity"] * RECORD_BYTES / 2**20
    need = IDLE_MIB + LEARNERS_MIB + queue + threads * per_request
    assert need <= _mib(limit), f"{need:.0f} MiB of bounded work > limit {limit}"
    # and the limit is not padded far beyond it (the scheduler reserves nodes by requests,
    # but an OOM kill only comes at the limit: a loose limit hides leaks)
    assert _mib(limit) < 1.5 * need


def test_sidecar_refuses_tls_on_the_receiver_vllm_uses(tmp_path: Path) -> None:
    chart = wrapper_chart(tmp_path)
    tls = {"tls": {"secretName": "t"}}  # default listeners: both receivers and http
    with pytest.raises(Exception, match=r"security\.tls covers otlp_grpc"):
        render(chart, {"coeffd": {**SIDECAR_VALUES, "security": tls}})
    api_only = {"tls": {"secretName": "t", "listeners": ["http"]}}
    docs = manifests(render(chart, {"coeffd": {**SIDECAR_VALUES, "security": api_only}}))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (coeffd,) = [c for c in pod["containers"] if c["name"] == "coeffd"]
    assert coeffd["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
