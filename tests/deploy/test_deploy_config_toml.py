"""The ConfigMap's config.toml is what the values asked for, and the daemon's own
settings loader (daemon.settings.load_settings, the code `coeffd serve --config` runs)
accepts it and ends up with exactly those values."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import CHART, REPO, config_toml, manifests, one, render, wrapper_chart

from coeffd.daemon.settings import Settings, load_settings
from coeffd.learners.features.config import ConfigurationSettings, ServingConfig
from coeffd.records.events import Source

DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())["settings"]

NON_DEFAULT: dict[str, Any] = {
    "log": {"level": "debug", "format": "console", "rate_limit_seconds": 2.5},
    "receivers": {
        "otlp_grpc": {"endpoint": "0.0.0.0:14317", "workers": 8, "max_message_bytes": 67108864},
        "otlp_http": {"enabled": False, "endpoint": "[::]:14318"},
        "retry_after_seconds": 0.25,
    },
    "http": {"endpoint": "0.0.0.0:19464"},
    "pipeline": {"queue_capacity": 1234, "drain_timeout_seconds": 0, "tick_interval_seconds": 0.5},
}

IDENTITY: dict[str, Any] = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "hardware": "H100",
    "tp": 2,
    "dp": 1,
    "max_num_batched_tokens": 8192,
    "max_num_seqs": 256,
    "chunked_prefill": True,
    "prefix_caching": False,
    "cpu_offload_gib": 0.5,
}


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    """What TOML can carry: a null in the values means "key absent"."""
    return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


def _expected(settings: dict[str, Any], mode: str) -> dict[str, Any]:
    return {**_drop_none(settings), "mode": mode}


def _load(toml_text: str, tmp_path: Path) -> Settings:
    path = tmp_path / "config.toml"
    path.write_text(toml_text)
    return load_settings(config=path, environ={})


def _subset(actual: Any, wanted: Any) -> Any:
    """``actual`` restricted to the keys of ``wanted`` (recursively)."""
    if isinstance(wanted, dict):
        return {k: _subset(actual[k], v) for k, v in wanted.items()}
    return actual


def test_values_document_every_setting() -> None:
    """values.yaml's `settings` uses only the daemon's sections and keys, with the
    daemon's defaults except where the chart deliberately differs. Daemon keys the chart
    does not list yet (sections landing later) only warn: the daemon's defaults apply."""
    daemon = Settings().model_dump()
    chart_flat = _flatten(DEFAULTS)
    daemon_flat = _flatten(daemon)
    assert set(chart_flat) <= set(daemon_flat), set(chart_flat) - set(daemon_flat)
    # JSON logs in a cluster, not "auto"; data on the mounted volume, not relative to CWD
    chart_differs = {("log", "format"), ("publish", "snapshot_dir"), ("state", "state_dir")}
    # Bounded lower so that resources.limits.memory holds (test_deploy_security checks it)
    memory_bounds = {
        ("receivers", "otlp_grpc", "max_message_bytes"),
        ("receivers", "otlp_http", "max_body_bytes"),
        ("receivers", "otlp_http", "max_connections"),
        ("receivers", "limits", "max_items"),
    }
    for key, value in chart_flat.items():
        if key[:2] not in chart_differs and key not in memory_bounds:
            assert daemon_flat[key] == value, key
    # Left to the daemon on purpose: tuning sections (values.yaml says how to override),
    # the mode (derived from the chart's mode) and the sidecar identity (no default).
    # [query] is the query tier's, from values `query.settings` (test_deploy_query.py).
    delegated = {"joiner", "learners", "mode", "configuration", "query"}
    unlisted = sorted(
        ".".join(k) for k in set(daemon_flat) - set(chart_flat) if k[0] not in delegated
    )
    assert not unlisted, f"helm/coeffd/values.yaml does not list settings {unlisted}"


def test_values_render_every_key_config_example_documents() -> None:
    """For each section the chart lists, every key config.example.toml documents is in
    values.yaml (same names, same nesting)."""
    example = tomllib.loads((REPO / "config.example.toml").read_text())
    chart_flat = _flatten(DEFAULTS)
    example_flat = _flatten(example)
    shared = [k for k in example_flat if k[0] in DEFAULTS]
    assert shared, "config.example.toml shares no section with the chart"
    missing = sorted(".".join(k) for k in shared if k not in chart_flat)
    assert not missing, f"values.yaml lacks documented settings {missing}"


def _flatten(d: dict[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, (*prefix, k)))
        else:
            out[(*prefix, k)] = v
    return out


@pytest.mark.parametrize("overrides", [{}, NON_DEFAULT], ids=["defaults", "non-default"])
def test_fleet_configmap_loads_with_daemon_settings(
    overrides: dict[str, Any], tmp_path: Path
) -> None:
    text = config_toml(manifests(render(CHART, {"settings": overrides})))
    wanted = _expected(_merge(DEFAULTS, overrides), "standalone")
    assert tomllib.loads(text) == wanted
    settings = _load(text, tmp_path)
    assert _subset(settings.model_dump(), wanted) == wanted


def test_null_unsets_a_key_so_the_daemon_default_applies(tmp_path: Path) -> None:
    values = {"settings": {"pipeline": {"queue_capacity": None}}}
    text = config_toml(manifests(render(CHART, values)))
    assert "queue_capacity" not in tomllib.loads(text)["pipeline"]
    default = Settings().pipeline.queue_capacity
    assert _load(text, tmp_path).pipeline.queue_capacity == default


def test_strings_that_need_escaping_survive(tmp_path: Path) -> None:
    """TOML quoting is done by the chart's own renderer: quotes, backslashes, unicode."""
    path = 'C:\\odd "dir"/ünï'
    text = config_toml(
        manifests(
            render(
                CHART,
                {
                    "mode": "sidecar",
                    "settings": {"configuration": {**IDENTITY, "kv_cache_dtype": path}},
                },
            )
        )
    )
    assert tomllib.loads(text)["configuration"]["kv_cache_dtype"] == path


def test_sidecar_configmap_identity_and_localhost(tmp_path: Path) -> None:
    values = {"mode": "sidecar", "settings": {"configuration": IDENTITY}}
    text = config_toml(manifests(render(CHART, values)))
    data = tomllib.loads(text)
    # what the values asked for, with the OTLP receivers pinned to localhost
    wanted = _expected(_merge(DEFAULTS, {"configuration": IDENTITY}), "sidecar")
    wanted["receivers"]["otlp_grpc"]["endpoint"] = "127.0.0.1:4317"
    wanted["receivers"]["otlp_http"]["endpoint"] = "127.0.0.1:4318"
    # vLLM publishes KV events on tcp://*:5557 (+ DP rank); the sidecar subscribes locally
    wanted["kv"]["endpoints"] = ["tcp://127.0.0.1:5557"]
    assert data == wanted
    # the identity is a valid ConfigurationSettings (the daemon's [configuration] model)
    ident = ConfigurationSettings(**data["configuration"])
    assert ident.model_dump(include=set(IDENTITY)) == IDENTITY
    assert ident.serving_config().labels["gpu"] == "H100"
    if "configuration" in Settings.model_fields:
        settings = _load(text, tmp_path)
        assert _subset(settings.model_dump(), wanted) == wanted
    else:
        # daemon/settings.py has no [configuration] section yet: the rest must load.
        rest = {k: v for k, v in data.items() if k != "configuration"}
        assert _subset(load_settings(overrides=rest, environ={}).model_dump(), rest) == rest


def test_sidecar_resource_attributes_describe_the_same_configuration(tmp_path: Path) -> None:
    """The coeffd.* attributes the chart puts on vLLM parse with the daemon's resource
    vocabulary into the configuration the sidecar's static identity describes."""
    chart = wrapper_chart(tmp_path)
    values = {"coeffd": {"settings": {"configuration": IDENTITY}}}
    docs = manifests(render(chart, values))
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    env = {e["name"]: e["value"] for e in vllm["env"]}
    attrs = tuple(tuple(kv.split("=", 1)) for kv in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
    from_resource = ServingConfig.from_resource(Source(id="vllm", attributes=attrs))  # type: ignore[arg-type]
    static = ConfigurationSettings(**tomllib.loads(config_toml(docs))["configuration"])
    expected = static.serving_config()
    # Model is given as the HF id on the wire; the static path canonicalises it and adds
    # the config.json hash. Everything else must agree field by field.
    for field in ("gpu", "tp", "dp", "max_num_batched_tokens", "max_num_seqs"):
        assert getattr(from_resource, field) == getattr(expected, field), field
    for field in ("chunked_prefill", "prefix_caching", "cpu_offload_gib", "block_size"):
        assert getattr(from_resource, field) == getattr(expected, field), field
    assert from_resource.model == IDENTITY["model"]
