"""ModelSpec parsing (spec §1.1/§1.2), derived facts, catalogue values (§9.3), bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from features_support import DENSE_TEST

from coeffd.learners.features.catalog import MODELS, load_model, model_config, resolve_model
from coeffd.learners.features.model import (
    ModelConfigError,
    ModelSpec,
    config_hash,
    weight_bytes_from_name,
)

# The repository's dense test model (Llama-3.1-8B numbers) as a plain config dict.
BASE: dict[str, Any] = dict(DENSE_TEST.raw)


def parse(**over: Any) -> ModelSpec:
    cfg = {**BASE, **over}
    return ModelSpec.from_config({k: v for k, v in cfg.items() if v is not ...}, strict=False)


# --------------------------------------------------------------------------- P1–P3


def test_p1_text_config_pivot_overwrites_top_level() -> None:
    spec = ModelSpec.from_config(
        {
            "hidden_size": 1,
            "quantization_config": {"quant_method": "fp8"},
            "text_config": {**BASE, "hidden_size": 5120, "num_attention_heads": 40},
        }
    )
    assert spec.hidden_dim == 5120 and spec.num_heads == 40
    assert spec.quantized_weight_bytes == 1.0  # rest of the top level stays readable


def test_p1_text_config_not_an_object_is_ignored() -> None:
    assert parse(text_config="x").hidden_dim == 4096


@pytest.mark.parametrize(
    ("value", "expected"),
    [(4096.9, 4096), (-3.7, -3), (None, 0), ("4096", 0), (True, 0), ([4096], 0), ({"a": 1}, 0)],
)
def test_p2_int_reading(value: Any, expected: int) -> None:
    assert parse(num_hidden_layers=value).num_layers == expected


def test_p3_kv_heads_fallback_chain() -> None:
    assert parse(num_key_value_heads=..., num_kv_heads=4).num_kv_heads == 4
    assert parse(num_key_value_heads=0, multi_query_group_num=2).num_kv_heads == 2
    assert parse(num_key_value_heads=...).num_kv_heads == 32  # H_kv = H
    assert parse(num_key_value_heads=-1, num_kv_heads=4).num_kv_heads == -1  # negative counts


def test_dtype_table() -> None:
    assert parse(torch_dtype="float32").bytes_per_param == 4
    assert parse(torch_dtype="float16").bytes_per_param == 2
    assert parse(torch_dtype="int4").bytes_per_param == 1
    assert parse(torch_dtype=..., dtype="bfloat16").bytes_per_param == 2
    # Unknown string torch_dtype gives 0 and dtype is NOT consulted.
    assert parse(torch_dtype="BFloat16", dtype="bfloat16").bytes_per_param == 0
    # Non-string torch_dtype falls through to dtype.
    assert parse(torch_dtype=16, dtype="float16").bytes_per_param == 2
    assert parse(torch_dtype=...).bytes_per_param == 0


def test_dff_fallback() -> None:
    assert parse(intermediate_size=..., ffn_hidden_size=11008).intermediate_dim == 11008
    assert parse(intermediate_size=0, ffn_hidden_size=11008).intermediate_dim == 11008


def test_expert_count_walk_threshold_two() -> None:
    assert parse(num_experts=1, num_local_experts=8).num_experts == 8  # notes item 17
    assert parse(num_experts=128, n_routed_experts=64).num_experts == 128
    assert parse(moe_num_experts=4).num_experts == 4
    assert parse(num_routed_experts=16).num_experts == 16
    assert parse(num_experts=1).num_experts == 0
    assert not parse(num_experts=1).is_moe


def test_shared_expert_width_rule() -> None:
    assert parse(shared_expert_intermediate_size=5632).shared_expert_ffn_dim == 5632
    assert parse(n_shared_experts=2, moe_intermediate_size=1408).shared_expert_ffn_dim == 2816
    assert parse(n_shared_experts=2).shared_expert_ffn_dim == 2 * 14336
    assert (
        parse(shared_expert_intermediate_size=0, n_shared_experts=1).shared_expert_ffn_dim == 14336
    )
    assert parse().shared_expert_ffn_dim == 0


def test_interleave_and_dense_width() -> None:
    s = parse(
        num_local_experts=16,
        num_experts_per_tok=1,
        interleave_moe_layer_step=1,
        intermediate_size_mlp=16384,
    )
    assert (s.moe_layers, s.dense_layers, s.interleaved, s.dense_ffn_dim) == (16, 16, True, 16384)
    s2 = parse(num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=2)
    assert (s2.moe_layers, s2.dense_layers) == (10, 22)
    s3 = parse(num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=40)  # L < s+1
    assert (s3.moe_layers, s3.interleaved) == (0, True)
    assert parse(interleave_moe_layer_step=1).moe_layers == 0  # dense ignores s


@pytest.mark.parametrize(
    ("qc", "w"),
    [
        ({"bits": 4}, 0.5),
        ({"bits": "8"}, 1.0),
        ({"bits": "x", "quant_method": "fp8"}, 1.0),
        ({"bits": 4.9}, 0.5),
        ({"quant_method": "FP8"}, 1.0),
        (
            {
                "quant_method": "Compressed-Tensors",
                "config_groups": {
                    "b": {"weights": {"num_bits": 8}},
                    "a": {"weights": {"num_bits": 4}},
                },
            },
            0.5,
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "a": {"weights": {"num_bits": 0}},
                    "b": {"weights": {"num_bits": 6.5}},
                },
            },
            6.5 / 8,
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"a": "x", "b": {"weights": None}},
            },
            0.0,
        ),
        ({"quant_method": "awq"}, 0.0),
        ("not an object", 0.0),
    ],
)
def test_quantization_weight_bytes(qc: Any, w: float) -> None:
    spec = parse(quantization_config=qc)
    assert spec.quantized_weight_bytes == w
    assert spec.weight_bytes == (w if w > 0 else 2.0)


def test_name_fallback_only_when_asked() -> None:
    assert parse().quantized_weight_bytes == 0
    spec = ModelSpec.from_config(BASE, name="org/model-W4A16", name_fallback=True)
    assert spec.quantized_weight_bytes == 0.5
    assert weight_bytes_from_name("x-w8a8") == 1.0
    assert weight_bytes_from_name("x_fp8_dynamic") == 1.0
    assert weight_bytes_from_name("fp8x") == 0.0


@pytest.mark.parametrize(
    "key", ["head_dim", "kv_lora_rank", "qk_rope_head_dim", "first_k_dense_replace"]
)
def test_negative_unused_keys_are_parse_errors(key: str) -> None:
    with pytest.raises(ModelConfigError, match=key):
        parse(**{key: -1})


def test_head_dim_ignored_for_blis() -> None:
    spec = parse(head_dim=256)
    assert spec.head_dim_blis == 128 and spec.real_head_dim == 256


# --------------------------------------------------------------------------- derived facts


def test_attention_kinds() -> None:
    assert parse().attention_kind == "GQA"
    assert parse(num_key_value_heads=32).attention_kind == "MHA"
    assert parse(num_key_value_heads=1).attention_kind == "MQA"
    assert load_model("deepseek-v2-lite").attention_kind == "MLA"


def test_kv_bytes_blis_vs_vllm() -> None:
    llama = load_model("llama-3.1-8b-instruct")
    assert llama.kv_bytes_per_token_blis == 32 * 2 * 1024 * 2
    assert llama.kv_bytes_per_token_vllm() == 131072
    assert llama.kv_bytes_per_token_vllm("fp8") == 65536
    qwen = load_model("qwen3-30b-a3b")  # head_dim 128 vs BLIS's 2048/32 = 64
    assert qwen.kv_bytes_per_token_vllm() == 2 * qwen.kv_bytes_per_token_blis
    ds = load_model("deepseek-v2-lite")  # MLA latent (512 + 64) vs BLIS's 2·16·128 per layer
    assert ds.kv_bytes_per_token_vllm() == 27 * 576 * 2
    assert ds.kv_bytes_per_token_blis == 27 * 2 * 2048 * 2
    with pytest.raises(ValueError, match="kv cache dtype"):
        llama.kv_bytes_per_token_vllm("fp4")


def test_parameter_counts() -> None:
    llama = load_model("llama-3.1-8b-instruct")
    assert llama.parameter_count_with_embeddings == pytest.approx(8.03e9, rel=0.01)
    mixtral = load_model("mixtral-8x7b-v0.1")
    assert mixtral.parameter_count_with_embeddings == pytest.approx(46.7e9, rel=0.01)
    assert mixtral.active_parameter_count == pytest.approx(12.6e9, rel=0.05)
    qwen = load_model("qwen3-30b-a3b")
    assert qwen.parameter_count == pytest.approx(29e9, rel=0.05)
    assert llama.flops_per_token() == 2.0 * llama.parameter_count


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "key", ["num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size"]
)
def test_missing_required_key_names_key_and_file(tmp_path: Path, key: str) -> None:
    p = tmp_path / "m" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps({k: v for k, v in BASE.items() if k != key}))
    with pytest.raises(ModelConfigError) as exc:
        ModelSpec.from_config(p)
    assert key in str(exc.value) and str(p) in str(exc.value)
    # Not strict: BLIS's raw readings.
    assert ModelSpec.from_config(p, strict=False).name == "m"


def test_bad_dtype_names_key(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**BASE, "torch_dtype": "float8"}))
    with pytest.raises(ModelConfigError, match="torch_dtype"):
        ModelSpec.from_config(tmp_path)  # a folder works too


def test_moe_without_k(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="num_experts_per_tok"):
        ModelSpec.from_config({**BASE, "num_local_experts": 8})


@pytest.mark.parametrize("text", ["{", "[1, 2]"])
def test_unreadable_files(tmp_path: Path, text: str) -> None:
    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(ModelConfigError, match=str(p)):
        ModelSpec.from_config(p)
    with pytest.raises(ModelConfigError, match="cannot read"):
        ModelSpec.from_config(tmp_path / "missing.json")


def test_config_hash_key_order() -> None:
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


# --------------------------------------------------------------------------- catalogue (§9.3)

ROWS_9_3 = {
    "llama-3.1-8b-instruct": dict(
        L=32,
        d=4096,
        H=32,
        H_kv=8,
        d_h=128,
        d_kv=1024,
        d_ff=14336,
        N=0,
        k=0,
        d_ff_moe=14336,
        d_ff_dense=14336,
        d_sh=0,
        s=0,
        a=2,
        w=2,
        L_moe=0,
        L_dense=32,
        chi=0,
    ),
    "mixtral-8x7b-v0.1": dict(
        L=32,
        d=4096,
        H=32,
        H_kv=8,
        d_h=128,
        d_kv=1024,
        d_ff=14336,
        N=8,
        k=2,
        d_ff_moe=14336,
        d_ff_dense=14336,
        d_sh=0,
        s=0,
        a=2,
        w=2,
        L_moe=32,
        L_dense=0,
        chi=0,
    ),
    "llama-4-scout-17b-16e-instruct-fp8-dynamic": dict(
        L=48,
        d=5120,
        H=40,
        H_kv=8,
        d_h=128,
        d_kv=1024,
        d_ff=8192,
        N=16,
        k=1,
        d_ff_moe=8192,
        d_ff_dense=16384,
        d_sh=0,
        s=1,
        a=2,
        w=1.0,
        L_moe=24,
        L_dense=24,
        chi=1,
    ),
    "deepseek-v2-lite": dict(
        L=27,
        d=2048,
        H=16,
        H_kv=16,
        d_h=128,
        d_kv=2048,
        d_ff=10944,
        N=64,
        k=6,
        d_ff_moe=1408,
        d_ff_dense=10944,
        d_sh=2816,
        s=0,
        a=2,
        w=2,
        L_moe=27,
        L_dense=0,
        chi=0,
    ),
    "qwen3-30b-a3b": dict(
        L=48,
        d=2048,
        H=32,
        H_kv=4,
        d_h=64,
        d_kv=256,
        d_ff=6144,
        N=128,
        k=8,
        d_ff_moe=768,
        d_ff_dense=6144,
        d_sh=0,
        s=0,
        a=2,
        w=2,
        L_moe=48,
        L_dense=0,
        chi=0,
    ),
}


@pytest.mark.parametrize("name", sorted(ROWS_9_3))
def test_catalogue_matches_spec_9_3(name: str) -> None:
    assert load_model(name).blis_row() == ROWS_9_3[name]


REQUIRED = {
    "llama-3.1-8b-instruct",
    "llama-3.1-70b-instruct",
    "qwen2.5-7b-instruct",
    "mistral-nemo-instruct-2407",
    "mixtral-8x7b-v0.1",
    "qwen3-30b-a3b",
    "deepseek-v2-lite",
    "llama-4-scout-17b-16e-instruct-fp8-dynamic",
}


def test_catalogue_contents_and_lookup() -> None:
    assert set(MODELS) >= REQUIRED
    for name in MODELS:
        spec = MODELS[name]
        assert spec.name == name and spec.config_hash == config_hash(model_config(name))
    assert "meta-llama/Llama-3.1-8B-Instruct" in MODELS
    assert "nope" not in MODELS and 3 not in MODELS
    assert load_model("llama-3.1-70b-instruct").blis_row()["L"] == 80
    assert load_model("qwen2.5-7b-instruct").attention_kind == "GQA"
    with pytest.raises(KeyError, match="available"):
        load_model("gpt-5")


def test_resolve_model_path_or_name(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(BASE))
    assert resolve_model(str(p)).hidden_dim == 4096
    assert resolve_model("mixtral-8x7b-v0.1").is_moe
    with pytest.raises(ModelConfigError, match="bundled"):
        resolve_model("no-such-model")


def test_catalogue_matches_blis_reference_configs() -> None:
    """Our own config files parse to the same BLIS readings as the reference files."""
    ref = Path("/work/shared/data/blis/model_configs")
    if not ref.is_dir():
        pytest.skip("BLIS reference model configs not available")
    for name in MODELS:
        f = ref / name / "config.json"
        if f.is_file():
            theirs = ModelSpec.from_config(f, name=name)
            assert load_model(name).blis_row() == theirs.blis_row(), name
