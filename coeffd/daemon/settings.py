"""Daemon settings: defaults ← TOML file ← environment ← command-line flags.

Length: every section the daemon reads, with its limits and start-up messages, in one
place on purpose (one file to read to know every setting).

Each concern is one nested model (a *section*); the top-level :class:`Settings` lists
the sections. Adding a section is one line in :class:`Settings`, importing the section's
model from the module that owns it, e.g.::

    joiner: JoinerConfig = Field(default_factory=JoinerConfig)

Environment variables are ``COEFFD_<SECTION>__<KEY>`` (nested with ``__``), e.g.
``COEFFD_RECEIVERS__OTLP_GRPC__ENDPOINT=0.0.0.0:4317``. The TOML file comes from
``--config`` or ``COEFFD_CONFIG``. Unknown keys are errors (a typo must not be silently
ignored), and :func:`format_validation_error` turns the first problem into the one line
the CLI prints: ``invalid setting receivers.otlp_grpc.endpoint='foo': expected HOST:PORT``.

>>> s = load_settings(overrides={"pipeline": {"queue_capacity": 10}}, environ={})
>>> (s.pipeline.queue_capacity, s.receivers.otlp_grpc.endpoint)
(10, '0.0.0.0:4317')
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from coeffd.base.endpoint import Endpoint, parse_endpoint
from coeffd.base.security import AuthSettings, TlsSettings
from coeffd.daemon.query.config import QuerySettings
from coeffd.joiner.config import JoinerConfig
from coeffd.learners.config import LearnersConfig
from coeffd.learners.features.basis import BlisBasis
from coeffd.learners.features.config import CatalogSettings, ConfigurationSettings
from coeffd.learners.features.files import read_text_bounded
from coeffd.learners.features.hardware import load_hardware
from coeffd.receivers.config import ReceiverSettings

__all__ = [
    "HttpSettings",
    "InvalidSetting",
    "KVSettings",
    "LogSettings",
    "PipelineSettings",
    "PublishSettings",
    "Settings",
    "SettingsError",
    "StateSettings",
    "check_startup",
    "format_validation_error",
    "load_settings",
    "unwritable",
]

ENV_PREFIX = "COEFFD_"
CONFIG_ENV = "COEFFD_CONFIG"


class SettingsError(Exception):
    """Settings could not be loaded; ``str(e)`` is the one line to show the user."""


class InvalidSetting(ValueError):
    """Raised by validators that judge several keys: names the key the user should fix.

    >>> str(InvalidSetting("configuration.model", "required with mode = sidecar"))
    'invalid setting configuration.model: required with mode = sidecar'
    """

    def __init__(self, key: str, message: str, value: Any = None) -> None:
        shown = "" if value is None else f"={_shown(value)}"
        super().__init__(f"invalid setting {key}{shown}: {message}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class _Section(BaseModel):
    """Base of every section: unknown keys are errors, values are validated on assignment,
    numbers are finite (``inf`` and ``nan`` validated every bound-less float, then broke
    whatever converted them; every section model says ``allow_inf_nan=False``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class LogSettings(_Section):
    """Logging (structlog)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    #: ``auto``: JSON lines when stdout is not a TTY, human console output when it is.
    format: Literal["auto", "json", "console"] = "auto"
    #: Minimum seconds between two log lines about the same recurring problem (at most a
    #: day: a recurring problem is logged at least daily).
    rate_limit_seconds: float = Field(default=10.0, ge=0.0, le=86_400.0)


class HttpSettings(_Section):
    """The daemon's own HTTP server: ``/metrics``, ``/healthz``, ``/readyz``, API routes."""

    enabled: bool = True
    endpoint: Endpoint = "0.0.0.0:9464"
    tls: TlsSettings = Field(default_factory=TlsSettings)
    #: The token (and, with ``tls.client_ca_file``, a client certificate) guards every
    #: route except the probes ``/healthz`` and ``/readyz``: kubelet cannot present
    #: either, and they reveal only up/down.
    auth: AuthSettings = Field(default_factory=AuthSettings)
    #: ``/metrics`` answers without token or client certificate too (Prometheus'
    #: default scrape; the chart's NetworkPolicy limits who reaches the port, and the
    #: metrics hold counts and configuration ids, no telemetry). false = guarded like
    #: the API (give Prometheus ``authorization.credentials_file`` / a client cert).
    metrics_public: bool = True
    #: Per-configuration prediction-error histograms on /metrics: ``full`` (14 buckets),
    #: ``coarse`` (4) or ``off`` (the rolling MAPE gauges only): most of a
    #: configuration's series (CONTRIBUTING "Reference", Operations, gives the counts).
    error_histograms: Literal["full", "coarse", "off"] = "full"


def _check_blas_threads(value: int) -> int:
    if not 0 <= value <= 1024:
        raise ValueError(
            "expected a thread count from 0 to 1024: 1 (the default) on a machine shared "
            "with vLLM, 0 = the BLAS library's own default"
        )
    return value


class PipelineSettings(_Section):
    """The queue between receivers and the single pipeline worker."""

    #: Records (spans + events) waiting for the worker; receivers answer "retry later"
    #: when a request does not fit.
    queue_capacity: int = Field(default=200_000, ge=1, le=100_000_000)
    #: On shutdown, how long the worker may keep draining the queue.
    drain_timeout_seconds: float = Field(default=10.0, ge=0.0, le=3600.0)
    #: How often the consumer's ``tick`` runs (window expiry, publishing).
    tick_interval_seconds: float = Field(default=1.0, gt=0.0, le=60.0)
    #: ``learning``: joiner → learners → snapshots (the daemon). ``counting``: receivers
    #: and queue only, records counted and dropped (ingest benchmarks, debugging).
    consumer: Literal["learning", "counting"] = "learning"
    #: When learning falls behind, learn an evenly spread share of the step and request
    #: observations rather than make the receivers push back (which makes vLLM drop
    #: spans). The share is 1 below ``shed_start`` queue fill, ``shed_min_keep`` at
    #: ``shed_full``, linear in between; KV observations are always learned.
    #: false = push back.
    shed_learning: bool = True
    shed_start: float = Field(default=0.1, ge=0.0, lt=1.0)
    shed_full: float = Field(default=0.5, gt=0.0, le=1.0)
    shed_min_keep: float = Field(default=1 / 32, gt=0.0, le=1.0)
    #: Also shed when a tick (where a live daemon builds and learns the steps its window
    #: releases) takes more than this share of ``tick_interval_seconds``: long ticks delay
    #: every snapshot and starve the receivers. Measured in the pipeline worker's thread
    #: CPU time, not wall time: a tick's wall time also counts waiting for a core shared
    #: with vLLM or for the GIL held by the receivers, which shedding learning does not
    #: save (on a shared 2-core machine wall-clock ticks shed at about half a core; the
    #: queue-fill rules answer the receivers). 0 = shed on backlog only.
    shed_tick_budget: float = Field(default=0.4, ge=0.0, le=1.0)
    #: Engine sampling, past shedding: while the queue fill is at or above
    #: ``sample_engines_at`` and rising, halve the share of each configuration's engines
    #: whose spans are decoded and joined (the others' are counted in
    #: ``coeffd_events_sampled_out_total``, not decoded), down to
    #: ``sample_engines_min_share``; every configuration keeps at least
    #: ``sample_engines_min_per_config`` engines. The share doubles again after
    #: ``sample_engines_recover_seconds`` at or below ``shed_start`` with at least half of
    #: the steps learned and the CPU at most half of ``sample_engines_cpu`` (CPU-seconds a
    #: second; one Python process is GIL-bound at about one core). It also halves while
    #: the steps learned are at ``shed_min_keep`` and the OTLP/gRPC receiver's worker pool
    #: is full half of the time: the receivers then fall behind (requests wait before
    #: they are read), which the queue does not show. false = never (push back instead).
    sample_engines: bool = True
    sample_engines_at: float = Field(default=0.6, gt=0.0, le=1.0)
    sample_engines_min_share: float = Field(default=1 / 64, gt=0.0, le=1.0)
    sample_engines_min_per_config: int = Field(default=2, ge=1, le=10_000)
    sample_engines_recover_seconds: float = Field(default=60.0, ge=0.0, le=86_400.0)
    sample_engines_cpu: float = Field(default=0.9, gt=0.0, le=1024.0)
    #: Threads of numpy's BLAS (and any OpenMP pool) while the daemon runs. 1: the fleet
    #: refit's small matrix inverses ran ~20× slower with one BLAS thread per core on a
    #: 2-core machine shared with vLLM (the threads wait on busy cores); our matrices are
    #: too small to gain from more. 0 = the libraries' own default (one per core).
    blas_threads: Annotated[int, AfterValidator(_check_blas_threads)] = 1

    @model_validator(mode="after")
    def _shed_order(self) -> PipelineSettings:
        if self.shed_full <= self.shed_start:
            raise ValueError(
                f"pipeline.shed_full ({self.shed_full}) must be above pipeline.shed_start "
                f"({self.shed_start}); e.g. shed_start = 0.1, shed_full = 0.5"
            )
        if self.sample_engines_at <= self.shed_start:
            raise ValueError(
                f"pipeline.sample_engines_at ({self.sample_engines_at}) must be above "
                f"pipeline.shed_start ({self.shed_start}); e.g. sample_engines_at = 0.6"
            )
        return self


def _split_list(value: Any) -> Any:
    # A list setting given as one string (env var, --set, --kv-endpoint): comma-separated.
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _check_zmq_endpoint(value: str) -> str:
    if not value.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError("expected a ZMQ endpoint like tcp://HOST:PORT (or ipc://, inproc://)")
    return value


ZmqEndpoint = Annotated[str, AfterValidator(_check_zmq_endpoint)]


class KVSettings(_Section):
    """vLLM's ZMQ KV-event stream (``--kv-events-config``), for CPU-offload transfers.

    No TLS and no token: vLLM's ZMQ publisher has neither, so the stream must stay on
    localhost (a sidecar) or behind a NetworkPolicy (see :mod:`coeffd.base.security`).
    """

    #: Publisher endpoints. vLLM binds ``tcp://*:5557`` by default (DP rank r: port + r),
    #: so a sidecar connects to ``tcp://127.0.0.1:5557``. Empty = no KV stream.
    endpoints: Annotated[list[ZmqEndpoint], BeforeValidator(_split_list)] = Field(
        default_factory=list
    )
    #: Bind the endpoints instead of connecting (fan-in: engines configured with a
    #: non-wildcard endpoint connect to coeffd).
    bind: bool = False
    #: Subscription prefix ("" = everything).
    topic: str = ""
    #: Each engine publishes under its own topic naming it (its ``coeffd.engine``
    #: resource attribute); needed when several engines share one bound endpoint.
    topic_sources: bool = False
    #: The publisher's replay ROUTER (e.g. tcp://127.0.0.1:5558), asked to resend gaps.
    replay_endpoint: ZmqEndpoint | None = None


class PublishSettings(_Section):
    """Coefficient snapshots: versioned files that BLIS and ``coeffd pull`` read."""

    snapshot_dir: str = "snapshots"
    #: Snapshot versions kept per configuration (the newest).
    retention: int = Field(default=50, ge=1, le=100_000)
    #: Publish at most this often per configuration while its coefficients move...
    interval_seconds: float = Field(default=1.0, gt=0.0, le=86_400.0)
    #: ...or at once when an α moved by more than this fraction.
    relative_threshold: float = Field(default=0.02, gt=0.0, le=10.0)
    #: A new β is published only when it moves the predicted step time of the
    #: configuration's recent batches by more than this fraction on average; otherwise
    #: the interval's heartbeat republishes the previous numbers.
    step_time_threshold: float = Field(default=0.005, gt=0.0, le=10.0)
    #: No snapshot before a configuration has learned this many observations.
    min_observations: int = Field(default=20, ge=0)


class StateSettings(_Section):
    """Checkpoints of learner state, restored at start-up."""

    #: Directory of checkpoint files; "" disables checkpoints.
    state_dir: str = "state"
    #: A crash loses at most this much learning.
    checkpoint_interval_seconds: float = Field(default=30.0, gt=0.0, le=86_400.0)
    restore: bool = True


class TraceSettings(_Section):
    """The finished requests kept per configuration for ``coeffd trace`` (BLIS replay)."""

    #: Requests kept per configuration (the newest); 0 keeps none.
    max_requests: int = Field(default=50_000, ge=0, le=10_000_000)
    #: Requests that departed longer ago than this (before the newest one) are dropped.
    max_age_seconds: float = Field(default=3600.0, gt=0.0, le=7 * 86_400.0)


class Settings(BaseSettings):
    """All daemon settings. Add a section here with one line (see the module docstring)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
    )

    log: LogSettings = Field(default_factory=LogSettings)
    receivers: ReceiverSettings = Field(default_factory=ReceiverSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)
    #: ``sidecar``: one vLLM beside us; the OTLP and KV receivers default to localhost.
    #: ``standalone``: a shared service for a fleet; endpoints as configured.
    #: ``query``: no receivers, no learners: the merged view of ``query.peers`` (a query
    #: tier over sidecars or fleet replicas, :mod:`coeffd.daemon.query.view`).
    mode: Literal["standalone", "sidecar", "query"] = "standalone"
    kv: KVSettings = Field(default_factory=KVSettings)
    joiner: JoinerConfig = Field(default_factory=JoinerConfig)
    learners: LearnersConfig = Field(default_factory=LearnersConfig)
    publish: PublishSettings = Field(default_factory=PublishSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    #: The static configuration of a sidecar's vLLM (model, GPU, TP, knobs). Unset: every
    #: stream must name its configuration through ``coeffd.*`` resource attributes.
    configuration: ConfigurationSettings | None = None
    #: Directories of models and GPUs that telemetry may name besides the bundled ones.
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    #: The query tier's peers and how it asks them (read in ``mode = query`` only).
    query: QuerySettings = Field(default_factory=QuerySettings)
    #: The finished requests kept per configuration for ``coeffd trace`` (BLIS replay).
    trace: TraceSettings = Field(default_factory=TraceSettings)

    @model_validator(mode="after")
    def _sidecar_binds_localhost(self) -> Settings:
        # Only what vLLM sends to is local; /metrics stays reachable for Prometheus.
        if self.mode == "sidecar":
            if self.configuration is None:
                # A sidecar serves one vLLM whose spans carry no coeffd.* attributes: with
                # no static configuration every observation would be skipped, silently.
                raise InvalidSetting(
                    "configuration.model",
                    "required with mode = sidecar: give --model-config NAME|PATH "
                    "(or [configuration] model = ...)",
                )
            for section in (self.receivers.otlp_grpc, self.receivers.otlp_http):
                if "endpoint" not in section.model_fields_set:
                    _, port = parse_endpoint(section.endpoint)
                    object.__setattr__(section, "endpoint", f"127.0.0.1:{port}")
        if self.mode == "query":
            # the query tier receives nothing: no OTLP, no KV (only its HTTP API)
            for section in (self.receivers.otlp_grpc, self.receivers.otlp_http):
                object.__setattr__(section, "enabled", False)
            object.__setattr__(self.kv, "endpoints", [])
        if self.mode == "query" and not self.query.peers:
            raise InvalidSetting(
                "query.peers",
                "required with mode = query: give --peers http://HOST:9464,... or "
                "dns+HEADLESS-SERVICE:9464",
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # load_settings() composes TOML, env and CLI layers itself; Settings(**kw) is
        # defaults + kw only, so tests constructing Settings() never see the process env.
        return (init_settings,)


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def format_validation_error(err: ValidationError, layers: Mapping[str, Any] | None = None) -> str:
    """One line naming the key, the offending value and what is allowed."""
    e = err.errors(include_url=False)[0]
    cause = (e.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidSetting):
        return str(cause)
    key = ".".join(str(p) for p in e["loc"]) or "<root>"
    msg = e["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    if e["type"] == "extra_forbidden":
        return f"invalid setting {key}: unknown key"
    if e["type"] == "missing":
        return f"invalid setting {key}: required"
    return f"invalid setting {key}={_shown(e.get('input'))}: {msg}"


def _toml_layer(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        # Bounded, regular files only: a FIFO or device given as --config cannot hang us.
        return tomllib.loads(read_text_bounded(path))
    except FileNotFoundError:
        raise SettingsError(f"invalid setting config={str(path)!r}: file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"invalid setting config={str(path)!r}: {e}") from None
    except OSError as e:
        fix = "; save the file as UTF-8" if e.errno == errno.EILSEQ else ""
        raise SettingsError(f"invalid setting config={str(path)!r}: {e.strerror}{fix}") from None


def _check_toml_types(data: dict[str, Any]) -> None:
    """TOML values are typed: a number setting needs a number, a switch a boolean.

    Validation is lax for env and ``--set`` (their values are strings), so it would also
    read ``queue_capacity = true`` as 1 and ``enabled = 1`` as true; the TOML layer alone
    is checked strictly for wrong types first. Other problems are left to the full check,
    which sees every layer.
    """
    # Section by section: BaseSettings does not pass ``strict`` down to its fields.
    for name, value in data.items():
        field = Settings.model_fields.get(name)
        section = None if field is None else _section_model(field.annotation)
        if section is None or not isinstance(value, dict):
            continue  # unknown keys and top-level values: the full check reports them
        try:
            section.model_validate(value, strict=True)
        except ValidationError as err:
            _raise_type_error(err, name)


def _raise_type_error(err: ValidationError, section: str) -> None:
    for e in err.errors(include_url=False):
        # scalars only: strict mode would also refuse a TOML array for a tuple setting
        if e["type"] in _SCALAR_TYPE_ERRORS:
            key = ".".join(str(p) for p in (section, *e["loc"]))
            kind = e["type"].removesuffix("_type")
            wanted = _WANTED.get(kind, kind.replace("_", " "))
            raise SettingsError(
                f"invalid setting {key}={_shown(e.get('input'))}: expected {wanted} "
                f"in the TOML file, got {_toml_type(e.get('input'))}"
            ) from None


_SCALAR_TYPE_ERRORS = frozenset({"int_type", "float_type", "bool_type", "string_type"})
_WANTED = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean (true or false)",
    "string": "a string",
}


def _toml_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array"}
    return names.get(type(value), "table" if isinstance(value, dict) else type(value).__name__)


def _env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    src = EnvSettingsSource(
        Settings,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        case_sensitive=False,
    )
    # EnvSettingsSource reads os.environ; give it the mapping we were handed instead so
    # tests (and `serve` in a subprocess) are explicit about their environment.
    src.env_vars = {k.lower(): v for k, v in environ.items()}
    _check_env_names(environ)
    return src()


def _check_env_names(environ: Mapping[str, str]) -> None:
    """Every ``COEFFD_<SECTION>__<KEY>`` variable must name a setting: pydantic-settings
    silently ignores a misspelled section (``COEFFD_PIPELNE__QUEUE_CAPACITY``) while the
    TOML file and ``--set`` reject it. Names without ``__`` are not checked: Kubernetes
    puts ``COEFFD_PORT``, ``COEFFD_SERVICE_HOST``... of a Service named coeffd in every pod.
    """
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or "__" not in upper:
            continue
        path = upper[len(ENV_PREFIX) :].lower().split("__")
        model: type[BaseModel] | None = Settings
        for depth, part in enumerate(path):
            if model is None:  # a leaf (or a free-form mapping): the rest is its value
                break
            fields = model.model_fields
            if part not in fields:
                where = ".".join(path[:depth]) or "settings"
                known = ", ".join(sorted(fields)) or "none"
                raise SettingsError(
                    f"invalid setting in environment {name}: {where} has no key {part!r} "
                    f"(keys: {known})"
                )
            model = _section_model(fields[part].annotation)


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The settings model of a field (``Section`` or ``Section | None``), else None."""
    for t in (annotation, *get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def load_settings(
    config: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build :class:`Settings` from defaults ← TOML ← env ← ``overrides`` (CLI flags).

    ``config`` defaults to ``$COEFFD_CONFIG``. Raises :class:`SettingsError` with the
    one-line message on any invalid value or unknown key.
    """
    env = os.environ if environ is None else environ
    path = config or env.get(CONFIG_ENV) or None
    data: dict[str, Any] = {}
    if path:
        data = _toml_layer(path)
        _check_toml_types(data)
    try:
        data = _deep_merge(data, _env_layer(env))
    except (ValueError, ValidationError) as e:  # e.g. malformed JSON in a complex env var
        raise SettingsError(f"invalid setting in environment: {e}") from None
    if overrides:
        data = _deep_merge(data, overrides)
    try:
        return _build(data)
    except ValidationError as e:
        raise SettingsError(format_validation_error(e)) from None


def _build(data: dict[str, Any]) -> Settings:
    return Settings(**data)


def set_override(overrides: dict[str, Any], dotted: str, value: Any) -> None:
    """Put ``value`` at ``a.b.c`` inside the nested ``overrides`` dict (for CLI flags)."""
    parts = dotted.split(".")
    node = overrides
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise SettingsError(f"invalid setting {dotted}: {p} is not a section")
        node = nxt
    node[parts[-1]] = value


def check_startup(settings: Settings) -> None:
    """Start-up checks that need the file system; raise :class:`SettingsError` (one line).

    A sidecar's static model and GPU must resolve now, not when the first data arrives
    (``--hardware H101`` used to start and only warn then); the catalogue directories
    must be directories; the state and snapshot directories must be writable (an
    unwritable state dir used to start silently and lose every checkpoint). Nothing is
    created here: a start that fails later leaves no files behind.
    """
    c = settings.configuration
    if c is not None:
        try:
            spec = c.load_model()
        except (ValueError, OSError) as e:
            raise SettingsError(
                f"invalid setting configuration.model={_shown(c.model)}: {e}"
            ) from None
        try:
            hw = load_hardware(c.hardware, c.gpu)
        except (ValueError, OSError) as e:
            raise SettingsError(
                f"invalid setting configuration.hardware={_shown(c.hardware)}: {e}"
            ) from None
        try:
            BlisBasis(spec, hw, c.tp, c.dp, c.moe_comm_backend)
        except ValueError as e:
            # name the key the basis refused (dp > 1 on a dense model was shown as tp=1)
            key, value = _basis_key(str(e), c)
            raise SettingsError(f"invalid setting configuration.{key}={value}: {e}") from None
    for key, value in (
        ("catalog.models_dir", settings.catalog.models_dir),
        ("catalog.hardware_dir", settings.catalog.hardware_dir),
    ):
        if value and not Path(value).is_dir():
            raise SettingsError(f"invalid setting {key}={_shown(value)}: not a directory")
    for key, value, off in (
        ("state.state_dir", settings.state.state_dir, ' (or "" to disable checkpoints)'),
        ("publish.snapshot_dir", settings.publish.snapshot_dir, ""),
    ):
        if value:
            problem = unwritable(value)
            if problem is not None:
                raise SettingsError(
                    f"invalid setting {key}={_shown(value)}: {problem}; "
                    f"choose a directory this user can write{off}"
                )


def _basis_key(message: str, c: ConfigurationSettings) -> tuple[str, str]:
    """The ``configuration`` key (and its shown value) a :class:`BlisBasis` error is about."""
    if "MoE comm backend" in message:
        return "moe_comm_backend", _shown(c.moe_comm_backend)
    if re.search(r"\bdp\b", message):
        return "dp", str(c.dp)
    return "tp", str(c.tp)


def unwritable(directory: str | os.PathLike[str]) -> str | None:
    """Why files cannot be created in ``directory`` (None when they can).

    The directory, or for a missing one its nearest existing parent, is probed with a
    temporary file (permissions, read-only mounts, a full disk's inodes, root included);
    nothing is created.
    """
    p = Path(directory)
    if p.exists() and not p.is_dir():
        return "not a directory"
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.absolute().parent
    if not probe.is_dir():
        return f"cannot be created: {probe} is not a directory"
    try:
        # an unnamed temporary file where the OS supports it: nothing is left behind
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        where = "" if probe == p else f" in {probe}"
        return f"not writable{where} ({e.strerror})"
    return None
