"""The query tier in the chart (issue 30): `coeffd serve` with mode = "query" over the
fleet's replicas (dns+ the headless Service) or the vLLM pods' sidecars (dns+ a headless
Service over their coeffd API port), rendered in both modes, validated against
Kubernetes' strict schemas, its config.toml loaded by the daemon's own settings."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from deploy_helpers import (
    CHART,
    K8S_VERSIONS,
    by_kind,
    config_toml,
    lint,
    manifests,
    one,
    pod_spec,
    render,
    validate_k8s,
)
from test_deploy_chart import SIDECAR_VALUES
from test_deploy_security import QUERY_SELECTOR, SECURED

from coeffd.daemon.query.config import QuerySettings
from coeffd.daemon.query.peers import parse_peers
from coeffd.daemon.settings import load_settings
from tests.receivers.tls_certs import make_certs


def _query_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = pod_spec(one(docs, "StatefulSet", "query"))["containers"]
    assert c["name"] == "coeffd-query"
    return dict(c)


def _query_toml(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return tomllib.loads(config_toml(docs, "query"))


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def _load(docs: list[dict[str, Any]], tmp_path: Path) -> Any:
    path = tmp_path / "query.toml"
    path.write_text(config_toml(docs, "query"))
    return load_settings(config=path, environ={})


@pytest.mark.parametrize("mode", ["fleet", "sidecar"])
def test_query_tier_lints_and_validates(mode: str) -> None:
    values = {} if mode == "fleet" else SIDECAR_VALUES
    assert lint(CHART, values) == []
    docs = manifests(render(CHART, values))
    assert {d["kind"] for d in docs if d["metadata"]["name"] == "coeffd-query"} == {
        "ConfigMap",
        "NetworkPolicy",
        "Service",
        "StatefulSet",
    }
    for doc in docs:
        for version in K8S_VERSIONS:
            validate_k8s(doc, version)


def test_fleet_query_tier_asks_the_headless_service(tmp_path: Path) -> None:
    docs = manifests(render(CHART, name="coeffd", namespace="coeffd"))
    headless = next(
        s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-headless")
    )
    sts = one(docs, "StatefulSet")
    # the headless Service the peers resolve is the fleet's, over the fleet's pods
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    settings = _load(docs, tmp_path)
    assert settings.mode == "query"
    assert settings.query.peers == f"dns+{headless['metadata']['name']}.coeffd.svc:9464"
    (peer,) = parse_peers(settings.query.peers, dns_scheme=settings.query.dns_scheme)
    assert (peer.dns, peer.scheme, peer.port) == (True, "http", 9464)
    # the port asked is the fleet container's API port
    fleet_c = pod_spec(sts)["containers"][0]
    assert {p["name"]: p["containerPort"] for p in fleet_c["ports"]}["coeffd-http"] == peer.port
    # no receivers, the learners' API listener, state and snapshots on the data volume
    assert not settings.receivers.otlp_grpc.enabled and not settings.receivers.otlp_http.enabled
    assert settings.http.endpoint == "0.0.0.0:9464"
    c = _query_container(docs)
    writable = [m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")]
    for d in (settings.state.state_dir, settings.publish.snapshot_dir):
        assert any(d.startswith(m + "/") for m in writable), d


def test_query_selectors_never_match_the_fleet_and_back() -> None:
    """The query pods have their own app.kubernetes.io/name: the fleet's Services, PDB and
    NetworkPolicy (name + instance) must not pick them up, or the collector would route
    spans to the query tier and the query tier would ask itself."""
    docs = manifests(render(CHART, {"fleet": {"serviceMonitor": {"enabled": True}}}))
    query_pod = one(docs, "StatefulSet", "query")["spec"]["template"]["metadata"]["labels"]
    fleet_pod = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    selectors = [s["spec"]["selector"] for s in by_kind(docs, "Service")]
    selectors.append(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    selectors.append(one(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"])
    for sel in selectors:
        assert not (_selects(sel, query_pod) and _selects(sel, fleet_pod)), sel
    query_svc = one(docs, "Service", "query")
    assert query_svc["spec"]["selector"] == QUERY_SELECTOR
    assert _selects(query_svc["spec"]["selector"], query_pod)
    assert not _selects(query_svc["spec"]["selector"], fleet_pod)
    for svc in by_kind(docs, "Service"):
        if svc is not query_svc:
            assert not _selects(svc["spec"]["selector"], query_pod), svc["metadata"]["name"]


def test_query_service_probes_and_hardening() -> None:
    docs = manifests(render(CHART))
    svc = one(docs, "Service", "query")
    assert svc["spec"]["type"] == "ClusterIP"
    (port,) = svc["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("http", 9464, "coeffd-http")
    c = _query_container(docs)
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"coeffd-http": 9464}
    assert c["args"] == ["serve", "--config", "/etc/coeffd/config.toml"]
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert c[probe]["httpGet"] == {"path": path, "port": "coeffd-http", "scheme": "HTTP"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    sts = one(docs, "StatefulSet", "query")
    pod = pod_spec(sts)
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["serviceName"] == "coeffd-query"
    # config from the query tier's own ConfigMap; data on a retained PVC
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["coeffd-config"]["configMap"]["name"] == "coeffd-query"
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["coeffd-data"]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    for m in c["volumeMounts"]:
        assert m["name"] in volumes or m["name"] == "coeffd-data"
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/config" in annotations


def test_query_persistence_off_uses_an_emptydir() -> None:
    docs = manifests(render(CHART, {"query": {"persistence": {"enabled": False, "size": "256Mi"}}}))
    sts = one(docs, "StatefulSet", "query")
    assert "volumeClaimTemplates" not in sts["spec"]
    assert {"name": "coeffd-data", "emptyDir": {"sizeLimit": "256Mi"}} in pod_spec(sts)["volumes"]


def test_sidecar_query_tier_asks_the_vllm_pods(wrapper: Path, tmp_path: Path) -> None:
    docs = manifests(render(wrapper, name="llama", namespace="serving"))
    peers = one(docs, "Service", "peers")
    assert peers["metadata"]["name"] == "llama-coeffd-peers"
    assert peers["spec"]["clusterIP"] == "None"
    vllm = one(docs, "Deployment")
    pod_labels = vllm["spec"]["template"]["metadata"]["labels"]
    # the headless Service selects the vLLM pods (labels of "coeffd.sidecarPodLabels")
    assert _selects(peers["spec"]["selector"], pod_labels)
    query_pod = one(docs, "StatefulSet", "query")["spec"]["template"]["metadata"]["labels"]
    assert not _selects(peers["spec"]["selector"], query_pod)
    # ... on the sidecar container's API port
    sidecar = next(
        c
        for c in pod_spec(vllm).get("initContainers", []) + pod_spec(vllm)["containers"]
        if c["name"] == "coeffd"
    )
    (port,) = peers["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in sidecar["ports"]}
    settings = _load(docs, tmp_path)
    assert settings.query.peers == "dns+llama-coeffd-peers.serving.svc:9464"
    # the query tier's egress goes to exactly those pods
    np = one(docs, "NetworkPolicy", "query")
    to_peers = np["spec"]["egress"][0]
    assert to_peers["ports"] == [{"protocol": "TCP", "port": port["port"]}]
    assert _selects(to_peers["to"][0]["podSelector"]["matchLabels"], pod_labels)


def test_sidecar_pod_selector_can_name_existing_labels() -> None:
    values = {**SIDECAR_VALUES, "sidecar": {"podSelector": {"app.kubernetes.io/name": "vllm"}}}
    docs = manifests(render(CHART, values))
    assert one(docs, "Service", "peers")["spec"]["selector"] == {"app.kubernetes.io/name": "vllm"}
    egress = one(docs, "NetworkPolicy", "query")["spec"]["egress"][0]
    assert egress["to"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm"}


def test_query_network_policy() -> None:
    values = {"networkPolicy": {"api": [{"podSelector": {"matchLabels": {"app": "blis"}}}]}}
    docs = manifests(render(CHART, values))
    np = one(docs, "NetworkPolicy", "query")
    assert np["spec"]["podSelector"]["matchLabels"] == QUERY_SELECTOR
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    # ingress: the API port only, from Prometheus and the API clients
    (rule,) = np["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9464}]
    fleet_http = next(
        r for r in one(docs, "NetworkPolicy")["spec"]["ingress"] if r["ports"][0]["port"] == 9464
    )
    assert rule["from"] == [
        p
        for p in fleet_http["from"]
        if "app.kubernetes.io/component" not in p.get("podSelector", {}).get("matchLabels", {})
    ]
    # egress: the fleet pods' API port, and DNS
    peers, dns = np["spec"]["egress"]
    fleet_pod = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert peers["ports"] == [{"protocol": "TCP", "port": 9464}]
    (to,) = peers["to"]
    assert set(to) == {"podSelector"} and _selects(to["podSelector"]["matchLabels"], fleet_pod)
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert dns["to"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
    ]
    # and the fleet admits the query tier on its API port
    assert {"podSelector": {"matchLabels": QUERY_SELECTOR}} in fleet_http["from"]
    off = manifests(render(CHART, {"networkPolicy": {"enabled": False}}))
    assert not by_kind(off, "NetworkPolicy")


def test_query_disabled_renders_none_of_it(wrapper: Path) -> None:
    for docs in (
        manifests(render(CHART, {"query": {"enabled": False}})),
        manifests(render(CHART, {**SIDECAR_VALUES, "query": {"enabled": False}})),
        manifests(render(wrapper, {"coeffd": {"query": {"enabled": False}}})),
    ):
        assert not [d for d in docs if "query" in d["metadata"]["name"]]
        assert not [d for d in docs if d["metadata"]["name"].endswith("-peers")]
        for np in by_kind(docs, "NetworkPolicy"):
            rules = np["spec"].get("ingress", [])
            assert "coeffd-query" not in yaml.safe_dump(rules)


def test_query_client_reuses_the_api_security(tmp_path: Path) -> None:
    docs = manifests(render(CHART, SECURED))
    q = _query_toml(docs)["query"]
    assert q["dns_scheme"] == "https"
    assert q["client"] == {
        "ca_file": "/etc/coeffd/tls/ca.crt",
        "cert_file": "/etc/coeffd/tls/tls.crt",  # clientCA: peers ask for a client cert
        "key_file": "/etc/coeffd/tls/tls.key",
        "server_name": "coeffd-headless.coeffd.svc",
        "bearer_token_file": "/etc/coeffd/token/token",
        "timeout_seconds": 5,
        "max_bytes": 67108864,
    }
    # its own API: the same TLS and token as the learners'
    assert _query_toml(docs)["http"] == tomllib.loads(config_toml(docs))["http"]
    c = _query_container(docs)
    assert all(c[p]["httpGet"]["scheme"] == "HTTPS" for p in ("livenessProbe", "readinessProbe"))
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert (
        mounts["coeffd-tls"] == "/etc/coeffd/tls" and mounts["coeffd-token"] == "/etc/coeffd/token"
    )
    volumes = {v["name"]: v for v in pod_spec(one(docs, "StatefulSet", "query"))["volumes"]}
    assert volumes["coeffd-tls"]["secret"]["secretName"] == "coeffd-tls"
    assert volumes["coeffd-token"]["secret"]["secretName"] == "coeffd-token"
    assert one(docs, "Service", "query")["spec"]["ports"][0]["appProtocol"] == "https"
    # without clientCA no client certificate; without TLS on http, plain http
    no_mtls = {**SECURED, "security": {**SECURED["security"], "tls": {"secretName": "coeffd-tls"}}}
    client = _query_toml(manifests(render(CHART, no_mtls)))["query"]["client"]
    assert client["cert_file"] == "" and client["ca_file"] == "/etc/coeffd/tls/ca.crt"
    plain = {"security": {"tls": {"secretName": "t", "listeners": ["otlp_grpc"]}}}
    q = _query_toml(manifests(render(CHART, plain)))["query"]
    assert q["dns_scheme"] == "http" and q["client"]["ca_file"] == ""


def test_query_config_loads_against_secrets_laid_out_as_mounted(tmp_path: Path) -> None:
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
    settings = _load(manifests(render(CHART, values)), tmp_path)
    assert settings.mode == "query"
    assert settings.query.client.ca_file == str(tls_dir / "ca.crt")
    assert settings.query.client.bearer_token_file == str(token_dir / "token")
    assert settings.http.tls.cert_file == str(tls_dir / "tls.crt")


def test_explicit_query_settings_win() -> None:
    values = {
        **SECURED,
        "query": {
            "settings": {
                "peers": "https://a.example:9464,dns+b.example:9464",
                "refresh_interval_seconds": 30,
                "client": {"server_name": "coeffd.example", "timeout_seconds": 2},
            }
        },
    }
    q = _query_toml(manifests(render(CHART, values)))["query"]
    assert q["peers"] == "https://a.example:9464,dns+b.example:9464"
    assert q["refresh_interval_seconds"] == 30
    assert q["client"]["server_name"] == "coeffd.example"
    assert q["client"]["ca_file"] == "/etc/coeffd/tls/ca.crt"  # still filled in


def test_fleet_without_headless_service_needs_explicit_peers() -> None:
    values = {"fleet": {"headlessService": {"enabled": False}}}
    with pytest.raises(helm_python.HelmRenderError, match=r"query\.enabled.*headlessService"):
        render(CHART, values)
    values["query"] = {"settings": {"peers": "http://coeffd-0.example:9464"}}
    q = _query_toml(manifests(render(CHART, values)))["query"]
    assert q["peers"] == "http://coeffd-0.example:9464"


def test_query_schema_rejects_bad_values() -> None:
    for bad, message in (
        ({"query": {"settings": {"peers": "ftp://x:1"}}}, r"/query/settings/peers"),
        ({"query": {"settings": {"dns_scheme": "tcp"}}}, r"/query/settings/dns_scheme"),
        ({"query": {"replicas": "one"}}, r"/query/replicas"),
        ({"query": {"settings": {"nope": 1}}}, r"additional properties 'nope'"),
    ):
        with pytest.raises(helm_python.HelmValuesError, match=message):
            render(CHART, bad)


def test_query_values_defaults_are_the_daemons() -> None:
    """values.yaml's query.settings: the daemon's [query] keys with its defaults, except
    what the chart fills in (""); all but the one every instance reads (not the query
    tier: settings.query of the learners)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["query"]["settings"]
    daemon = QuerySettings().model_dump()
    instance_side = {"statistics_interval_seconds"}
    assert set(values) == set(daemon) - instance_side
    assert set(values["client"]) == set(daemon["client"])
    filled = {"peers", "dns_scheme"}
    for key, value in values.items():
        if key == "client":
            for k, v in value.items():
                assert v == daemon["client"][k], k
        elif key not in filled:
            assert value == daemon[key], key


def test_query_service_monitor() -> None:
    values = {**SECURED, "query": {"serviceMonitor": {"enabled": True, "labels": {"r": "p"}}}}
    docs = manifests(render(CHART, values))
    sm = one(docs, "ServiceMonitor", "query")
    for version in K8S_VERSIONS:
        validate_k8s(sm, version)
    assert sm["metadata"]["labels"]["r"] == "p"
    assert sm["spec"]["selector"]["matchLabels"] == QUERY_SELECTOR
    # it selects the query Service only (not the learners' nor sidecar mode's peers one)
    selected = [
        s["metadata"]["name"]
        for s in by_kind(docs, "Service")
        if _selects(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert selected == ["coeffd-query"]
    (ep,) = sm["spec"]["endpoints"]
    assert (ep["port"], ep["path"], ep["scheme"]) == ("http", "/metrics", "https")
    assert ep["authorization"]["credentials"] == {"name": "coeffd-token", "key": "token"}
    sidecar = manifests(
        render(CHART, {**SIDECAR_VALUES, "query": {"serviceMonitor": {"enabled": True}}})
    )
    sm = one(sidecar, "ServiceMonitor", "query")
    peers = one(sidecar, "Service", "peers")
    assert not _selects(sm["spec"]["selector"]["matchLabels"], peers["metadata"]["labels"])
    assert not by_kind(manifests(render(CHART)), "ServiceMonitor")


def test_notes_point_pull_at_the_query_service() -> None:
    notes = render(CHART)["coeffd/templates/NOTES.txt"]
    assert "coeffd pull --server http://coeffd-query.coeffd.svc:9464" in notes
    notes = render(CHART, {"query": {"enabled": False}})["coeffd/templates/NOTES.txt"]
    assert "coeffd-query" not in notes
