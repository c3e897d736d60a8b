"""Model descriptions read from a HuggingFace ``config.json`` exactly as BLIS reads them.

BLIS's trained-physics step time depends on a dozen architecture numbers. They are read
with BLIS's own rules (spec ``blis-trained-physics.md`` §1), because the shipped
coefficients were fitted against those readings, quirks included:

* **P1** a nested ``text_config`` object is pivoted to the top level and wins over
  top-level keys of the same name (multimodal configs such as Llama-4 Scout);
* **P2** ``int(key)`` counts only JSON numbers, truncated toward zero; absent, null,
  strings, booleans, arrays and objects read as 0;
* **P3** "first non-zero of k1, k2, ..." (negative values count as non-zero).

Derived facts that the learners and the extended features need (dense/MoE, attention
kind, parameter count, KV bytes per token, FLOPs per token) are properties. Where BLIS
and vLLM disagree (KV bytes: BLIS always charges 2 bytes per element and ignores
``head_dim`` and MLA) both readings are offered and named.

>>> spec = ModelSpec.from_config({
...     "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
...     "num_key_value_heads": 8, "intermediate_size": 14336, "torch_dtype": "bfloat16"})
>>> spec.head_dim_blis, spec.kv_dim, spec.is_moe, spec.attention_kind
(128, 1024, False, 'GQA')
>>> spec.kv_bytes_per_token_blis      # L * 2 (K and V) * d_kv * 2 bytes
131072
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from coeffd.learners.features.files import read_text_bounded

__all__ = [
    "DTYPE_BYTES",
    "ModelConfigError",
    "ModelSpec",
    "config_hash",
    "weight_bytes_from_name",
]

#: BLIS's dtype → bytes table (exact, case-sensitive; anything else reads as 0).
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int8": 1,
    "uint8": 1,
    "fp8": 1,
    "int4": 1,
    "nf4": 1,
}

#: Keys naming the routed-expert count, in BLIS's walk order (first value ≥ 2 wins).
EXPERT_COUNT_KEYS: tuple[str, ...] = (
    "num_experts",
    "moe_num_experts",
    "n_routed_experts",
    "num_local_experts",
    "num_routed_experts",
)

#: Parsed but unused by step time; BLIS rejects negative values.
NON_NEGATIVE_KEYS: tuple[str, ...] = (
    "head_dim",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "first_k_dense_replace",
)

#: vLLM ``--kv-cache-dtype`` → bytes per element ("auto" follows the model dtype).
KV_CACHE_DTYPE_BYTES: dict[str, float] = {
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "fp8_inc": 1.0,
    "fp8_ds_mla": 1.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "float32": 4.0,
    "float": 4.0,
}


class ModelConfigError(ValueError):
    """A ``config.json`` that cannot describe a model; the message names key and file."""


def _is_number(v: object) -> TypeGuard[int | float]:
    # JSON booleans decode to Python bool, a subclass of int: BLIS reads them as 0.
    return isinstance(v, int | float) and not isinstance(v, bool)


def _int(cfg: Mapping[str, Any], key: str) -> int:
    """P2: a JSON number truncated toward zero, else 0."""
    v = cfg.get(key)
    if not _is_number(v):
        return 0
    if isinstance(v, float) and not math.isfinite(v):
        return 0
    return int(v)  # int() truncates toward zero, like Go's int64(float64)


def _first_nonzero(cfg: Mapping[str, Any], *keys: str) -> int:
    """P3: the first key whose ``_int`` is non-zero (negative counts), else 0."""
    for k in keys:
        v = _int(cfg, k)
        if v != 0:
            return v
    return 0


def _dtype_bytes(cfg: Mapping[str, Any]) -> int:
    """``torch_dtype`` if it is a string, else ``dtype``; unknown strings give 0."""
    td = cfg.get("torch_dtype")
    if isinstance(td, str):
        # A string torch_dtype that is not in the table gives 0; dtype is NOT consulted.
        return DTYPE_BYTES.get(td, 0)
    dt = cfg.get("dtype")
    if isinstance(dt, str):
        return DTYPE_BYTES.get(dt, 0)
    return 0


_GO_ATOI = re.compile(r"[+-]?[0-9]+")


def _quantized_weight_bytes(cfg: Mapping[str, Any]) -> float:
    """Spec §1.2: bytes per weight from ``quantization_config`` (0 = not quantized)."""
    qc = cfg.get("quantization_config")
    if not isinstance(qc, Mapping):
        return 0.0
    bits_raw = qc.get("bits")
    bits = 0
    if _is_number(bits_raw):
        bits = _int(qc, "bits")
    elif isinstance(bits_raw, str) and _GO_ATOI.fullmatch(bits_raw):
        # Go's strconv.Atoi: optional sign and ASCII digits only; anything else fails → 0.
        bits = int(bits_raw)
    if bits > 0:
        return bits / 8
    method = qc.get("quant_method")
    method_l = method.lower() if isinstance(method, str) else ""
    if method_l == "fp8":
        return 1.0
    groups = qc.get("config_groups")
    if method_l == "compressed-tensors" and isinstance(groups, Mapping):
        # Byte-wise lexicographic order of keys equals code-point order for UTF-8.
        for name in sorted(groups):
            grp = groups[name]
            if not isinstance(grp, Mapping):
                continue
            weights = grp.get("weights")
            if not isinstance(weights, Mapping):
                continue
            nb = weights.get("num_bits")
            if _is_number(nb) and nb > 0:
                return float(nb) / 8  # no truncation of num_bits
    return 0.0


_NAME_WXAY = re.compile(r"(^|[.\-_/])w(\d+)a\d+($|[.\-_])", re.IGNORECASE)
_NAME_FP8 = re.compile(r"(^|[.\-_/])fp8($|[.\-_])", re.IGNORECASE)


def weight_bytes_from_name(model_name: str) -> float:
    """BLIS CLI's model-name fallback for ``w_q`` (only when the config gives 0).

    >>> weight_bytes_from_name("RedHatAI/Llama-3.1-8B-Instruct-w4a16")
    0.5
    >>> weight_bytes_from_name("llama-4-scout-17b-16e-instruct-fp8-dynamic")
    1.0
    >>> weight_bytes_from_name("llama-3.1-8b-instruct")
    0.0
    """
    lowered = model_name.lower()
    m = _NAME_WXAY.search(lowered)
    if m and int(m.group(2)) > 0:
        return int(m.group(2)) / 8
    if _NAME_FP8.search(lowered):
        return 1.0
    return 0.0


def config_hash(cfg: Mapping[str, Any]) -> str:
    """Short hash of a config's canonical JSON (sorted keys): same content ⇒ same hash.

    >>> config_hash({"b": 1, "a": 2}) == config_hash({"a": 2, "b": 1})
    True
    """
    canon = json.dumps(cfg, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.blake2b(canon.encode(), digest_size=6).hexdigest()


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The architecture numbers BLIS reads from ``config.json`` (spec §1.1 symbols).

    Construct with :meth:`from_config`; fields keep BLIS's raw readings (e.g.
    ``moe_ffn_dim_raw`` may be 0) and properties give the derived values of spec §2.
    """

    name: str
    num_layers: int  # L
    hidden_dim: int  # d
    num_heads: int  # H
    num_kv_heads: int  # H_kv (already defaulted to H)
    bytes_per_param: int  # a
    intermediate_dim: int  # d_ff
    num_experts: int  # N (0 = dense)
    experts_per_tok: int  # k
    moe_ffn_dim_raw: int  # d_moe_raw
    shared_expert_ffn_dim: int  # d_sh
    interleave_moe_layer_step: int  # s
    dense_ffn_dim_raw: int  # d_dense_raw
    quantized_weight_bytes: float  # w_q (0 = not quantized)
    head_dim: int = 0  # parsed, ignored by step time
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    first_k_dense_replace: int = 0
    vocab_size: int = 0
    max_position_embeddings: int = 0
    hidden_act: str = ""
    torch_dtype: str = ""
    source: str = ""  # file path or "<dict>"
    config_hash: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ parsing

    @classmethod
    def from_config(
        cls,
        path_or_dict: str | os.PathLike[str] | Mapping[str, Any],
        *,
        name: str | None = None,
        strict: bool = True,
        name_fallback: bool = False,
        source: str | None = None,
    ) -> ModelSpec:
        """Parse a HuggingFace config (a file, a directory holding ``config.json``, or a dict).

        ``strict`` (default) rejects configs BLIS would refuse to build a latency model
        for (L, d, H, d_ff or the dtype missing), naming the key and the file; pass
        ``strict=False`` to get BLIS's raw readings anyway. ``name_fallback`` applies the
        BLIS CLI's model-name rule for ``w_q`` (§1.2; the library parser does not).
        ``source`` names a dict's origin in error messages.

        >>> ModelSpec.from_config({"hidden_size": 8})
        Traceback (most recent call last):
        ...
        coeffd.learners.features.model.ModelConfigError: <dict>: required key 'num_hidden_layers' is missing or not a positive number
        """
        raw: Mapping[str, Any]
        if isinstance(path_or_dict, Mapping):
            raw = path_or_dict
            source = source or "<dict>"
        else:
            p = Path(path_or_dict)
            if p.is_dir():
                p = p / "config.json"
            source = source or str(p)
            try:
                text = read_text_bounded(p)  # regular files only, bounded: never a FIFO
            except OSError as exc:
                raise ModelConfigError(f"{source}: cannot read model config: {exc}") from exc
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ModelConfigError(f"{source}: not valid JSON: {exc}") from exc
            if name is None:
                name = p.parent.name or p.stem
        if not isinstance(raw, Mapping):
            raise ModelConfigError(f"{source}: a config.json must be a JSON object")

        cfg: dict[str, Any] = dict(raw)
        tc = cfg.get("text_config")
        if isinstance(tc, Mapping):
            cfg.update(tc)  # P1: inner keys overwrite outer ones

        for key in NON_NEGATIVE_KEYS:
            if _int(cfg, key) < 0:
                raise ModelConfigError(f"{source}: key {key!r} must not be negative")

        h = _int(cfg, "num_attention_heads")
        h_kv = _first_nonzero(cfg, "num_key_value_heads", "num_kv_heads", "multi_query_group_num")
        if h_kv == 0:
            h_kv = h
        n_experts = 0
        for key in EXPERT_COUNT_KEYS:
            if _int(cfg, key) >= 2:
                n_experts = _int(cfg, key)
                break
        d_ff = _first_nonzero(cfg, "intermediate_size", "ffn_hidden_size")
        d_moe_raw = _int(cfg, "moe_intermediate_size")
        d_sh = _int(cfg, "shared_expert_intermediate_size")
        if d_sh <= 0:
            n_shared = _int(cfg, "n_shared_experts")
            d_sh = n_shared * (d_moe_raw if d_moe_raw != 0 else d_ff) if n_shared > 0 else 0
        w_q = _quantized_weight_bytes(cfg)
        if name is None:
            name = str(cfg.get("_name_or_path") or cfg.get("model_type") or "model")
        if w_q == 0 and name_fallback:
            w_q = weight_bytes_from_name(name)
        td = cfg.get("torch_dtype")
        dt = cfg.get("dtype")
        dtype_str = td if isinstance(td, str) else (dt if isinstance(dt, str) else "")
        act = cfg.get("hidden_act")

        spec = cls(
            name=name,
            num_layers=_int(cfg, "num_hidden_layers"),
            hidden_dim=_int(cfg, "hidden_size"),
            num_heads=h,
            num_kv_heads=h_kv,
            bytes_per_param=_dtype_bytes(cfg),
            intermediate_dim=d_ff,
            num_experts=n_experts,
            experts_per_tok=_int(cfg, "num_experts_per_tok"),
            moe_ffn_dim_raw=d_moe_raw,
            shared_expert_ffn_dim=d_sh,
            interleave_moe_layer_step=_int(cfg, "interleave_moe_layer_step"),
            dense_ffn_dim_raw=_int(cfg, "intermediate_size_mlp"),
            quantized_weight_bytes=w_q,
            head_dim=_int(cfg, "head_dim"),
            kv_lora_rank=_int(cfg, "kv_lora_rank"),
            qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
            first_k_dense_replace=_int(cfg, "first_k_dense_replace"),
            vocab_size=_int(cfg, "vocab_size"),
            max_position_embeddings=_int(cfg, "max_position_embeddings"),
            hidden_act=act if isinstance(act, str) else "",
            torch_dtype=dtype_str,
            source=source,
            config_hash=config_hash(raw),
            raw=raw,
        )
        if strict:
            spec.check()
        return spec

    def check(self) -> None:
        """Raise :class:`ModelConfigError` for what BLIS's constructor rejects (§7.1 item 6-7)."""
        required = (
            ("num_hidden_layers", self.num_layers),
            ("hidden_size", self.hidden_dim),
            ("num_attention_heads", self.num_heads),
            ("intermediate_size", self.intermediate_dim),
        )
        for key, value in required:
            if value <= 0:
                alt = " (or 'ffn_hidden_size')" if key == "intermediate_size" else ""
                raise ModelConfigError(
                    f"{self.source}: required key {key!r}{alt} is missing or not a positive number"
                )
        if self.bytes_per_param <= 0:
            raise ModelConfigError(
                f"{self.source}: key 'torch_dtype' (or 'dtype') is missing or not one of "
                f"{sorted(DTYPE_BYTES)} (got {self.torch_dtype!r})"
            )
        if self.num_experts > 1 and self.experts_per_tok <= 0:
            raise ModelConfigError(
                f"{self.source}: MoE model ({self.num_experts} experts) needs a positive "
                "'num_experts_per_tok'"
            )

    # ------------------------------------------------------------------ derived (§2)

    @property
    def head_dim_blis(self) -> int:
        """``d_h = ⌊d/H⌋``: BLIS's head dimension (``head_dim`` is ignored)."""
        return self.hidden_dim // self.num_heads if self.num_heads else 0

    @property
    def kv_dim(self) -> int:
        """``d_kv = H_kv · d_h`` (BLIS)."""
        return self.num_kv_heads * self.head_dim_blis

    @property
    def is_moe(self) -> bool:
        """``N ≥ 2`` (single-expert configs are dense)."""
        return self.num_experts >= 2

    @property
    def moe_layers(self) -> int:
        """``L_moe``: BLIS's MoE layer count (``⌊L/(s+1)⌋`` when interleaved)."""
        if not self.is_moe:
            return 0
        s = self.interleave_moe_layer_step
        return self.num_layers // (s + 1) if s > 0 else self.num_layers

    @property
    def dense_layers(self) -> int:
        """``L_dense = L − L_moe``."""
        return self.num_layers - self.moe_layers

    @property
    def interleaved(self) -> bool:
        """χ: the β₈ gate (interleaved MoE)."""
        return self.is_moe and self.interleave_moe_layer_step > 0

    @property
    def moe_ffn_dim(self) -> int:
        """``d_ff^moe``: routed-expert width (falls back to ``d_ff``)."""
        return self.moe_ffn_dim_raw if self.moe_ffn_dim_raw > 0 else self.intermediate_dim

    @property
    def dense_ffn_dim(self) -> int:
        """``d_ff^dense``: dense-layer width (falls back to ``d_ff``)."""
        return self.dense_ffn_dim_raw if self.dense_ffn_dim_raw > 0 else self.intermediate_dim

    @property
    def experts_per_tok_eff(self) -> int:
        """``k_eff = max(1, k)``."""
        return max(1, self.experts_per_tok)

    @property
    def weight_bytes(self) -> float:
        """``w``: quantized weight bytes if set, else the activation width ``a``."""
        return (
            self.quantized_weight_bytes
            if self.quantized_weight_bytes > 0
            else float(self.bytes_per_param)
        )

    @property
    def attention_kind(self) -> str:
        """``MLA`` (latent KV), ``MHA`` (H_kv = H), ``MQA`` (H_kv = 1) or ``GQA``."""
        if self.kv_lora_rank > 0:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        if self.num_kv_heads == 1:
            return "MQA"
        return "GQA"

    @property
    def real_head_dim(self) -> int:
        """The head dimension vLLM uses: ``head_dim`` when set, else ``⌊d/H⌋``."""
        return self.head_dim if self.head_dim > 0 else self.head_dim_blis

    @property
    def kv_bytes_per_token_blis(self) -> int:
        """BLIS's KV bytes per token, all layers: ``L·2·d_kv·b_kv`` with ``b_kv = 2`` always.

        This is what the trained-physics KV terms charge (MLA and ``head_dim`` ignored).
        """
        return self.num_layers * 2 * self.kv_dim * 2

    def kv_bytes_per_token_vllm(self, kv_cache_dtype: str = "auto") -> float:
        """vLLM's real KV-cache bytes per token, all layers, for a ``--kv-cache-dtype``.

        Uses the real head dimension (``head_dim`` when present), K and V per KV head for
        ordinary attention, and one latent of ``kv_lora_rank + qk_rope_head_dim`` per
        layer for MLA. ``auto`` follows the model dtype (BF16/FP16 → 2 bytes).
        """
        if kv_cache_dtype == "auto":
            elem = float(self.bytes_per_param if self.bytes_per_param in (2, 4) else 2)
        else:
            try:
                elem = KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
            except KeyError:
                raise ValueError(
                    f"unknown kv cache dtype {kv_cache_dtype!r}; "
                    f"known: {sorted([*KV_CACHE_DTYPE_BYTES, 'auto'])}"
                ) from None
        if self.kv_lora_rank > 0:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * elem
        return self.num_layers * 2 * self.num_kv_heads * self.real_head_dim * elem

    def _block_params(self, experts: int) -> int:
        d = self.hidden_dim
        attn = self.num_layers * d * (2 * d + 2 * self.kv_dim)
        moe = self.moe_layers * (
            experts * 3 * d * self.moe_ffn_dim + 3 * d * self.shared_expert_ffn_dim
        )
        dense = self.dense_layers * 3 * d * self.dense_ffn_dim
        return attn + moe + dense

    @property
    def parameter_count(self) -> int:
        """Parameters of the transformer blocks as BLIS counts them (no embeddings/LM head).

        Attention ``d·(2d + 2d_kv)`` per layer, routed experts ``N·3·d·d_ff^moe`` and shared
        experts ``3·d·d_sh`` per MoE layer, ``3·d·d_ff^dense`` per dense layer.
        """
        return self._block_params(self.num_experts)

    @property
    def parameter_count_with_embeddings(self) -> int:
        """:attr:`parameter_count` plus input embeddings and an untied LM head."""
        tied = bool(self.raw.get("tie_word_embeddings", False))
        emb = self.vocab_size * self.hidden_dim
        return self.parameter_count + emb * (1 if tied else 2)

    @property
    def active_parameter_count(self) -> int:
        """Parameters touched per token (``k_eff`` routed experts instead of ``N``)."""
        return self._block_params(self.experts_per_tok_eff)

    def flops_per_token(self, context: int = 0) -> float:
        """Forward FLOPs per token with BLIS's accounting at TP 1: ``2·active params`` for
        the matmuls plus ``4·H·d_h·context`` attention FLOPs per layer.

        >>> spec = ModelSpec.from_config({"num_hidden_layers": 1, "hidden_size": 4,
        ...     "num_attention_heads": 1, "intermediate_size": 4, "torch_dtype": "float16"})
        >>> spec.flops_per_token()  # 2 * (4*(8+8) + 3*4*4)
        224.0
        """
        attn = self.num_layers * 4 * self.num_heads * self.head_dim_blis * context
        return 2.0 * self.active_parameter_count + float(attn)

    def blis_row(self) -> dict[str, float | int]:
        """The spec §9.3 table row (values after parsing) — handy in tests and reports."""
        return {
            "L": self.num_layers,
            "d": self.hidden_dim,
            "H": self.num_heads,
            "H_kv": self.num_kv_heads,
            "d_h": self.head_dim_blis,
            "d_kv": self.kv_dim,
            "d_ff": self.intermediate_dim,
            "N": self.num_experts,
            "k": self.experts_per_tok,
            "d_ff_moe": self.moe_ffn_dim,
            "d_ff_dense": self.dense_ffn_dim,
            "d_sh": self.shared_expert_ffn_dim,
            "s": self.interleave_moe_layer_step,
            "a": self.bytes_per_param,
            "w": self.weight_bytes,
            "L_moe": self.moe_layers,
            "L_dense": self.dense_layers,
            "chi": int(self.interleaved),
        }
