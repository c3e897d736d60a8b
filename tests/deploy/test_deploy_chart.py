"""The Helm chart: lint, render (default, fleet variants, sidecar) and validate every
manifest against Kubernetes' strict JSON schemas; check the properties the chart
promises (security context, probes, ports, stable storage, sidecar wiring)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from deploy_helpers import (
    CHART,
    DEPLOY,
    K8S_VERSIONS,
    by_kind,
    component,
    config_toml,
    lint,
    manifests,
    one,
    pod_spec,
    render,
    validate_k8s,
)

SIDECAR_VALUES: dict[str, Any] = {
    "mode": "sidecar",
    "settings": {
        "configuration": {"model": "Qwen/Qwen2.5-7B-Instruct", "hardware": "H100", "tp": 1}
    },
}

FLEET_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "fleet-all-on": {
        "mode": "fleet",
        "fleet": {
            "replicas": 3,
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "persistence": {"storageClassName": "fast-ssd", "size": "5Gi"},
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "podAnnotations": {"example.com/team": "inference"},
        "extraEnv": [{"name": "COEFFD_LOG__LEVEL", "value": "debug"}],
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "fleet-minimal": {
        "fleet": {
            "replicas": 1,
            "headlessService": {"enabled": False},
            "persistence": {"enabled": False},
            "podDisruptionBudget": {"enabled": False},
        },
        "query": {"enabled": False},
        "serviceAccount": {"create": False},
        "networkPolicy": {"enabled": False},
    },
}


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        if c["name"] == name:
            return dict(c)
    raise AssertionError(f"no container {name!r}")


def _assert_hardened(c: dict[str, Any]) -> None:
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # a sidecar's probe leaves out what must not take its vLLM out of the Service
    assert c["readinessProbe"]["httpGet"]["path"] in (
        "/readyz",
        "/readyz?exclude=kv,checkpoints,snapshots",
    )
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert c["args"] == ["serve", "--config", "/etc/coeffd/config.toml"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    # read-only root: every place the daemon writes is a volume
    assert mounts["/etc/coeffd"]["readOnly"] is True
    assert {"/tmp", "/var/lib/coeffd"} <= set(mounts)


def _assert_writable_dirs_mounted(c: dict[str, Any], toml_text: str) -> None:
    """With a read-only root filesystem, every directory the daemon writes must be on a
    mounted, writable volume."""
    data = tomllib.loads(toml_text)
    writable = [m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")]
    dirs = [data.get("publish", {}).get("snapshot_dir"), data.get("state", {}).get("state_dir")]
    for d in filter(None, dirs):
        assert any(d.startswith(m.rstrip("/") + "/") for m in writable), f"{d} is not on a volume"


def _assert_mounts_resolve(pod: dict[str, Any], claim_templates: list[str]) -> None:
    volumes = {v["name"] for v in pod.get("volumes", [])} | set(claim_templates)
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes, f"{c['name']} mounts undefined volume {m['name']}"
        port_names = {p["name"] for p in c.get("ports", [])}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in c:
                assert c[probe]["httpGet"]["port"] in port_names


@pytest.mark.parametrize("variant", sorted(FLEET_VARIANTS))
def test_chart_lints_clean(variant: str) -> None:
    assert lint(CHART, FLEET_VARIANTS[variant]) == []


def test_chart_lints_clean_in_sidecar_mode() -> None:
    assert lint(CHART, SIDECAR_VALUES) == []


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", sorted(FLEET_VARIANTS))
def test_fleet_manifests_validate(variant: str, version: str) -> None:
    docs = manifests(render(CHART, FLEET_VARIANTS[variant]))
    assert docs
    for doc in docs:
        validate_k8s(doc, version)


def test_fleet_mode_objects() -> None:
    docs = manifests(render(CHART, FLEET_VARIANTS["fleet-all-on"]))
    # the query tier's objects (component query) are checked in test_deploy_query.py
    kinds = sorted(d["kind"] for d in docs if component(d) is None)
    assert kinds == [
        "ConfigMap",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "StatefulSet",
    ]
    sts = one(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 3
    pod = pod_spec(sts)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    c = _container(pod, "coeffd")
    _assert_hardened(c)
    assert c["image"] == "ghcr.io/coeffd/coeffd:0.1.0"
    assert {"name": "COEFFD_LOG__LEVEL", "value": "debug"} in c["env"]
    vct = sts["spec"]["volumeClaimTemplates"]
    assert [t["metadata"]["name"] for t in vct] == ["coeffd-data"]
    assert vct[0]["spec"]["storageClassName"] == "fast-ssd"
    assert vct[0]["spec"]["resources"]["requests"]["storage"] == "5Gi"
    _assert_mounts_resolve(pod, ["coeffd-data"])
    _assert_writable_dirs_mounted(c, config_toml(docs))
    assert "checksum/config" in sts["spec"]["template"]["metadata"]["annotations"]

    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service") if component(s) is None}
    main, headless = services["coeffd"], services["coeffd-headless"]
    assert {p["name"]: p["port"] for p in main["spec"]["ports"]} == {
        "otlp-grpc": 4317,
        "otlp-http": 4318,
        "http": 9464,
    }
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == "coeffd-headless"
    container_ports = {p["name"] for p in c["ports"]}
    for svc in services.values():
        assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= container_ports
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["endpoints"][0]["port"] == "http"
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]


def test_fleet_minimal_uses_emptydir_and_no_optional_objects() -> None:
    docs = manifests(render(CHART, FLEET_VARIANTS["fleet-minimal"]))
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Service", "StatefulSet"]
    sts = one(docs, "StatefulSet")
    assert "volumeClaimTemplates" not in sts["spec"]
    pod = pod_spec(sts)
    assert {"name": "coeffd-data", "emptyDir": {}} in pod["volumes"]
    assert pod["serviceAccountName"] == "default"
    _assert_mounts_resolve(pod, [])


def test_ports_follow_settings_endpoints() -> None:
    values = {
        "settings": {
            "receivers": {"otlp_grpc": {"endpoint": "0.0.0.0:14317"}},
            "http": {"endpoint": "[::]:19464"},
        }
    }
    docs = manifests(render(CHART, values))
    c = _container(pod_spec(one(docs, "StatefulSet")), "coeffd")
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "otlp-grpc": 14317,
        "otlp-http": 4318,
        "coeffd-http": 19464,
    }
    main = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "coeffd")
    assert {p["port"] for p in main["spec"]["ports"]} == {14317, 4318, 19464}


def test_collector_routes_to_the_charts_headless_service() -> None:
    """deploy/otel-collector resolves exactly the Service the chart renders for the
    documented install (release `coeffd`, namespace `coeffd`)."""
    docs = manifests(render(CHART, {}, name="coeffd", namespace="coeffd"))
    headless = next(s for s in by_kind(docs, "Service") if s["spec"].get("clusterIP") == "None")
    cfg = yaml.safe_load((DEPLOY / "otel-collector" / "collector.yaml").read_text())
    lb = cfg["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "service"
    assert lb["resolver"]["k8s"]["service"] == f"{headless['metadata']['name']}.coeffd"
    assert lb["resolver"]["k8s"]["ports"] == [headless["spec"]["ports"][0]["port"]]
    assert cfg["service"]["pipelines"]["traces"]["exporters"] == ["loadbalancing"]
    assert set(cfg["service"]["pipelines"]["traces"]["receivers"]) == {"otlp"}


def test_sidecar_mode_chart_renders_only_the_configmap() -> None:
    """Of the learners' objects, sidecar mode renders only the ConfigMap (the vLLM chart
    renders the rest); with query.enabled=false nothing else at all."""
    rendered = render(CHART, {**SIDECAR_VALUES, "query": {"enabled": False}}, name="llama")
    docs = manifests(rendered)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [("ConfigMap", "llama-coeffd")]
    with_query = manifests(render(CHART, SIDECAR_VALUES, name="llama"))
    learners = [(d["kind"], d["metadata"]["name"]) for d in with_query if component(d) is None]
    assert learners == [("ConfigMap", "llama-coeffd"), ("ServiceAccount", "llama-coeffd")]
    for doc in docs:
        for version in K8S_VERSIONS:
            validate_k8s(doc, version)
    notes = rendered["coeffd/templates/NOTES.txt"]
    assert 'include "coeffd.sidecarContainer"' in notes
    assert "coeffd pull --server http://localhost:9464 --format flags" in notes


def test_notes_tell_how_to_point_vllm_and_pull() -> None:
    notes = render(CHART)["coeffd/templates/NOTES.txt"]
    assert "--otlp-traces-endpoint http://coeffd.coeffd.svc:4317" in notes
    assert "--enable-journey-tracing --step-tracing-enabled" in notes
    assert "OTEL_EXPORTER_OTLP_TRACES_INSECURE=true" in notes
    for fmt in ("flags", "yaml", "json"):
        assert f"--format {fmt}" in notes
    assert "--defaults" in notes


@pytest.mark.parametrize("native", [False, True])
def test_sidecar_wrapper_chart(wrapper: Path, native: bool) -> None:
    values: dict[str, Any] = {"coeffd": {"sidecar": {"native": native}}}
    assert lint(wrapper, values) == []
    docs = manifests(render(wrapper, values, name="llama", namespace="serving"))
    for doc in docs:
        for version in K8S_VERSIONS:
            validate_k8s(doc, version)
    kinds = sorted(d["kind"] for d in docs if component(d) is None)
    assert kinds == ["ConfigMap", "Deployment", "ServiceAccount"]  # SA: the query tier's
    pod = pod_spec(one(docs, "Deployment"))
    sidecar = _container(pod, "coeffd")
    _assert_hardened(sidecar)
    _assert_mounts_resolve(pod, [])
    _assert_writable_dirs_mounted(sidecar, config_toml(docs))
    if native:
        assert [c["name"] for c in pod["initContainers"]] == ["coeffd"]
        assert sidecar["restartPolicy"] == "Always"
    else:
        assert [c["name"] for c in pod["containers"]] == ["vllm", "coeffd"]
        assert "restartPolicy" not in sidecar
    # the pod's config volume is the ConfigMap the subchart renders
    cm = one(docs, "ConfigMap")
    cfg_vol = next(v for v in pod["volumes"] if v["name"] == "coeffd-config")
    assert cfg_vol["configMap"]["name"] == cm["metadata"]["name"] == "llama-coeffd"
    assert 'endpoint = "127.0.0.1:4317"' in config_toml(docs)


def test_sidecar_vllm_flags_mirror_the_identity(wrapper: Path) -> None:
    docs = manifests(render(wrapper, name="llama"))
    pod = pod_spec(one(docs, "Deployment"))
    vllm = _container(pod, "vllm")
    args: list[str] = vllm["args"]

    def flag(name: str) -> str:
        return args[args.index(name) + 1]

    ident = yaml.safe_load((wrapper / "values.yaml").read_text())["coeffd"]["settings"][
        "configuration"
    ]
    assert flag("--model") == ident["model"]
    assert flag("--tensor-parallel-size") == str(ident["tp"])
    assert flag("--data-parallel-size") == str(ident["dp"])
    assert flag("--max-num-batched-tokens") == str(ident["max_num_batched_tokens"])
    assert flag("--max-num-seqs") == str(ident["max_num_seqs"])
    assert flag("--max-model-len") == str(ident["max_model_len"])
    assert "--enable-chunked-prefill" in args and "--enable-prefix-caching" in args
    assert flag("--block-size") == "16"
    # telemetry into the sidecar over localhost (spec §0, §5.1)
    assert flag("--otlp-traces-endpoint") == "http://localhost:4317"
    assert "--enable-journey-tracing" in args and "--step-tracing-enabled" in args
    assert float(flag("--journey-tracing-sample-rate")) == 1.0
    assert float(flag("--step-tracing-sample-rate")) == 0.01
    assert float(flag("--step-tracing-rich-subsample-rate")) == 0.001
    assert yaml.safe_load(flag("--kv-events-config")) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
    }
    env = {e["name"]: e["value"] for e in vllm["env"]}
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "grpc"
    assert env["OTEL_EXPORTER_OTLP_TRACES_INSECURE"] == "true"
    assert env["OTEL_SERVICE_NAME"] == "vllm-llama31-8b-h100-tp2"
    assert env["OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"] == "otel,process"
    attrs = dict(kv.split("=", 1) for kv in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
    assert attrs["coeffd.model"] == ident["model"]
    assert attrs["coeffd.gpu"] == ident["hardware"]
    assert attrs["coeffd.tp"] == str(ident["tp"])
    # and the sidecar's own identity is the same configuration
    assert f'model = "{ident["model"]}"' in config_toml(docs)


def test_sidecar_http_protobuf_endpoint(wrapper: Path) -> None:
    values = {"coeffd": {"sidecar": {"vllm": {"otlpProtocol": "http/protobuf"}}}}
    pod = pod_spec(one(manifests(render(wrapper, values)), "Deployment"))
    vllm = _container(pod, "vllm")
    args = vllm["args"]
    # vLLM posts to exactly this URL (spec §1.3), so the path must be spelled out
    assert args[args.index("--otlp-traces-endpoint") + 1] == "http://localhost:4318/v1/traces"
    env = {e["name"]: e["value"] for e in vllm["env"]}
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"


def test_sidecar_template_refuses_fleet_mode(wrapper: Path) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=r"coeffd\.mode=sidecar"):
        render(wrapper, {"coeffd": {"mode": "fleet"}})


def test_image_tag_defaults_to_app_version_and_every_object_names_the_chart(
    wrapper: Path,
) -> None:
    """Issue 19: the image tag follows Chart.yaml's appVersion unless set, and every
    object carries ``helm.sh/chart`` (also the sidecar objects a parent chart renders)."""
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    chart_label = f"coeffd-{meta['version']}"
    docs = manifests(render(CHART, FLEET_VARIANTS["fleet-all-on"]))
    sts = one(docs, "StatefulSet")
    image = _container(pod_spec(sts), "coeffd")["image"]
    assert image.endswith(":" + meta["appVersion"])
    for doc in docs:
        assert doc["metadata"]["labels"]["helm.sh/chart"] == chart_label, doc["kind"]
    assert sts["spec"]["template"]["metadata"]["labels"]["helm.sh/chart"] == chart_label
    pinned = manifests(render(CHART, {"image": {"tag": "9.9.9"}}))
    assert _container(pod_spec(one(pinned, "StatefulSet")), "coeffd")["image"].endswith(":9.9.9")
    # a parent chart renders the sidecar: the tag is still coeffd's appVersion
    pod = pod_spec(one(manifests(render(wrapper, name="llama")), "Deployment"))
    images = [c["image"] for c in pod.get("initContainers", []) + pod["containers"]]
    assert any(i.endswith("coeffd:" + meta["appVersion"]) for i in images), images
