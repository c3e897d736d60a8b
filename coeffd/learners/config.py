"""Settings of the learners (the ``learners`` section of the daemon settings).

Defaults are the values ``bench/learning.py`` was run with; each says why it is what it is.

>>> cfg = LearnersConfig()
>>> cfg.forgetting, cfg.drift.detector
(0.989, 'adwin')
>>> LearnersConfig(forgetting=1.5)
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for LearnersConfig
...
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DriftConfig", "EvaluationConfig", "LearnersConfig"]


class DriftConfig(BaseModel):
    """Drift detection on standardised residuals and the reaction to an alarm."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = True
    detector: Literal["adwin", "page_hinkley"] = "adwin"
    # ADWIN delta 1e-4 (River's default is 2e-3): no alarm on the stationary streams of the
    # tests (3 × 20 000 steps, with stalls) and of bench/learning.py, while the bench's
    # abrupt change (+30 % compute, +25 % decode KV) is caught ~40 observations after it.
    params: dict[str, Any] = Field(default_factory=dict, description="River detector kwargs")
    grace: int = Field(default=100, ge=0, description="observations ignored after (re)start")
    keep: float = Field(default=0.01, gt=0, le=1, description="information kept on alarm")
    fast_forgetting: float = Field(default=0.97, gt=0, le=1)
    fast_for: int = Field(default=60, ge=0, description="observations at fast forgetting")


class EvaluationConfig(BaseModel):
    """Prequential evaluation and the batch-refit baseline."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # Both windows are preallocated per configuration (a window of 2**63 raised "array is
    # too big" when the first configuration was created): at most 100,000 rows, 0.4 MB
    # per rolling-error ring, ~5 MB of batch-refit rows (bench/fleetview.py runs 20,000).
    window: int = Field(default=500, ge=10, le=100_000, description="rolling window for MAPE/RMSE")
    baseline_window: int = Field(
        default=1000, ge=20, le=100_000, description="batch refit: rows kept"
    )
    baseline_refit_every: int = Field(default=100, ge=1, description="batch refit cadence")
    kv_saturated: float = Field(default=0.9, gt=0, le=1, description="KV usage of the KV regime")
    heavy_fraction: float = Field(default=0.8, gt=0.5, lt=1, description="prefill/decode-heavy")


class LearnersConfig(BaseModel):
    """Per-configuration learners: forgetting, robustness, priors, registry bounds."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    # λ = 0.989: memory ~90 steps (about a second of a busy engine). bench/learning.py
    # trades two drift shapes against each other: shorter memory tracks a gradual drift
    # better, longer memory averages better between sudden changes. 0.99 missed the
    # gradual target (0.767 of the best batch refit), 0.9875 the multi-change one (0.760);
    # 0.989 meets both (0.732, 0.744) with steady error 1.2 % above the noise floor.
    forgetting: float = Field(default=0.989, gt=0, le=1)
    alpha_forgetting: float = Field(default=0.995, gt=0, le=1, description="API overheads")
    # α0 rows are arrival→QUEUED less the *expected* loop wait: each request's own wait is
    # uniform over its loop iteration, so a row is off by ±length/√12 — 40 % of α0 on an
    # engine with 25 ms steps. 0.995 (~200 rows) left α0 2–5 % off on such engines at
    # vLLM's default sampling (simfleet fleet, 300 s); ~2,000 rows bring it to ≲ 1.5 %.
    # Drift still resets it (the detector watches its residuals like the others').
    queueing_forgetting: float = Field(
        default=0.9995, gt=0, le=1, description="α0 (arrival → queued, loop wait removed)"
    )
    kv_forgetting: float = Field(default=0.995, gt=0, le=1, description="KV transfer model")
    huber: float | None = Field(default=3.0, gt=0, description="Huber threshold (σ units)")
    weighting: Literal["none", "relative"] = "relative"
    scale_memory: float = Field(default=50.0, ge=1)
    refresh_every: int = Field(default=16, ge=1, description="rows per fold / θ_w refresh")
    # Prior strength in "relative" units: a coefficient that carries share s of the step
    # time gets a prior worth ≈ strength/s² observations (see learners.prior). 0.01: the
    # prior decides only what the data cannot (bench: 1.0 kept steady error 5–20 % above
    # the floor through prior bias in collinear directions).
    # A zero coefficient's prior precision is strength / floor²: the bounds keep it finite
    # (≤ 1e18; a floor of 1e-300 made it inf and the first configuration's learners
    # raised "prior_precision must be finite"; a floor of 1e300 overflowed squared). A
    # strength of 1e6 already pins the prior, a floor of 1e6 is no prior at all.
    prior_strength: float = Field(default=0.01, gt=0, le=1e6)
    prior_scale_floor: float = Field(
        default=1.0, ge=1e-6, le=1e6, description="prior scale of zero coefs"
    )
    identify_threshold: float = Field(default=0.5, gt=0, lt=1)
    # The published β (issue 15, learners.steady): a long-memory learner in steady state
    # (0.9999: ~10,000 observations, ~100 s of one engine at every-step sampling; bench
    # closedloop: 0.9995 still moved consecutive versions by 0.6 % of the step time;
    # bench learning: error vs the noiseless truth ~4× below the fast tracker's), the
    # fast tracker only while the physics changes.
    steady: bool = Field(default=True, description="publish the long-memory β estimate")
    steady_forgetting: float = Field(default=0.9999, gt=0, le=1)
    # Directions of β-space whose relative standard deviation (long-memory data) exceeds
    # this keep the pooled prior instead of following noise (learners.steady.identified_fit).
    identify_max_rel_std: float = Field(default=0.1, gt=0)
    # Publish those directions at the prior (True) or at the long-memory posterior (False:
    # the weak prior still decides only what the data cannot; pinning a collinear pair's
    # weak direction to BLIS's zero default biased its partner 20 % in tests).
    identify_pin: bool = False
    # The fleet model's trust in any one configuration (learners.fleet.members, "Quirks"): how far
    # a configuration's true coefficients stray, relative to each, from the fleet's shared
    # structure. 0: every member's information at face value.
    fleet_quirk: float = Field(default=0.02, ge=0.0, le=0.5)
    max_configurations: int = Field(default=128, ge=1, description="LRU bound of live sets")
    max_parked: int = Field(default=1024, ge=0, description="evicted states kept in memory")
    extended: bool = Field(default=True, description="also learn the extended-feature model")
    drift: DriftConfig = Field(default_factory=DriftConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
