"""values.schema.json rejects bad values with a message that names the field — through
Helm itself (the check `helm install/template` runs) and as a plain JSON Schema."""

from __future__ import annotations

import json
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml
from deploy_helpers import CHART, render

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
IDENTITY = {"model": "meta-llama/Llama-3.1-8B-Instruct", "hardware": "H100", "tp": 2}

BAD: dict[str, tuple[dict[str, Any], str]] = {
    "wrong type": ({"fleet": {"replicas": "three"}}, r"/fleet/replicas': got string, want integer"),
    "wrong type in settings": (
        {"settings": {"pipeline": {"queue_capacity": "big"}}},
        r"/settings/pipeline/queue_capacity': got string, want integer",
    ),
    "malformed endpoint": (
        {"settings": {"http": {"endpoint": "9464"}}},
        r"/settings/http/endpoint': .*does not match pattern",
    ),
    "unknown mode": ({"mode": "daemonset"}, r"/mode': value must be one of 'fleet', 'sidecar'"),
    "unknown top-level key": ({"replicas": 3}, r"additional properties 'replicas' not allowed"),
    "bad vLLM protocol": (
        {"sidecar": {"vllm": {"otlpProtocol": "http/json"}}},
        r"/sidecar/vllm/otlpProtocol': value must be one of 'grpc', 'http/protobuf'",
    ),
    "sidecar without identity": (
        {"mode": "sidecar"},
        r"/settings': missing property 'configuration'",
    ),
    **{
        f"sidecar without {field}": (
            {
                "mode": "sidecar",
                "settings": {"configuration": {k: v for k, v in IDENTITY.items() if k != field}},
            },
            rf"/settings/configuration': missing property '{field}'",
        )
        for field in IDENTITY
    },
    "sidecar with tp 0": (
        {"mode": "sidecar", "settings": {"configuration": {**IDENTITY, "tp": 0}}},
        r"/settings/configuration/tp': minimum: got 0, want 1",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_helm_rejects_bad_values_naming_the_field(case: str) -> None:
    values, message = BAD[case]
    with (
        helm_python.Chart.load(CHART) as chart,
        pytest.raises(helm_python.HelmValuesError, match=message),
    ):
        chart.validate_schema(values)
    # and rendering (what `helm template` / `install` do) refuses them too
    with pytest.raises(helm_python.HelmValuesError, match=message):
        render(CHART, values)


@pytest.mark.parametrize(
    "values",
    [{}, {"mode": "fleet"}, {"mode": "sidecar", "settings": {"configuration": IDENTITY}}],
    ids=["default", "fleet", "sidecar"],
)
def test_good_values_pass(values: dict[str, Any]) -> None:
    with helm_python.Chart.load(CHART) as chart:
        chart.validate_schema(values)
        merged = chart.merge_values(values)
    # The schema is a valid draft-07 schema on its own, and accepts the merged values.
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.Draft7Validator(SCHEMA).validate(merged)


def test_plain_jsonschema_names_the_missing_identity_field() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    values = {**defaults, "mode": "sidecar", "settings": {**defaults["settings"]}}
    values["settings"]["configuration"] = {"model": "m", "tp": 1}
    errors = list(jsonschema.Draft7Validator(SCHEMA).iter_errors(values))
    leaves = [e for err in errors for e in (err.context or [err])]
    assert any("'hardware' is a required property" in e.message for e in leaves), errors


def test_documented_values_match_the_schema() -> None:
    """Every key in values.yaml is declared by the schema (no undocumented knobs), so
    `additionalProperties: false` at the top cannot reject the chart's own defaults."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(defaults) <= set(SCHEMA["properties"])
    jsonschema.Draft7Validator(SCHEMA).validate(defaults)
