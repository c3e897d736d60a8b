"""How BLIS's α coefficients enter TTFT, ITL and E2E (spec §6), for evaluation.

Each α is truncated to whole µs when used: ``A0 = trunc(α₀)`` (QueueingTime: arrival →
schedulable), ``A1 = trunc(α₁)`` (PostDecodeFixedOverhead: once per request with output, E2E
only), ``A2 = trunc(α₂)`` (OutputTokenProcessingTime: once in TTFT and in every ITL sample).

* ``TTFT = t_s + Δ_step + A2 − t_a`` for the step that completes the prefill;
* each decode step adds an ITL sample ``Δ_step + A2``;
* ``E2E = TTFT + Σ ITL + [O > 0]·A1``; completion time ``t_a + E2E``.

The worked timeline of spec §6 (Llama-3.1-8B, H100, TP 1, one request I = 256, O = 3):

>>> from coeffd.learners.features.basis import BlisBasis, BLIS_DEFAULT_ALPHA, BLIS_DEFAULT_BETA
>>> from coeffd.learners.features.catalog import load_model
>>> from coeffd.learners.features.hardware import load_hardware
>>> basis = BlisBasis(load_model("llama-3.1-8b-instruct"), load_hardware("H100"), tp=1)
>>> tl = single_request_timeline(basis, BLIS_DEFAULT_BETA, BLIS_DEFAULT_ALPHA, 256, 3)
>>> tl.ttft_us, tl.itls_us, tl.e2e_us
(23000, (6899, 6899), 37575)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coeffd.learners.features.basis import BlisBasis, check_coeffs
from coeffd.records.observations import BatchRequest

__all__ = [
    "AlphaTimes",
    "RequestTimeline",
    "itl_metric",
    "predict_e2e",
    "predict_itl",
    "predict_ttft",
    "single_request_timeline",
]


@dataclass(frozen=True, slots=True)
class AlphaTimes:
    """The three α values as BLIS uses them: truncated integer µs."""

    queueing_us: int  # A0
    post_decode_us: int  # A1
    output_token_us: int  # A2

    @classmethod
    def from_coeffs(cls, alpha: Sequence[float]) -> AlphaTimes:
        """Validate (≥ 3 values, finite, ≥ 0; extras validated but ignored) and truncate.

        >>> AlphaTimes.from_coeffs([15563.199579, 777.3455, 45.907545])
        AlphaTimes(queueing_us=15563, post_decode_us=777, output_token_us=45)
        """
        if len(alpha) < 3:
            raise ValueError(f"AlphaCoeffs requires at least 3 elements, got {len(alpha)}")
        check_coeffs(alpha, "alpha")
        return cls(int(alpha[0]), int(alpha[1]), int(alpha[2]))


def _alpha(alpha: AlphaTimes | Sequence[float]) -> AlphaTimes:
    return alpha if isinstance(alpha, AlphaTimes) else AlphaTimes.from_coeffs(alpha)


def predict_ttft(
    arrival_us: int,
    prefill_step_start_us: int,
    prefill_step_us: int,
    alpha: AlphaTimes | Sequence[float],
) -> int:
    """TTFT of a request whose prefill completes in the step ``[start, start + Δ)``."""
    return prefill_step_start_us + prefill_step_us + _alpha(alpha).output_token_us - arrival_us


def predict_itl(step_us: int, alpha: AlphaTimes | Sequence[float]) -> int:
    """One ITL sample for a decode step of duration ``Δ``: ``Δ + A2``."""
    return step_us + _alpha(alpha).output_token_us


def predict_e2e(
    ttft_us: int, itls_us: Sequence[int], output_len: int, alpha: AlphaTimes | Sequence[float]
) -> int:
    """``E2E = TTFT + Σ ITL + [O > 0]·A1``."""
    a1 = _alpha(alpha).post_decode_us if output_len > 0 else 0
    return ttft_us + sum(itls_us) + a1


def itl_metric(itls_us: Sequence[int], output_len: int) -> float:
    """Per-request ITL/TPOT metric: ``Σ ITL / max(O − 1, 1)`` (excludes A1)."""
    return sum(itls_us) / max(output_len - 1, 1)


@dataclass(frozen=True, slots=True)
class RequestTimeline:
    """The life of one request on an otherwise idle instance (spec §6 worked timeline)."""

    arrival_us: int
    enqueued_us: int
    step_starts_us: tuple[int, ...]
    step_durations_us: tuple[int, ...]
    step_s: tuple[float, ...]  # unrounded S of each step
    ttft_us: int
    itls_us: tuple[int, ...]
    e2e_us: int
    completion_us: int
    mean_itl_us: float


def single_request_timeline(
    basis: BlisBasis,
    beta: Sequence[float],
    alpha: AlphaTimes | Sequence[float],
    input_len: int,
    output_len: int,
    *,
    arrival_us: int = 0,
    chunk_size: int | None = None,
) -> RequestTimeline:
    """Replay one request alone through BLIS's step loop (no reload latency, no LoRA).

    The prefill is split into chunks of ``chunk_size`` tokens when given (each chunk is a
    step; TTFT is set by the last). The ``j``-th decode step sees ``p = I + j − 1``.
    """
    a = _alpha(alpha)
    now = arrival_us + a.queueing_us
    enqueued = now
    starts: list[int] = []
    durations: list[int] = []
    s_values: list[float] = []
    itls: list[int] = []
    ttft = 0

    def run(req: BatchRequest) -> int:
        nonlocal now
        s = basis.step_s(beta, [req])
        dur = max(1, basis.step_time(beta, [req]))
        starts.append(now)
        durations.append(dur)
        s_values.append(s)
        now += dur
        return dur

    done = 0
    chunk = chunk_size if chunk_size and chunk_size > 0 else max(input_len, 1)
    while done < input_len:
        t = min(chunk, input_len - done)
        start = now
        dur = run(BatchRequest(input_len, done, t, output_len))
        done += t
        if done >= input_len:
            ttft = predict_ttft(arrival_us, start, dur, a)
    for j in range(1, output_len):
        dur = run(BatchRequest(input_len, input_len + j - 1, 1, output_len))
        itls.append(predict_itl(dur, a))
    e2e = predict_e2e(ttft, itls, output_len, a)
    return RequestTimeline(
        arrival_us=arrival_us,
        enqueued_us=enqueued,
        step_starts_us=tuple(starts),
        step_durations_us=tuple(durations),
        step_s=tuple(s_values),
        ttft_us=ttft,
        itls_us=tuple(itls),
        e2e_us=e2e,
        completion_us=arrival_us + e2e,
        mean_itl_us=itl_metric(itls, output_len),
    )
