"""Shared helpers for the deploy tests: render the chart with the real Helm SDK, parse
the manifests, validate them against Kubernetes' JSON schemas, read the metric contract.

Rendering goes through ``helm_python`` (Helm v4's Go SDK via ctypes), i.e. the same
template engine, values coalescing and ``values.schema.json`` enforcement as
``helm template``; validation through ``kubernetes_validate``'s bundled, strict schemas.
Nothing here touches the network.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "coeffd"
WRAPPER = Path(__file__).resolve().parent / "charts" / "vllm-with-coeffd"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
DEPLOY = REPO / "deploy"

#: The newest Kubernetes the bundled schemas know, and the oldest the chart supports
#: (Chart.yaml kubeVersion; native sidecars need 1.29).
K8S_VERSIONS = (kubernetes_validate.latest_version(), "1.29.0")

#: Kinds that are CRDs, not core Kubernetes: validated against our own subset of the
#: CRD's OpenAPI schema (kubernetes_validate bundles only built-in kinds).
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", kind): SCHEMAS / f"{kind.lower()}.json"
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
}


def render(
    chart_dir: Path,
    values: dict[str, Any] | None = None,
    *,
    name: str = "coeffd",
    namespace: str = "coeffd",
) -> dict[str, str]:
    """Render a chart offline; returns template path → text (NOTES.txt included)."""
    with helm_python.Chart.load(chart_dir) as chart:
        return chart.render(values, name=name, namespace=namespace, is_install=True)


def manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object in a render, in template order."""
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append(doc)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def component(doc: dict[str, Any]) -> str | None:
    """``app.kubernetes.io/component`` of an object: ``query`` for the query tier's,
    ``peers`` for sidecar mode's peers Service, None for the learners' (fleet/sidecar)."""
    labels = doc.get("metadata", {}).get("labels") or {}
    value = labels.get("app.kubernetes.io/component")
    return str(value) if value is not None else None


def one(docs: list[dict[str, Any]], kind: str, of: str | None = None) -> dict[str, Any]:
    """The one ``kind`` object of component ``of`` (default: the learners' objects, so a
    query tier rendered beside them does not make "the StatefulSet" ambiguous)."""
    found = [d for d in by_kind(docs, kind) if component(d) == of]
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def validate_k8s(doc: dict[str, Any], version: str) -> None:
    """Strict schema validation (unknown fields are errors), CRDs against our subset."""
    crd = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if crd is not None:
        jsonschema.Draft7Validator(json.loads(crd.read_text())).validate(doc)
        return
    kubernetes_validate.validate(doc, version, strict=True)


def lint(chart_dir: Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Helm lint findings of severity warning (2) or error (3), strict mode."""
    report = helm_python.lint(
        chart_dir, values, strict=True, kube_version="v" + K8S_VERSIONS[0].lstrip("v")
    )
    assert report["total_charts_linted"] >= 1
    return [m for m in report["messages"] if m["severity"] >= 2] + [
        {"severity": 3, "error": e} for e in report["errors"]
    ]


def wrapper_chart(dest: Path) -> Path:
    """The test-only vLLM chart with helm/coeffd vendored as its subchart."""
    out = dest / WRAPPER.name
    shutil.copytree(WRAPPER, out)
    shutil.copytree(CHART, out / "charts" / "coeffd")
    return out


def config_toml(docs: list[dict[str, Any]], of: str | None = None) -> str:
    """The config.toml of the (only) coeffd ConfigMap of component ``of`` (default: the
    learners'; ``"query"``: the query tier's)."""
    cms = [
        d
        for d in by_kind(docs, "ConfigMap")
        if "config.toml" in d.get("data", {}) and component(d) == of
    ]
    assert len(cms) == 1
    text: str = cms[0]["data"]["config.toml"]
    return text


def contract_metrics() -> dict[str, str]:
    """CONTRIBUTING.md's metric table: name → type (counter, gauge, histogram)."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text.split("## Metric names", 1)[1]
    out: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`coeffd_"):
            continue
        for name in re.findall(r"`(coeffd_[a-z0-9_]+)`", cells[0]):
            out[name] = cells[1]
    return out


def sample_names(family: str, kind: str) -> set[str]:
    """The series names a metric family of ``kind`` exposes to PromQL."""
    base = family.removesuffix("_total")
    if kind == "counter":
        return {base + "_total", base + "_created"}
    if kind == "histogram":
        return {family + s for s in ("_bucket", "_sum", "_count", "_created")}
    if kind == "summary":
        return {family, family + "_sum", family + "_count", family + "_created"}
    return {family}


_METRIC_RE = re.compile(r"\bcoeffd_[a-z0-9_]+\b")


def referenced_metrics(text: str) -> set[str]:
    """coeffd_* series names used in PromQL expressions inside ``text``."""
    return set(_METRIC_RE.findall(text))


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL string of a Grafana dashboard: panel targets, variables, annotations."""
    exprs: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if "expr" in t)
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    for var in dashboard.get("templating", {}).get("list", []):
        q = var.get("query")
        if isinstance(q, dict):
            exprs.append(q.get("query", ""))
        elif var.get("type") == "query" and isinstance(q, str):
            exprs.append(q)
    exprs.extend(a["expr"] for a in dashboard.get("annotations", {}).get("list", []) if "expr" in a)
    return exprs


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a Deployment or StatefulSet."""
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec
