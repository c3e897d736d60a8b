"""Configuration identity: stable ids, key-order insensitivity, resource vocabulary, resolver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from coeffd.learners.features.basis import BasisConfigError
from coeffd.learners.features.config import (
    BasisResolver,
    ConfigurationSettings,
    ServingConfig,
    ServingConfigError,
    engine_identity,
)
from coeffd.learners.features.hardware import HardwareError
from coeffd.learners.features.model import ModelConfigError
from coeffd.records.events import Source

FULL = {
    "model": "mixtral-8x7b-v0.1",
    "gpu": "H100",
    "tp": 2,
    "dp": 2,
    "ep": True,
    "moe_comm_backend": "deepep_low_latency",
    "model_config_hash": "abc123",
    "vllm_version": "0.11.0",
    "max_num_batched_tokens": 8192,
    "max_num_seqs": 256,
    "max_model_len": 32768,
    "chunked_prefill": True,
    "prefix_caching": True,
    "cpu_offload_gib": 64.0,
    "block_size": 16,
    "async_scheduling": True,
    "kv_cache_dtype": "auto",
}


def test_id_is_stable_across_processes() -> None:
    here = ServingConfig.from_dict(FULL).id
    code = (
        "import json,sys; from coeffd.learners.features.config import ServingConfig; "
        "print(ServingConfig.from_dict(json.loads(sys.argv[1])).id)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(dict(reversed(list(FULL.items()))))],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert out.stdout.strip() == here
    assert len(here) == 12 and int(here, 16) >= 0


@given(st.permutations(list(FULL)))
def test_id_insensitive_to_key_order(order: list[str]) -> None:
    assert (
        ServingConfig.from_dict({k: FULL[k] for k in order}).id == ServingConfig.from_dict(FULL).id
    )


def test_id_changes_with_every_field() -> None:
    base = ServingConfig.from_dict(FULL)
    changes = {
        "model": "x",
        "gpu": "A100-80",
        "tp": 4,
        "dp": 1,
        "ep": False,
        "moe_comm_backend": "",
        "model_config_hash": "",
        "vllm_version": "0.12",
        "max_num_batched_tokens": 2048,
        "max_num_seqs": 128,
        "max_model_len": 4096,
        "chunked_prefill": False,
        "prefix_caching": False,
        "cpu_offload_gib": 0.0,
        "block_size": 32,
        "async_scheduling": False,
        "kv_cache_dtype": "fp8",
    }
    ids = {base.id}
    for k, v in changes.items():
        ids.add(base.with_changes(**{k: v}).id)
    assert len(ids) == len(changes) + 1


def test_labels_readable() -> None:
    cfg = ServingConfig.from_dict(FULL)
    assert cfg.labels["config"] == cfg.id
    assert cfg.labels["tp"] == "2" and cfg.labels["ep"] == "true"
    assert "max_num_seqs" in cfg.labels
    assert cfg.short_label == "mixtral-8x7b-v0.1/H100/tp2/dp2"
    assert "vllm_version" not in ServingConfig(model="m", gpu="g").labels


def src(**attrs: str | int | float | bool) -> Source:
    return Source(id="s1", attributes=tuple(sorted(attrs.items())))


def test_from_resource_strings() -> None:
    attrs = {
        f"coeffd.{k}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in FULL.items()
    }
    s = src(**attrs, **{"coeffd.engine": "pod-7", "service.name": "vllm"})
    cfg = ServingConfig.from_resource(s)
    assert cfg == ServingConfig.from_dict(FULL)
    assert engine_identity(s) == "pod-7"
    # The engine identity is not part of the configuration.
    s2 = src(**attrs, **{"coeffd.engine": "pod-8"})
    assert ServingConfig.from_resource(s2).id == cfg.id
    assert engine_identity(src(**{"coeffd.model": "m"})) == "s1"


def test_from_resource_defaults_and_errors() -> None:
    cfg = ServingConfig.from_resource(
        src(**{"coeffd.model": "llama-3.1-8b-instruct", "coeffd.gpu": "H100"})
    )
    assert (cfg.tp, cfg.dp, cfg.block_size, cfg.chunked_prefill) == (1, 1, 16, None)
    with pytest.raises(ServingConfigError, match=r"coeffd\.gpu is missing"):
        ServingConfig.from_resource(src(**{"coeffd.model": "m"}))
    with pytest.raises(ServingConfigError, match=r"coeffd\.tp: expected an integer"):
        ServingConfig.from_resource(
            src(**{"coeffd.model": "m", "coeffd.gpu": "g", "coeffd.tp": "two"})
        )
    with pytest.raises(ServingConfigError, match=r"coeffd\.prefix_caching: expected a boolean"):
        ServingConfig.from_resource(
            src(**{"coeffd.model": "m", "coeffd.gpu": "g", "coeffd.prefix_caching": "maybe"})
        )
    with pytest.raises(ServingConfigError, match="tp: must be >= 1"):
        ServingConfig(model="m", gpu="g", tp=0)
    with pytest.raises(ServingConfigError, match="unknown configuration keys: colour"):
        ServingConfig.from_dict({"model": "m", "gpu": "g", "colour": "red"})
    # Unknown coeffd.* attributes are ignored (forward compatibility).
    assert (
        ServingConfig.from_resource(
            src(**{"coeffd.model": "m", "coeffd.gpu": "g", "coeffd.future": "1"})
        ).model
        == "m"
    )


def test_settings_to_config_and_basis(tmp_path: Path) -> None:
    s = ConfigurationSettings(model="llama-3.1-8b-instruct", hardware="H100", tp=2)
    cfg = s.serving_config()
    assert cfg.model == "llama-3.1-8b-instruct" and cfg.gpu == "H100" and cfg.model_config_hash
    assert s.basis().tp == 2
    # A path to a config.json, and a user hardware sheet.
    mdir = tmp_path / "my-model"
    mdir.mkdir()
    (mdir / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "torch_dtype": "bfloat16",
            }
        )
    )
    hw = tmp_path / "lab.json"
    hw.write_text(json.dumps({"G1": {"TFlopsPeak": 10, "BwPeakTBs": 0.1}}))
    s2 = ConfigurationSettings(model=str(mdir), hardware=str(hw), gpu="G1")
    assert s2.serving_config().model == "my-model" and s2.serving_config().gpu == "G1"
    assert s2.basis().hw.name == "G1"
    with pytest.raises(ValidationError):
        ConfigurationSettings(model="m", tp=0)
    with pytest.raises(ValidationError):
        ConfigurationSettings.model_validate({"model": "m", "bogus": 1})


def test_resolver_caches_and_reports() -> None:
    r = BasisResolver()
    cfg = ServingConfig(model="mixtral-8x7b-v0.1", gpu="H100", tp=2, dp=2, moe_comm_backend="pplx")
    b = r.basis(cfg)
    assert r.basis(cfg) is b and b.a2a
    with pytest.raises(HardwareError):
        r.basis(ServingConfig(model="llama-3.1-8b-instruct", gpu="TPU"))
    with pytest.raises(ModelConfigError):
        r.basis(ServingConfig(model="no-such", gpu="H100"))
    bad_tp = ServingConfig(model="llama-3.1-8b-instruct", gpu="H100", tp=16)
    for _ in range(2):  # cached error re-raised
        with pytest.raises(BasisConfigError, match="num_key_value_heads"):
            r.basis(bad_tp)


def test_resolver_model_paths(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "torch_dtype": "float16",
            }
        )
    )
    r = BasisResolver(model_paths={"Lab-Model": p})
    assert r.basis(ServingConfig(model="lab-model", gpu="A100-80")).model.num_layers == 2
    # Hash mismatch is a warning, not an error.
    assert r.basis(ServingConfig(model="lab-model", gpu="H100", model_config_hash="ffff")).tp == 1


def test_hf_id_on_the_wire_equals_static_bundled_name() -> None:
    wire = ServingConfig.from_resource(
        src(
            **{
                "coeffd.model": "meta-llama/Llama-3.1-8B-Instruct",
                "coeffd.gpu": "H100",
                "coeffd.tp": "2",
            }
        )
    )
    static = ConfigurationSettings(
        model="llama-3.1-8b-instruct", hardware="H100", tp=2
    ).serving_config()
    assert wire.model == "meta-llama/Llama-3.1-8B-Instruct"  # labels keep what was reported
    assert wire.id == static.id
    # A different config.json content is a different configuration.
    assert wire.with_changes(model_config_hash="0" * 12).id != static.id
    # Unknown models keep their name and (possibly empty) hash.
    assert ServingConfig(model="Private/Model", gpu="H100").identity()["model"] == "Private/Model"
