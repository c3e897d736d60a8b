"""Settings of the sliding-window joiner (a section of the daemon's settings).

Every bound the joiner enforces lives here, so memory and latency of the join are a
configuration decision, not a code constant. Times are seconds of the *emitting
process's* clock (the joiner never compares clocks of different processes), offsets in
microseconds.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Upper bound of every seconds setting here: 30 days. The joiner holds data and
#: deadlines as int nanoseconds (``int(s * 1e9)``: 1e300 s overflowed to inf and raised
#: OverflowError when the joiner was built), and a wall clock (~1.8e18 ns) plus this
#: stays far inside int64. Far above any backlog worth joining (the OTel SDK retries for
#: ~63 s, the Collector's queue ~5 min), yet long enough for "never expires" in tests
#: (a window of 1e6 s, ~12 days). Floats are finite-only (``allow_inf_nan=False``).
MAX_SECONDS = 30 * 86_400.0


class AnchorPriors(BaseModel):
    """Bounds (µs) on ``S(n) - t`` for each journey anchor type before calibration.

    A journey event at mono time ``t`` pins the start ``S(n)`` of some step ``n`` to
    ``[t + lo, t + hi]`` (spec §2.5 step 2). Once enough steps carry both a summary and
    an anchor, the joiner replaces these priors by the range it observed (plus a margin);
    the priors only need to be *safe*, not tight.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # SCHEDULED(n) lies in [S(n), E(n)]: S(n) = t - (0 .. scheduler CPU time)
    scheduled_lo_us: float = -3000.0
    scheduled_hi_us: float = 0.0
    # QUEUED(n-1) / aborted FINISHED: input drain just before S(n)
    queued_lo_us: float = 0.0
    queued_hi_us: float = 500.0
    # FIRST_TOKEN / FINISHED(n-1) (sync) or (n-2) (async): rest of output processing
    completion_lo_us: float = 0.0
    completion_hi_us: float = 2000.0

    @model_validator(mode="after")
    def _ranges(self) -> AnchorPriors:
        # lo > hi is an empty range: no anchor of that type would pin any step, silently
        for kind in ("scheduled", "queued", "completion"):
            lo, hi = getattr(self, f"{kind}_lo_us"), getattr(self, f"{kind}_hi_us")
            if lo > hi:
                raise ValueError(
                    f"joiner.anchor_priors.{kind}_lo_us ({lo}) must be at most "
                    f"joiner.anchor_priors.{kind}_hi_us ({hi})"
                )
        return self


class JoinerConfig(BaseModel):
    """``[joiner]`` settings section.

    >>> JoinerConfig().window_s
    30.0
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    window_s: float = Field(
        default=30.0,
        gt=0,
        le=MAX_SECONDS,
        description="How long (seconds of the emitting process's wall clock) a partial join "
        "waits for its other parts; also the dedupe horizon.",
    )
    max_lateness_s: float = Field(
        default=300.0,
        gt=0,
        le=MAX_SECONDS,
        description="How far (seconds of its own wall clock) a span may lag behind the newest "
        "data of its source and still be joined: a backlog the OTel SDK (~63 s) or the "
        "Collector's sending queue (5 min) delivers after an outage. Older data is counted as "
        "late (coeffd_join_outcomes_total), not joined. Each source's window follows its own "
        "data, so a whole backlog delivered in one burst is joined as if live; an idle "
        "source is finished by the receiver's clock. Taken as window_s when smaller.",
    )
    composition_wait_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="How long (seconds of the engine's wall clock after its summary) a "
        "sampled step whose requests are still running waits for their journeys, which "
        "vLLM exports only when a request ends: its period is decided at window_s, its "
        "batch once every request in it has ended (an exact composition), else at this "
        "deadline from the summary's totals, whose decode context is estimated (12 % low "
        "under prefix sharing). A generation longer than window_s is common (minutes in "
        "production; 58 % of Mixtral's 28 ms steps at every-step sampling held one). "
        "None: max_lateness_s; window_s or less: no wait.",
    )
    max_composition_waits: int = Field(
        default=8192,
        gt=0,
        description="Max steps per engine waiting for their requests' journeys "
        "(composition_wait_s); at the cap the oldest leaves with its summary's totals, "
        "counted in coeffd_composition_waits_total{outcome=capacity}. ~1.5 KB each: at "
        "every-step sampling 8192 are ~4 minutes of a 28 ms-step engine, at vLLM's 1 % "
        "step sampling a few dozen are held.",
    )
    max_requests: int = Field(
        default=100_000, gt=0, description="Max requests held (in flight + tombstones)."
    )
    max_steps: int = Field(default=50_000, gt=0, description="Max sampled steps held per engine.")
    max_anchor_steps: int = Field(
        default=200_000, gt=0, description="Max steps with journey anchors held per engine."
    )
    max_kv_transfers: int = Field(default=50_000, gt=0, description="Max open KV transfers held.")
    max_engines: int = Field(
        default=4096,
        gt=0,
        description="Max distinct engines (sources) tracked; at the cap the 1/16 heard "
        "from longest ago are forgotten. Sized for a fleet: a daemon core learns from "
        "~1,000 engines at vLLM's default sampling, and a restarted pod comes back under "
        "a new identity while the old one is kept for max_lateness_s, so 4x covers three "
        "rolling restarts in that time. Memory: ~12 KB per engine held before its data.",
    )

    async_scheduling: bool | None = Field(
        default=None,
        description="Force the engine loop mode; None = resource attribute "
        "`coeffd.async_scheduling`, else inferred from FIRST_TOKEN vs summary timing.",
    )
    warmup_steps: int = Field(
        default=32, ge=0, description="Steps 1..warmup_steps of each engine never yield a period."
    )
    max_period_ms: float = Field(
        default=2000.0, gt=0, description="A period above this is an idle gap or a stall: rejected."
    )
    outlier_factor: float = Field(
        default=8.0,
        gt=1,
        description="Reject a period above this multiple of the engine's recent median "
        "(an idle gap or stall hidden between two anchors).",
    )
    max_uncertainty_fraction: float = Field(
        default=0.05,
        gt=0,
        description="Reject an anchor-reconstructed period whose half-width exceeds this "
        "fraction of the period. Before the anchor offsets are calibrated (a few minutes at "
        "vLLM's default 1 % step sampling) the prior bounds are ~1 ms wide, so this keeps "
        "uncalibrated, up-to-10 %-off periods away from the learners.",
    )
    loop_jitter_us: float = Field(
        default=100.0,
        ge=0,
        description="Uncertainty floor: CPU work between the GPU finishing a batch and the "
        "next schedule() (output processing, input drain) varies from step to step, so even "
        "exact schedule starts bound the batch's own time only to this.",
    )
    journey_steps: bool = Field(
        default=True,
        description="Turn unsampled steps pinned by journey events into period observations "
        "(spans between summaries; the bulk of the step observations at vLLM's default 1 % "
        "step sampling). Off: only summarised steps are observed.",
    )
    max_span_steps: int = Field(
        default=32,
        ge=1,
        description="Longest run of unsampled steps between two journey-pinned schedule "
        "starts that becomes one observation (the sum of their periods).",
    )
    loop_wait_delay_s: float = Field(
        default=10.0,
        gt=0,
        le=MAX_SECONDS,
        description="How long (data seconds after a request's QUEUED) its loop wait waits "
        "for the journeys of the requests around it before it is decided; the request "
        "observation is held that long. Must stay below window_s (the steps it reads are "
        "held that long).",
    )
    loop_wait_max_uncertainty_us: float = Field(
        default=1000.0,
        gt=0,
        description="A request's loop wait (removed from arrival→queued for α0) is left "
        "unknown when the schedule start before its QUEUED is pinned less tightly than this.",
    )
    anchor_priors: AnchorPriors = Field(default_factory=AnchorPriors)
    min_calibration: int = Field(
        default=8,
        ge=1,
        description="Coincidences needed before observed anchor offsets replace priors.",
    )
    loop_wait_min_calibration: int = Field(
        default=4,
        ge=1,
        description="Coincidences an anchor type needs before its mean offset places the "
        "schedule start a request's loop wait is measured from (bounds stay the priors' "
        "until min_calibration). At vLLM's 1 % step sampling min_calibration takes ~2 "
        "minutes of a MoE engine, and until then no request's loop wait is known, so α0 "
        "learns nothing; the wait needs the start to ±1 ms, not the bounds' precision.",
    )
    calibration_margin_us: float = Field(
        default=10.0, ge=0, description="Added on each side of the observed anchor-offset range."
    )
    calibration_margin_fraction: float = Field(
        default=0.25, ge=0, description="Fraction of the observed range added on each side."
    )
    same_host_tolerance_us: float = Field(
        default=200.0,
        gt=0,
        description="Max |wall-mono offset(API) - wall-mono offset(engine)| for one host.",
    )
    queue_state_max_distance: int = Field(
        default=1000, ge=0, description="Max |summary step - queued step| for the queue state."
    )
    summary_log_interval_s: float = Field(
        default=60.0,
        gt=0,
        le=MAX_SECONDS,
        description="Seconds between structured window-summary log lines.",
    )
    kv_link_keys: tuple[str, ...] = Field(
        default=("coeffd.engine", "service.instance.id", "k8s.pod.name", "service.name"),
        description="Resource keys whose equal values link a KV publisher to an EngineCore.",
    )
