"""BLIS's trained-physics basis: the eleven step-time features and the step time.

Two paths compute the same eleven terms (spec ``blis-trained-physics.md`` §5.3, split form):

* :meth:`BlisBasis.terms` follows the evaluation order of spec §11 operation by operation,
  so the terms and :meth:`BlisBasis.step_time` match BLIS bit for bit (goldens, CLI);
* the streaming path uses the fact that every term is *linear* in seven batch statistics
  ``(T_pf, A, T_dc, C, B, 1)`` with ``A = Σ_prefill t·(I + t/2)`` and ``T_tot = T_pf +
  T_dc``: the per-configuration coefficient matrix :attr:`BlisBasis.coef` is built once,
  so a step costs one small dot product (:meth:`BlisBasis.terms_from_stats`,
  :meth:`BlisBasis.terms_many`). It agrees with the exact path to ~1e-15 relative.

>>> from coeffd.learners.features.catalog import load_model
>>> from coeffd.learners.features.hardware import load_hardware
>>> from coeffd.records.observations import BatchRequest
>>> basis = BlisBasis(load_model("llama-3.1-8b-instruct"), load_hardware("H100"), tp=1)
>>> dec4 = [BatchRequest(256, 300, 1, 50), BatchRequest(400, 500, 1, 50),
...         BatchRequest(600, 700, 1, 50), BatchRequest(900, 1000, 1, 50)]
>>> basis.step_time(BLIS_DEFAULT_BETA, dec4)  # spec §10.2 W1
7038
>>> round(float(basis.terms(dec4)[TERM_INDEX["T_dc_kv"]]), 10)
97.9714292537
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from coeffd.learners.features.hardware import HardwareSpec
from coeffd.learners.features.model import ModelSpec
from coeffd.records.observations import BatchRequest, StepAggregates

__all__ = [
    "A2A_BACKENDS",
    "AG_BACKENDS",
    "BLIS_DEFAULT_ALPHA",
    "BLIS_DEFAULT_BETA",
    "MOE_COMM_BACKENDS",
    "N_STATS",
    "N_TERMS",
    "STAT_NAMES",
    "TERM_INDEX",
    "TERM_NAMES",
    "BasisConfigError",
    "BlisBasis",
    "batch_stats",
    "check_coeffs",
    "normalize_beta",
    "step_time_from_s",
]

#: Split-form feature names, in β index order (spec §5.3).
TERM_NAMES: tuple[str, ...] = (
    "T_pf_compute",
    "T_dc_compute",
    "T_weight",
    "T_tp_comm",  # T_tp_attn + T_tp_denseFFN + T_moe_reduce
    "L",
    "B",
    "one",
    "chi_L_moe",
    "T_pf_kv",
    "T_dc_kv",
    "T_moe_dispatch",
)
TERM_INDEX: dict[str, int] = {n: i for i, n in enumerate(TERM_NAMES)}
N_TERMS = len(TERM_NAMES)

#: Batch statistics the terms are linear in (streaming path).
STAT_NAMES: tuple[str, ...] = ("T_pf", "A_pf", "T_dc", "C", "B", "one")
N_STATS = len(STAT_NAMES)

#: BLIS's bundled coefficients (defaults.yaml, spec §9.2), public values.
BLIS_DEFAULT_ALPHA: tuple[float, ...] = (15563.199579, 777.3455, 45.907545)
BLIS_DEFAULT_BETA: tuple[float, ...] = (
    0.152128,
    0.0,
    1.36252915,
    0.752037,
    32.09546717,
    4.41684444,
    126.024825,
    481.8613888,
    0.0,
    1.94710771,
    0.752037,
)

AG_BACKENDS: frozenset[str] = frozenset({"naive", "allgather_reducescatter"})
A2A_BACKENDS: frozenset[str] = frozenset(
    {"pplx", "deepep_high_throughput", "deepep_low_latency", "mori", "flashinfer_all2allv"}
)
MOE_COMM_BACKENDS: tuple[str, ...] = tuple(sorted(AG_BACKENDS | A2A_BACKENDS))
_DEFAULT_BACKEND = "allgather_reducescatter"
_INT64_MAX = 2**63 - 1


class BasisConfigError(ValueError):
    """A model/hardware/parallelism combination BLIS refuses (spec §7.1)."""


def check_coeffs(values: Sequence[float], what: str) -> None:
    """BLIS's coefficient validation: every value finite and ≥ 0 (messages as upstream).

    The one implementation of spec §7.1 rule 8: the publisher's snapshot check uses it too.
    """
    for i, v in enumerate(values):
        # bool is an int subclass; BLIS parses float64s, so a bool here is a caller bug.
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"{what}[{i}] = {v!r} is not a number")
        fv = float(v)
        if math.isnan(fv):
            raise ValueError(f"{what}[{i}] is NaN")
        if math.isinf(fv):
            raise ValueError(f"{what}[{i}] is Inf")
        if fv < 0:
            raise ValueError(f"{what}[{i}] must be non-negative, got {fv}")


def normalize_beta(beta: Sequence[float]) -> tuple[list[float], int]:
    """Spec §5.1: pad/trim to ``b[0..10]`` (``b[10] = b[3]`` when fewer than 11), return ``(b, n)``.

    >>> b, n = normalize_beta([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    >>> b[10], n
    (4.0, 10)
    """
    n = len(beta)
    if n < 7:
        raise ValueError(f"BetaCoeffs requires at least 7 elements, got {n}")
    check_coeffs(beta, "beta")
    b = [float(v) for v in beta[:11]] + [0.0] * max(0, 11 - n)
    if n < 11:
        b[10] = b[3]  # β_EP defaults to β₄, not 0 (notes item 14)
    return b, n


def step_time_from_s(s: float) -> int:
    """Spec §5.4: ``max(1, trunc(S))``; NaN or ≥ 2⁶³ clamps to 2⁶³ − 1."""
    if math.isnan(s) or s >= 9.223372036854775807e18:
        return _INT64_MAX
    return max(1, int(s))


def batch_stats(requests: Sequence[BatchRequest]) -> npt.NDArray[np.float64]:
    """The six linear statistics ``(T_pf, A_pf, T_dc, C, B, 1)`` of a batch.

    ``A_pf = Σ_prefill t·(I + t/2)`` (the TP/model factors live in the coefficients).
    One plain loop: measured faster than comprehensions or local-variable variants.
    """
    t_pf = 0
    a_pf = 0.0
    t_dc = 0
    ctx = 0
    for r in requests:
        if r.progress < r.input_len:
            t_pf += r.new_tokens
            a_pf += r.new_tokens * (r.input_len + r.new_tokens / 2)
        elif r.output_len > 0:
            t_dc += 1
            ctx += r.progress
    return np.array([t_pf, a_pf, t_dc, ctx, len(requests), 1.0], dtype=np.float64)


class BlisBasis:
    """The trained-physics basis for one (model, GPU, tp, dp, MoE backend) configuration.

    Construction validates as BLIS does (§7.1): ``H mod tp``, ``H_kv mod tp``, ``dp > 1``
    only for MoE, backend names; positive L, d, H, d_ff, a, peak FLOPs and bandwidth.
    """

    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareSpec,
        tp: int,
        dp: int = 1,
        moe_comm_backend: str = "",
    ) -> None:
        self.model = model
        self.hw = hw
        backend = moe_comm_backend or _DEFAULT_BACKEND
        if backend not in AG_BACKENDS and backend not in A2A_BACKENDS:
            raise BasisConfigError(
                f"unknown MoE comm backend {moe_comm_backend!r}; valid: {', '.join(MOE_COMM_BACKENDS)}"
            )
        src = model.source if model.source not in ("", "<dict>") else f"model {model.name!r}"
        if int(tp) != tp or tp <= 0:
            raise BasisConfigError(f"tp must be a positive integer, got {tp!r}")
        if int(dp) != dp:
            raise BasisConfigError(f"dp must be an integer, got {dp!r}")
        tp, dp = int(tp), int(dp)
        if dp < 1:
            raise BasisConfigError(f"dp must be >= 1, got {dp}")
        if dp > 1 and not model.is_moe:
            raise BasisConfigError(
                f"{src}: dp > 1 is supported only for MoE models ({model.name} is dense)"
            )
        checks = (
            ("num_hidden_layers", model.num_layers),
            ("num_attention_heads", model.num_heads),
            ("hidden_size", model.hidden_dim),
            ("intermediate_size", model.intermediate_dim),
        )
        for key, v in checks:
            if v <= 0:
                raise BasisConfigError(f"{src}: {key} must be > 0, got {v}")
        if model.num_heads % tp != 0:
            raise BasisConfigError(
                f"{src}: num_attention_heads ({model.num_heads}) is not divisible by tp ({tp})"
            )
        if model.num_kv_heads % tp != 0:
            raise BasisConfigError(
                f"{src}: num_key_value_heads ({model.num_kv_heads}) is not divisible by tp "
                f"({tp}); BLIS never replicates KV heads"
            )
        for label, hv in (("TFlopsPeak", hw.tflops_peak), ("BwPeakTBs", hw.bw_peak_tbs)):
            if not (math.isfinite(hv) and hv > 0):
                raise BasisConfigError(f"hardware {hw.name!r}: {label} must be finite and > 0")
        if model.bytes_per_param <= 0:
            raise BasisConfigError(
                f"{src}: torch_dtype/dtype {model.torch_dtype!r} gives 0 bytes per parameter"
            )
        if model.num_experts > 1 and model.experts_per_tok <= 0:
            raise BasisConfigError(f"{src}: NumExpertsPerTok must be > 0 for MoE models")

        self.tp = tp
        self.dp = dp
        self.moe_comm_backend = backend
        self.a2a = backend in A2A_BACKENDS

        # ---- constants of §2, all as doubles (integer arithmetic first, §11 item 1)
        m = model
        self._L = float(m.num_layers)
        self._d = float(m.hidden_dim)
        self._dh = float(m.hidden_dim // m.num_heads)
        self._dkv = float(m.num_kv_heads * (m.hidden_dim // m.num_heads))
        self._is_moe = m.is_moe
        self._L_moe = float(m.moe_layers)
        self._L_dense = float(m.dense_layers)
        self._chi = 1.0 if m.interleaved else 0.0
        self._dff_moe = float(m.moe_ffn_dim)
        self._dff_dense = float(m.dense_ffn_dim)
        self._dsh = float(m.shared_expert_ffn_dim)
        self._k_eff = float(m.experts_per_tok_eff)
        self._N = float(m.num_experts)
        self._a = float(m.bytes_per_param)
        self._w = m.weight_bytes
        self._tp = float(tp)
        self._dp = float(dp)
        self._tpdp = self._tp * self._dp
        self._G = float(tp * dp if m.is_moe else tp)
        self._heads_per_gpu = float(m.num_heads) / self._tp
        self._phi = hw.flops_per_us(self._w)
        self._bw = hw.bytes_per_us
        self._proj_width = 2 * self._d + 2 * self._dkv
        self._t_weight = self._weight_term()
        self.coef: npt.NDArray[np.float64] = self._build_coef()
        self._coef_t: npt.NDArray[np.float64] = np.ascontiguousarray(self.coef.T)

    # ------------------------------------------------------------------ identity

    def __repr__(self) -> str:
        return (
            f"BlisBasis(model={self.model.name!r}, hw={self.hw.name!r}, tp={self.tp}, "
            f"dp={self.dp}, moe_comm_backend={self.moe_comm_backend!r})"
        )

    @property
    def is_moe(self) -> bool:
        """Whether the model has routed experts."""
        return self._is_moe

    @property
    def t_weight(self) -> float:
        """``T_weight`` (µs): batch-independent, charged on every non-empty step."""
        return self._t_weight

    # ------------------------------------------------------------------ exact path

    def _ffn_flops(self, t: float) -> float:
        # §4.1 / §11: routed + shared + dense, each left to right as written.
        f = 0.0
        if self._L_moe > 0:
            f = self._L_moe * (t * self._k_eff / self._G) * 6 * self._d * self._dff_moe
            if self._dsh > 0:
                f = f + self._L_moe * t * 6 * self._d * self._dsh / self._tpdp
        if self._L_dense > 0:
            f = f + self._L_dense * t * 1 * 6 * self._d * self._dff_dense / self._tpdp
        return f

    def _weight_term(self) -> float:
        L, d, w, tp = self._L, self._d, self._w, self._tp
        w_attn = L * d * self._proj_width * w / tp
        w_ffn = 0.0
        if self._L_moe > 0:
            w_ffn = self._L_moe * (self._N / self._G) * 3 * d * self._dff_moe * w
            if self._dsh > 0:
                w_ffn = w_ffn + self._L_moe * 3 * d * self._dsh * w / tp
        if self._L_dense > 0:
            w_ffn = w_ffn + self._L_dense * 1 * 3 * d * self._dff_dense * w / tp
        return (w_attn + w_ffn) / self._bw

    def _allreduce(self, units: float, tokens: float) -> float:
        # V(u, n) = u · n · d · a · 2 · ρ / BW, ρ = (tp − 1)/tp computed first (§4.7).
        if self.tp <= 1:
            return 0.0
        rho = (self._tp - 1) / self._tp
        return units * tokens * self._d * self._a * 2 * rho / self._bw

    def _dispatch_per_layer(self, t_tot: float) -> float:
        G = self._G
        if self.a2a:
            comm_tokens = (t_tot / self._dp) * self._k_eff * (G - 1) / G * 2
            return comm_tokens * self._d * self._a / self._bw
        return (t_tot / self._dp) * (G - 1) / G * 2 * self._d * self._a / self._bw

    def _terms_from_totals(
        self, t_pf: float, a_pf: float, t_dc: float, ctx: float, n_req: float
    ) -> list[float]:
        """All eleven terms from the batch totals, in §11 order. ``a_pf`` is BLIS's ``A_pf``
        (already including ``4·(H/tp)·…·d_h``)."""
        L, d, tpdp, dp = self._L, self._d, self._tpdp, self._dp
        t_pf_compute = t_pf_kv = t_dc_compute = t_dc_kv = 0.0
        if t_pf > 0:
            f_proj = L * 2 * t_pf * d * self._proj_width / tpdp
            f_attn = L * a_pf / dp
            t_pf_compute = (f_proj + f_attn + self._ffn_flops(t_pf)) / self._phi
            t_pf_kv = L * 2 * (self._dkv / tpdp) * t_pf * 2 / self._bw
        if t_dc > 0:
            f_proj = L * 2 * t_dc * d * self._proj_width / tpdp
            f_attn = L * 4 * self._heads_per_gpu * ctx * self._dh / dp
            t_dc_compute = (f_proj + f_attn + self._ffn_flops(t_dc)) / self._phi
            t_dc_kv = L * 2 * (self._dkv / tpdp) * 2 * (ctx + t_dc) / self._bw
        t_tot = t_pf + t_dc
        tp_comm = 0.0
        dispatch = 0.0
        if self.tp > 1:
            t_attn = self._allreduce(L, t_tot) / dp
            t_dense = self._allreduce(self._L_dense, t_tot) / dp
            t_reduce = 0.0
            if self._is_moe and self._L_moe > 0 and self.dp == 1:
                t_reduce = self._allreduce(self._L_moe, t_tot)
            tp_comm = t_attn + t_dense + t_reduce
        if self._is_moe and self.dp > 1:
            dispatch = self._dispatch_per_layer(t_tot) * self._L_moe
        return [
            t_pf_compute,
            t_dc_compute,
            self._t_weight,
            tp_comm,
            L,
            n_req,
            1.0,
            self._chi * self._L_moe,
            t_pf_kv,
            t_dc_kv,
            dispatch,
        ]

    def _exact_terms(self, requests: Sequence[BatchRequest]) -> list[float]:
        t_pf = 0.0
        a_pf = 0.0
        t_dc = 0.0
        ctx = 0.0
        hpg, dh = self._heads_per_gpu, self._dh
        for r in requests:
            if r.progress < r.input_len:
                t = float(r.new_tokens)
                t_pf += t
                a_pf += 4 * hpg * t * (float(r.input_len) + t / 2) * dh
            elif r.output_len > 0:
                t_dc += 1
                ctx += float(r.progress)
        return self._terms_from_totals(t_pf, a_pf, t_dc, ctx, float(len(requests)))

    def terms(self, requests: Sequence[BatchRequest]) -> npt.NDArray[np.float64]:
        """The eleven split-form terms (µs; ``L``, ``B``, ``1``, ``χ·L_moe`` are counts).

        Bit-exact with BLIS (§11). An empty batch gives all zeros: BLIS does not evaluate
        the basis at all then (step time 1), so no term is charged.
        """
        if not requests:
            return np.zeros(N_TERMS)
        return np.array(self._exact_terms(requests), dtype=np.float64)

    def step_s(self, beta: Sequence[float], requests: Sequence[BatchRequest]) -> float:
        """The unrounded step time ``S`` (µs) of §5.2; 1.0 for an empty batch."""
        if not requests:
            normalize_beta(beta)  # still validate
            return 1.0
        return self.s_from_terms(beta, self._exact_terms(requests))

    @staticmethod
    def s_from_terms(beta: Sequence[float], x: Sequence[float]) -> float:
        """``S`` from precomputed split-form terms with BLIS's max forms and sum order.

        Bit-exact because every term of the split vector is computed as BLIS computes it
        and the combination below is §5.2 verbatim.
        """
        b, n = normalize_beta(beta)
        (t_pfc, t_dcc, t_w, t_comm, L, B, one, chi_lmoe, t_pfkv, t_dckv, t_disp) = (
            float(v) for v in x
        )
        pf = b[0] * t_pfc + b[8] * t_pfkv if n >= 9 else b[0] * max(t_pfc, t_pfkv)
        dc = b[1] * t_dcc + b[9] * t_dckv if n >= 10 else b[1] * max(t_dcc, t_dckv)
        # (b[7]·χ)·L_moe == b[7]·(χ·L_moe) exactly because χ ∈ {0, 1}; n = 7 ⇒ b[7] = 0.
        return (
            pf
            + dc
            + b[2] * t_w
            + b[3] * t_comm
            + b[10] * t_disp
            + b[4] * L
            + b[5] * B
            + b[6] * one
            + b[7] * chi_lmoe
        )

    def step_time(self, beta: Sequence[float], requests: Sequence[BatchRequest]) -> int:
        """BLIS's integer step time (µs) for a batch: ``max(1, trunc(S))``; empty → 1."""
        return step_time_from_s(self.step_s(beta, requests))

    # ------------------------------------------------------------------ fast path

    def _build_coef(self) -> npt.NDArray[np.float64]:
        """11×6 matrix ``M`` with ``terms = M @ (T_pf, A, T_dc, C, B, 1)``.

        Written out from the same formulas as the exact path, per unit of each statistic
        (every term is linear in them; the ``T > 0`` gates only ever zero a term whose
        statistics are all zero anyway).
        """
        m = np.zeros((N_TERMS, N_STATS))
        L, d, tpdp, dp = self._L, self._d, self._tpdp, self._dp
        per_tok_flops = (L * 2 * d * self._proj_width / tpdp + self._ffn_flops(1.0)) / self._phi
        per_tok_kv = L * 2 * (self._dkv / tpdp) * 2 / self._bw
        comm = 0.0
        if self.tp > 1:
            comm = self._allreduce(L, 1.0) / dp + self._allreduce(self._L_dense, 1.0) / dp
            if self._is_moe and self._L_moe > 0 and self.dp == 1:
                comm += self._allreduce(self._L_moe, 1.0)
        dispatch = 0.0
        if self._is_moe and self.dp > 1:
            dispatch = self._dispatch_per_layer(1.0) * self._L_moe
        a_scale = 4 * self._heads_per_gpu * self._dh  # A_pf = a_scale · Σ t(I + t/2)
        i = TERM_INDEX
        # T_pf
        m[i["T_pf_compute"], 0] = per_tok_flops
        m[i["T_pf_kv"], 0] = per_tok_kv
        m[i["T_tp_comm"], 0] = comm
        m[i["T_moe_dispatch"], 0] = dispatch
        # A = Σ t(I + t/2)
        m[i["T_pf_compute"], 1] = L * a_scale / dp / self._phi
        # T_dc
        m[i["T_dc_compute"], 2] = per_tok_flops
        m[i["T_dc_kv"], 2] = per_tok_kv
        m[i["T_tp_comm"], 2] = comm
        m[i["T_moe_dispatch"], 2] = dispatch
        # C
        m[i["T_dc_compute"], 3] = L * 4 * self._heads_per_gpu * self._dh / dp / self._phi
        m[i["T_dc_kv"], 3] = per_tok_kv
        # B and the constant
        m[i["B"], 4] = 1.0
        m[i["T_weight"], 5] = self._t_weight
        m[i["L"], 5] = L
        m[i["one"], 5] = 1.0
        m[i["chi_L_moe"], 5] = self._chi * self._L_moe
        return m

    def terms_from_stats(self, stats: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Terms from ``(T_pf, A, T_dc, C, B, 1)`` (:func:`batch_stats`) — the streaming path."""
        return self.coef @ np.asarray(stats, dtype=np.float64)

    def terms_many(self, stats: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Vectorised terms for many batches: ``stats`` is ``(n, 6)``, result ``(n, 11)``.

        A row with ``B = 0`` (an empty batch) yields all zeros, like :meth:`terms`.
        """
        s = np.asarray(stats, dtype=np.float64)
        out = s @ self._coef_t
        empty = s[:, 4] == 0
        if empty.any():
            out[empty] = 0.0
        return out

    def fast_terms(self, requests: Sequence[BatchRequest]) -> npt.NDArray[np.float64]:
        """Streaming-path equivalent of :meth:`terms` (agrees to ~1e-15 relative)."""
        if not requests:
            return np.zeros(N_TERMS)
        return self.coef @ batch_stats(requests)

    def terms_from_aggregates(
        self,
        agg: StepAggregates,
        context_tokens: float | None = None,
        *,
        block_size: int = 16,
        mean_prompt_len: float | None = None,
    ) -> npt.NDArray[np.float64]:
        """Approximate terms when only the BATCH_SUMMARY totals are known.

        Assumptions (each exact for the common case it names):

        * ``T_pf = prefill_tokens``, ``T_dc = num_decode_reqs`` (BLIS counts one token per
          decode request), ``B = num_prefill_reqs + num_decode_reqs``; ``T_weight``, ``L``,
          ``1``, ``χ·L_moe``, ``T_pf_kv``, the TP and dispatch terms depend only on these
          and are therefore exact.
        * prefill attention: every prefill request gets the mean chunk ``t̄ = T_pf/n_pf``
          and a prompt of ``mean_prompt_len`` (default ``t̄``, i.e. un-chunked prefills
          without prefix hits), so ``Σ t(I + t/2) ≈ n_pf · t̄ · (I + t̄/2)``. Exact for
          equal-length whole prompts; by convexity it under-estimates mixed lengths.
        * decode context ``C``: ``context_tokens`` when given, else from KV blocks in use
          ``(total − free)·block_size``, less half a block of slack per running request and
          less the tokens this step writes (``T_pf + T_dc``), floored at 0. Prefix-cached
          blocks shared between requests and prefill progress of later chunks make this
          approximate (evictable cached blocks are counted free by vLLM, so they do not
          inflate it).
        """
        n_pf = agg.num_prefill_reqs
        t_pf = float(agg.prefill_tokens) if n_pf > 0 else 0.0
        t_dc = float(agg.num_decode_reqs)
        n_req = float(agg.num_prefill_reqs + agg.num_decode_reqs)
        if n_req == 0:
            return np.zeros(N_TERMS)
        a_sum = 0.0
        if n_pf > 0 and t_pf > 0:
            t_bar = t_pf / n_pf
            i_bar = t_bar if mean_prompt_len is None else max(float(mean_prompt_len), t_bar)
            a_sum = n_pf * t_bar * (i_bar + t_bar / 2)
        if t_dc <= 0:
            ctx = 0.0
        elif context_tokens is not None:
            ctx = float(context_tokens)
        else:
            used = float(agg.kv_blocks_total_gpu - agg.kv_blocks_free_gpu)
            running = float(max(agg.running_depth, n_pf + agg.num_decode_reqs))
            ctx = used * block_size - running * block_size / 2 - t_pf - t_dc
            ctx = max(0.0, ctx)
        stats = np.array([t_pf, a_sum, t_dc, ctx, n_req, 1.0])
        return self.coef @ stats

    # ------------------------------------------------------------------ misc

    def stats_for(self, requests: Sequence[BatchRequest]) -> npt.NDArray[np.float64]:
        """:func:`batch_stats` (convenience for :meth:`terms_many`)."""
        return batch_stats(requests)

    def describe(self) -> dict[str, Any]:
        """Per-configuration constants for logs and the CLI."""
        return {
            "model": self.model.name,
            "gpu": self.hw.name,
            "tp": self.tp,
            "dp": self.dp,
            "moe_comm_backend": self.moe_comm_backend,
            "phi_flop_per_us": self._phi,
            "bw_bytes_per_us": self._bw,
            "t_weight_us": self._t_weight,
        }
