"""Learning-side metric families (names: CONTRIBUTING.md), on the app's registry."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from coeffd.daemon.batchhist import BatchHistogram
from coeffd.learners.features.basis import TERM_NAMES
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.targets import ALPHA_TARGETS

__all__ = [
    "ERROR_HISTOGRAM_BUCKETS",
    "SOURCES",
    "UNCONFIGURED_REASONS",
    "ServeMetrics",
    "coefficient_unit",
    "describe_configuration",
]

#: Relative errors of step periods sit around the noise (a few %); defaults are often
#: off by 30-300 %: buckets cover both ends.
_ERROR_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
_FRESHNESS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Prediction sources exported as the ``coefficients`` label (bounded).
SOURCES = ("learned", "blis_default", "batch_refit", "learned_extended")


#: ``coeffd_observations_unconfigured_total{reason}``: every reason, exported at 0 from the
#: start (``configs.ConfigResolver.reason``, ``features.config.problem_reason``).
UNCONFIGURED_REASONS = (
    "no_configuration",
    "invalid_name",
    "unknown_model",
    "unknown_gpu",
    "invalid_model",
    "invalid_hardware",
    "invalid_configuration",
    "kv_engine_unknown",
)
#: ``coeffd_checkpoint_unusable_total{file, reason}`` (``checkpoints.py``), at 0 from the start.
_CHECKPOINT_FILES = ("latest", "previous")
_CHECKPOINT_PROBLEMS = ("unreadable", "corrupt", "invalid_content")
#: ``coeffd_drift_detections_total{config, target}`` targets, at 0 once a configuration is
#: described: the step-time learners (``step_period``) and the α learners.
_DRIFT_TARGETS = ("step_period", *ALPHA_TARGETS)


def coefficient_unit(vector: str, index: int) -> str:
    """The unit of a published coefficient: α are µs (per request or per token); a β that
    multiplies a time term (``T_…``) is a ``ratio``, one that multiplies a count (layers,
    requests, the step itself) is µs per unit.

    >>> [coefficient_unit("beta", i) for i in (0, 4, 6, 9)]
    ['ratio', 'microseconds', 'microseconds', 'ratio']
    >>> coefficient_unit("alpha", 0)
    'microseconds'
    """
    if vector.startswith("beta") and index < len(TERM_NAMES):
        return "ratio" if TERM_NAMES[index].startswith("T_") else "microseconds"
    return "microseconds"


class _CoefficientGauge:
    """``coeffd_coefficient_value{config, vector, index, unit}``: ``labels(config, vector,
    index)`` adds the unit, so µs and dimensionless values never share a series set
    without a label telling them apart."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.gauge = Gauge(
            "coeffd_coefficient_value",
            "Published coefficient values (BLIS order and units; unit: microseconds or ratio).",
            ["config", "vector", "index", "unit"],
            registry=registry,
        )

    def labels(self, config: str, vector: str, index: str) -> Gauge:
        return self.gauge.labels(config, vector, index, coefficient_unit(vector, int(index)))


#: ``http.error_histograms``: per-configuration error histogram buckets (``off``: none).
ERROR_HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "full": _ERROR_BUCKETS,
    "coarse": (0.02, 0.05, 0.1, 0.3),
}


class _NoHistogram:
    """``http.error_histograms = "off"``: the rolling MAPE gauges only."""

    def observe(self, key: tuple[str, ...], value: float) -> None:
        pass

    def observe_many(self, key: tuple[str, ...], values: Any) -> None:
        pass


class ServeMetrics:
    """Learning-side metric families (names: CONTRIBUTING.md), on the app's registry.

    ``error_histograms`` (``full``, ``coarse``, ``off``) sizes the per-configuration
    prediction-error histograms, most of a configuration's series (CONTRIBUTING "Reference",
    Operations, gives the counts).
    """

    def __init__(self, registry: CollectorRegistry, error_histograms: str = "full") -> None:
        self.relative_error: BatchHistogram | _NoHistogram = _NoHistogram()
        if error_histograms != "off":
            self.relative_error = BatchHistogram(
                "coeffd_prediction_relative_error_ratio",
                "|measured - predicted| / measured of every observation, predicted before "
                "learning (brought up to date at each tick of the pipeline worker).",
                ["config", "target", "coefficients"],
                ERROR_HISTOGRAM_BUCKETS[error_histograms],
                registry,
            )
        self.configuration_info = Info(
            "coeffd_configuration",
            "What each configuration id stands for (model, GPU, TP, knobs), for dashboards.",
            ["config"],
            registry=registry,
        )
        self.mape = Gauge(
            "coeffd_prediction_mape_ratio",
            "Rolling mean absolute percentage error (fraction) per configuration and target.",
            ["config", "target", "coefficients"],
            registry=registry,
        )
        self.step_time_std = Gauge(
            "coeffd_step_time_standard_error_ratio",
            "Estimated error of the published beta against the noiseless truth: relative "
            "standard error of its predicted step time on a fixed set of batches per regime.",
            ["config", "regime"],
            registry=registry,
        )
        self.coefficient = _CoefficientGauge(registry)
        self.learner_observations = Counter(
            "coeffd_learner_observations_total",
            "Observations learned, per configuration and target (brought up to date at each "
            "tick of the pipeline worker).",
            ["config", "target"],
            registry=registry,
        )
        self.drift = Counter(
            "coeffd_drift_detections_total",
            "Drift detections on learner residuals.",
            ["config", "target"],
            registry=registry,
        )
        self.approximate = Counter(
            "coeffd_step_observations_approximate_total",
            "Step observations with only BATCH_SUMMARY totals, not learned while most "
            "steps of their configuration come with per-request compositions.",
            registry=registry,
        )
        self.unresolved = Counter(
            "coeffd_observations_unconfigured_total",
            "Observations skipped because their source names no usable configuration.",
            ["reason"],
            registry=registry,
        )
        for reason in UNCONFIGURED_REASONS:
            self.unresolved.labels(reason)
        self.configurations = Gauge(
            "coeffd_configurations", "Configurations with live learners.", registry=registry
        )
        self.freshness = Histogram(
            "coeffd_snapshot_freshness_seconds",
            "Time from an observation's arrival to the first snapshot that includes it.",
            buckets=_FRESHNESS_BUCKETS,
            registry=registry,
        )
        self.step_freshness = Histogram(
            "coeffd_step_freshness_seconds",
            "Time from a step summary's arrival to the first snapshot learned from it "
            "(includes the joiner's wait for the journey events around the step).",
            buckets=(*_FRESHNESS_BUCKETS, 120.0, 300.0),
            registry=registry,
        )
        self.publish_refused = Counter(
            "coeffd_snapshot_refused_total",
            "Snapshots not published because the vector was invalid for BLIS.",
            ["config"],
            registry=registry,
        )
        self.checkpoints = Counter(
            "coeffd_checkpoints_total", "Checkpoints written.", registry=registry
        )
        self.checkpoint_failures = Counter(
            "coeffd_checkpoint_failures_total",
            "Checkpoint writes that failed (disk full, read-only, permissions): learning "
            "since the last good one is lost on a restart.",
            registry=registry,
        )
        self.snapshot_write_failures = Counter(
            "coeffd_snapshot_write_failures_total",
            "Snapshot writes that failed (disk full, read-only, permissions); refusals of "
            "invalid vectors are coeffd_snapshot_refused_total.",
            ["config"],
            registry=registry,
        )
        self.checkpoint_unusable = Counter(
            "coeffd_checkpoint_unusable_total",
            "Checkpoint files found unusable at start-up, by file (latest, previous) and "
            "reason (unreadable, corrupt, invalid_content); the next one was tried.",
            ["file", "reason"],
            registry=registry,
        )
        for file in _CHECKPOINT_FILES:
            for problem in _CHECKPOINT_PROBLEMS:
                self.checkpoint_unusable.labels(file, problem)


def describe_configuration(metrics: ServeMetrics, cfg: ServingConfig) -> None:
    """Export ``coeffd_configuration_info{config, model, gpu, tp, …} 1`` for ``cfg``, and
    its labelled counters at 0 (a dashboard shows 0, not "No data", before the first
    drift alarm or failed write)."""
    labels = {k: v for k, v in cfg.labels.items() if k != "config"}
    metrics.configuration_info.labels(cfg.id).info(labels)
    for target in _DRIFT_TARGETS:
        metrics.drift.labels(cfg.id, target)
    metrics.publish_refused.labels(cfg.id)
    metrics.snapshot_write_failures.labels(cfg.id)
