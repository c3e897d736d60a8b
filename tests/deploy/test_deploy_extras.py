"""Chart fixes from the newcomer report (issue 33, item 10): extra volumes, mounts, args
and env on every coeffd container (models that are not bundled, for settings.catalog),
the optional PrometheusRule, Grafana dashboard ConfigMap and sidecar PodMonitor, the
availability alerts with runbooks, the image and vLLM-fork notes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import (
    CHART,
    DEPLOY,
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

from coeffd.daemon.settings import check_startup, load_settings

ALERTS = DEPLOY / "prometheus" / "coeffd-alerts.yaml"
DASHBOARD = DEPLOY / "grafana" / "coeffd-dashboard.json"

MODELS_MOUNT = "/etc/coeffd-catalog/models"
EXTRAS: dict[str, Any] = {
    "extraVolumes": [{"name": "models", "configMap": {"name": "my-models"}}],
    "extraVolumeMounts": [{"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True}],
    "extraArgs": ["--log-level", "debug"],
    "extraEnv": [{"name": "COEFFD_LOG__FORMAT", "value": "json"}],
    "settings": {"catalog": {"models_dir": MODELS_MOUNT}},
}


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod.get("initContainers", []) + pod["containers"]}


def _assert_extras(pod: dict[str, Any], container: dict[str, Any]) -> None:
    assert {"name": "models", "configMap": {"name": "my-models"}} in pod["volumes"]
    assert EXTRAS["extraVolumeMounts"][0] in container["volumeMounts"]
    assert EXTRAS["extraEnv"][0] in container["env"]
    names = [v["name"] for v in pod["volumes"]]
    assert len(names) == len(set(names))


def test_extra_volumes_mounts_args_env_on_every_coeffd_container(wrapper: Path) -> None:
    docs = manifests(render(CHART, EXTRAS))
    for doc in docs:
        for version in K8S_VERSIONS:
            validate_k8s(doc, version)
    assert lint(CHART, EXTRAS) == []
    fleet = pod_spec(one(docs, "StatefulSet"))
    c = _containers(fleet)["coeffd"]
    _assert_extras(fleet, c)
    assert c["args"] == ["serve", "--config", "/etc/coeffd/config.toml", "--log-level", "debug"]
    # the query tier resolves the same catalog: same volume and mount, its own args
    query = pod_spec(one(docs, "StatefulSet", "query"))
    q = _containers(query)["coeffd-query"]
    _assert_extras(query, q)
    assert q["args"] == ["serve", "--config", "/etc/coeffd/config.toml"]
    for of in (None, "query"):
        assert f'models_dir = "{MODELS_MOUNT}"' in config_toml(docs, of)
    # sidecar mode: through "coeffd.sidecarVolumes" into the vLLM pod
    sidecar_docs = manifests(render(wrapper, {"coeffd": EXTRAS}, name="llama"))
    pod = pod_spec(one(sidecar_docs, "Deployment"))
    _assert_extras(pod, _containers(pod)["coeffd"])
    for doc in sidecar_docs:
        validate_k8s(doc, K8S_VERSIONS[0])
    settings = {**SIDECAR_VALUES["settings"], **EXTRAS["settings"]}
    values = {**SIDECAR_VALUES, **EXTRAS, "settings": settings, "query": {"extraArgs": ["-x"]}}
    query = manifests(render(CHART, values))
    q = _containers(pod_spec(one(query, "StatefulSet", "query")))["coeffd-query"]
    assert q["args"][-1] == "-x"


def test_catalog_on_an_extra_mount_passes_the_daemons_start_up_checks(tmp_path: Path) -> None:
    """The documented example: models_dir on the extra mount, laid out here as a tmp
    dir, loads and passes `serve`'s start-up checks, for the learners and the query tier."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "my-model.json").write_text("{}")
    values: dict[str, Any] = {
        **EXTRAS,
        "extraVolumeMounts": [{"name": "models", "mountPath": str(models), "readOnly": True}],
        "settings": {
            "catalog": {"models_dir": str(models)},
            "publish": {"snapshot_dir": str(tmp_path / "snapshots")},
            "state": {"state_dir": str(tmp_path / "state")},
        },
    }
    docs = manifests(render(CHART, values))
    for of in (None, "query"):
        path = tmp_path / f"{of or 'learners'}.toml"
        path.write_text(config_toml(docs, of))
        settings = load_settings(config=path, environ={})
        assert settings.catalog.models_dir == str(models)
        check_startup(settings)
    (models / "my-model.json").unlink()
    models.rmdir()
    with pytest.raises(Exception, match=r"catalog\.models_dir.*not a directory"):
        check_startup(load_settings(config=tmp_path / "learners.toml", environ={}))


def test_extra_values_schema() -> None:
    with pytest.raises(Exception, match=r"/extraVolumeMounts/0': missing property 'mountPath'"):
        render(CHART, {"extraVolumeMounts": [{"name": "models"}]})
    with pytest.raises(Exception, match=r"/extraArgs/0': got number, want string"):
        render(CHART, {"extraArgs": [1]})


def test_prometheus_rule_carries_the_alert_file() -> None:
    assert not by_kind(manifests(render(CHART)), "PrometheusRule")
    values = {"prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}}}
    assert lint(CHART, values) == []
    rule = one(manifests(render(CHART, values)), "PrometheusRule")
    for version in K8S_VERSIONS:
        validate_k8s(rule, version)
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    # relative runbook links made absolute for Alertmanager
    base = {"prometheusRule": {"enabled": True, "runbookBaseUrl": "https://git.example/c/blob/v1/"}}
    rule = one(manifests(render(CHART, base)), "PrometheusRule")
    urls = [
        r["annotations"]["runbook_url"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "runbook_url" in r["annotations"]
    ]
    assert "https://git.example/c/blob/v1/helm/coeffd/README.md#runbook-coeffddown" in urls
    # every alert links a runbook (docs/RUNBOOK.md or the chart's README), each made absolute
    assert len(urls) == sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert all(u.startswith("https://git.example/c/blob/v1/") and "//" not in u[8:] for u in urls)


def test_grafana_dashboard_configmap() -> None:
    assert not [d for d in manifests(render(CHART)) if d["metadata"]["name"].endswith("-dashboard")]
    values = {"grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "coeffd"}}}
    docs = manifests(render(CHART, values, name="perf"))
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "coeffd-dashboard.json" in d["data"]]
    for version in K8S_VERSIONS:
        validate_k8s(cm, version)
    assert cm["metadata"]["name"] == "perf-coeffd-dashboard"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "coeffd"}
    assert json.loads(cm["data"]["coeffd-dashboard.json"]) == json.loads(DASHBOARD.read_text())
    # the ConfigMap the learners mount is still the only one with a config.toml
    assert "coeffd pull" not in cm["data"]["coeffd-dashboard.json"]
    config_toml(docs)


def test_sidecar_pod_monitor_selects_the_vllm_pods(wrapper: Path) -> None:
    values = {"coeffd": {"sidecar": {"podMonitor": {"enabled": True, "labels": {"r": "p"}}}}}
    docs = manifests(render(wrapper, values, name="llama", namespace="serving"))
    pm = one(docs, "PodMonitor")
    for version in K8S_VERSIONS:
        validate_k8s(pm, version)
    vllm = one(docs, "Deployment")
    labels = vllm["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["serving"]}
    assert pm["metadata"]["labels"]["r"] == "p"
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    sidecar = _containers(pod_spec(vllm))["coeffd"]
    assert ep["port"] in {p["name"] for p in sidecar["ports"]} and ep["path"] == "/metrics"
    assert "scheme" not in ep
    # TLS on the sidecar's API: https, the given tlsConfig, the token when /metrics is guarded
    secured = {
        **SIDECAR_VALUES,
        "security": {
            "tls": {"secretName": "t", "listeners": ["http"]},
            "token": {"secretName": "tok", "listeners": ["http"]},
        },
        "settings": {**SIDECAR_VALUES["settings"], "http": {"metrics_public": False}},
        "sidecar": {"podMonitor": {"enabled": True, "tlsConfig": {"serverName": "x"}}},
    }
    (ep,) = one(manifests(render(CHART, secured)), "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert ep["scheme"] == "https" and ep["tlsConfig"] == {"serverName": "x"}
    assert ep["authorization"]["credentials"] == {"name": "tok", "key": "token"}
    # fleet mode scrapes through its ServiceMonitor; no PodMonitor
    assert not by_kind(
        manifests(render(CHART, {"sidecar": {"podMonitor": {"enabled": True}}})), "PodMonitor"
    )


def _rules() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"]}


def test_availability_alerts_with_runbooks() -> None:
    rules = _rules()
    assert re.fullmatch(r'up\{job=~"[^"]*coeffd[^"]*"\} == 0', rules["CoeffdDown"]["expr"])
    assert rules["CoeffdAbsent"]["expr"] == "absent(coeffd_build_info)"
    assert "increase(coeffd_thread_restarts_total[" in rules["CoeffdThreadRestarts"]["expr"]
    readme = (CHART / "README.md").read_text()
    for name in ("CoeffdDown", "CoeffdAbsent", "CoeffdThreadRestarts"):
        url = rules[name]["annotations"]["runbook_url"]
        assert url == f"helm/coeffd/README.md#runbook-{name.lower()}"
        assert f"### Runbook: {name}" in readme


def test_readme_says_how_to_build_and_name_the_image() -> None:
    readme = (CHART / "README.md").read_text()
    section = readme.split("## Image", 1)[1].split("\n## ", 1)[0]
    assert "No coeffd image is published" in section
    assert "docker build -f deploy/Dockerfile" in section and "docker push" in section
    assert "--set image.repository=" in section
    values = (CHART / "values.yaml").read_text()
    assert "No coeffd image is published" in values


def test_sidecar_example_names_the_vllm_fork() -> None:
    """The tracing flags are the inference-sim/vllm fork's: the example must not run
    them on stock vLLM's image, and says so."""
    text = (DEPLOY / "kubernetes" / "vllm-coeffd-sidecar.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    pod = pod_spec(one(docs, "Deployment"))
    vllm = _containers(pod)["vllm"]
    assert "--enable-journey-tracing" in vllm["args"]
    assert not vllm["image"].startswith("vllm/vllm-openai")
    assert "inference-sim/vllm" in text
    readme = (CHART / "README.md").read_text()
    assert "image: vllm/vllm-openai" not in readme and "inference-sim/vllm" in readme
