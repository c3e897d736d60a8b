"""Serving-configuration identity: what makes two engines' step times comparable.

A :class:`ServingConfig` names everything that changes the latency physics — model (name
and hash of its ``config.json``), GPU, TP/DP/EP, MoE comm backend, vLLM version, scheduler
limits, chunked prefill, prefix caching, CPU offloading, block size, async scheduling — and
nothing that does not (which replica it is). Its :attr:`~ServingConfig.id` is the first
12 hex digits of blake2b over canonical JSON (sorted keys, fixed separators), so the same
configuration gets the same id on every machine and after every restart, whatever the key
order it was described in. Learners, metrics (label ``config``) and published snapshots
are keyed by it.

Resource-attribute vocabulary (set on each vLLM pod through ``OTEL_RESOURCE_ATTRIBUTES``,
e.g. ``OTEL_RESOURCE_ATTRIBUTES=coeffd.model=llama-3.1-8b-instruct,coeffd.gpu=H100,coeffd.tp=1``):

==============================  ======  =====================================================
attribute                       type    meaning (default when absent)
==============================  ======  =====================================================
``coeffd.model``                str     bundled model name or HF repo id (**required**)
``coeffd.model_config_hash``    str     :func:`~learners.features.model.config_hash` of the
                                        model's ``config.json`` (bundled file's hash)
``coeffd.gpu``                  str     GPU sheet name, e.g. ``H100`` (**required**)
``coeffd.tp``                   int     tensor parallel degree (1)
``coeffd.dp``                   int     data parallel degree (1)
``coeffd.ep``                   bool    expert parallelism enabled (false)
``coeffd.moe_comm_backend``     str     vLLM all2all backend ("" = allgather_reducescatter)
``coeffd.vllm_version``         str     vLLM version ("")
``coeffd.max_num_batched_tokens`` int   scheduler token budget (unset)
``coeffd.max_num_seqs``         int     scheduler request budget (unset)
``coeffd.max_model_len``        int     context limit (unset)
``coeffd.chunked_prefill``      bool    chunked prefill enabled (unset)
``coeffd.prefix_caching``       bool    prefix caching enabled (unset)
``coeffd.cpu_offload_gib``      float   CPU KV offload size in GiB (0 = off)
``coeffd.block_size``           int     KV block size in tokens (16)
``coeffd.async_scheduling``     bool    async scheduling (unset)
``coeffd.kv_cache_dtype``       str     vLLM ``--kv-cache-dtype`` ("auto")
``coeffd.engine``               str     engine identity (replica); **not** part of the id
==============================  ======  =====================================================

Booleans accept ``true/false/1/0/yes/no/on/off`` (any case); numbers may arrive as
strings, because ``OTEL_RESOURCE_ATTRIBUTES`` values always do.

>>> a = ServingConfig(model="llama-3.1-8b-instruct", gpu="H100", tp=1)
>>> b = ServingConfig.from_dict({"tp": 1, "gpu": "H100", "model": "llama-3.1-8b-instruct"})
>>> a.id == b.id, len(a.id)
(True, 12)
>>> a.labels["gpu"], a.labels["tp"]
('H100', '1')
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field

from coeffd.learners.features.basis import BlisBasis
from coeffd.learners.features.catalog import (
    MODELS,
    UnknownModelError,
    canonical_model_name,
    find_model,
    load_model,
)
from coeffd.learners.features.files import NotANameError
from coeffd.learners.features.hardware import (
    HardwareError,
    HardwareSpec,
    UnknownGpuError,
    find_hardware,
    load_hardware,
)
from coeffd.learners.features.model import ModelConfigError, ModelSpec
from coeffd.records.events import Source

__all__ = [
    "ATTRIBUTE_PREFIX",
    "BasisResolver",
    "CatalogSettings",
    "ConfigurationSettings",
    "ServingConfig",
    "ServingConfigError",
    "engine_identity",
    "parse_bool",
    "problem_reason",
]

log = structlog.get_logger(__name__)

ATTRIBUTE_PREFIX = "coeffd."
ENGINE_ATTRIBUTE = "coeffd.engine"


class ServingConfigError(ValueError):
    """A configuration that is incomplete or malformed; the message names the attribute."""


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def parse_bool(value: object, key: str = "value") -> bool:
    """Lenient boolean (resource attributes arrive as strings).

    >>> parse_bool("True"), parse_bool(0), parse_bool("off")
    (True, False, False)
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str):
        low = value.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
    raise ServingConfigError(f"{key}: expected a boolean, got {value!r}")


def _parse_int(value: object, key: str) -> int:
    if isinstance(value, bool):
        raise ServingConfigError(f"{key}: expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ServingConfigError(f"{key}: expected an integer, got {value!r}")


def _parse_float(value: object, key: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ServingConfigError(f"{key}: expected a number, got {value!r}")


@dataclass(frozen=True)
class ServingConfig:
    """One serving configuration. ``None`` means "not reported" (distinct from a value).

    ``model`` is kept as reported (e.g. an HF repo id) for labels; the identity uses the
    bundled catalogue's canonical name when the model is bundled, and that file's hash when
    no ``model_config_hash`` was reported, so ``meta-llama/Llama-3.1-8B-Instruct`` on the
    wire and ``llama-3.1-8b-instruct`` in static settings are the same configuration.
    """

    model: str
    gpu: str
    tp: int = 1
    dp: int = 1
    ep: bool = False
    moe_comm_backend: str = ""
    model_config_hash: str = ""
    vllm_version: str = ""
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    chunked_prefill: bool | None = None
    prefix_caching: bool | None = None
    cpu_offload_gib: float = 0.0
    block_size: int = 16
    async_scheduling: bool | None = None
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if not self.model:
            raise ServingConfigError("model: required")
        if not self.gpu:
            raise ServingConfigError("gpu: required")
        for key in ("tp", "dp", "block_size"):
            if getattr(self, key) < 1:
                raise ServingConfigError(f"{key}: must be >= 1, got {getattr(self, key)}")
        if self.cpu_offload_gib < 0:
            raise ServingConfigError(f"cpu_offload_gib: must be >= 0, got {self.cpu_offload_gib}")

    # ------------------------------------------------------------------ identity

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all fields (the canonical form hashed by :attr:`id`)."""
        return dataclasses.asdict(self)

    def identity(self) -> dict[str, Any]:
        """The canonical form hashed by :attr:`id` (bundled model names canonicalised).

        >>> ServingConfig(model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100").id == \\
        ...     ServingConfig(model="llama-3.1-8b-instruct", gpu="H100").id
        True
        """
        d = self.to_dict()
        canon = canonical_model_name(self.model)
        if canon is not None:
            d["model"] = canon
            if not self.model_config_hash:
                d["model_config_hash"] = MODELS[canon].config_hash
        return d

    @functools.cached_property
    def id(self) -> str:
        """12 hex digits, stable across processes, machines and key order."""
        canon = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(canon.encode(), digest_size=6).hexdigest()

    @property
    def labels(self) -> dict[str, str]:
        """Human-readable labels (strings) for logs, snapshots and dashboards."""
        out = {"config": self.id}
        for k, v in self.to_dict().items():
            if v is None or v == "":
                continue
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        return out

    @property
    def short_label(self) -> str:
        """``model/GPU/tpN[/dpN]`` for log lines.

        >>> ServingConfig(model="m", gpu="H100", tp=2).short_label
        'm/H100/tp2'
        """
        s = f"{self.model}/{self.gpu}/tp{self.tp}"
        return s + (f"/dp{self.dp}" if self.dp > 1 else "")

    # ------------------------------------------------------------------ builders

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServingConfig:
        """From a mapping of field names (values may be strings); unknown keys are an error."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ServingConfigError(f"unknown configuration keys: {', '.join(unknown)}")
        kwargs: dict[str, Any] = {}
        for key, raw in data.items():
            if raw is None:
                continue
            kwargs[key] = _coerce(key, raw)
        if "model" not in kwargs:
            raise ServingConfigError("model: required")
        if "gpu" not in kwargs:
            raise ServingConfigError("gpu: required")
        return cls(**kwargs)

    @classmethod
    def from_resource(cls, source: Source) -> ServingConfig:
        """From the ``coeffd.*`` resource attributes of a telemetry source (module docs).

        Raises :class:`ServingConfigError` naming the attribute when ``coeffd.model`` or
        ``coeffd.gpu`` is missing or a value does not parse.
        """
        data: dict[str, Any] = {}
        names = {f.name for f in dataclasses.fields(cls)}
        for key, value in source.attributes:
            if not key.startswith(ATTRIBUTE_PREFIX) or key == ENGINE_ATTRIBUTE:
                continue
            name = key[len(ATTRIBUTE_PREFIX) :]
            if name in names:
                data[name] = value
        for req in ("model", "gpu"):
            if req not in data:
                raise ServingConfigError(
                    f"resource attribute {ATTRIBUTE_PREFIX}{req} is missing (source {source.id})"
                )
        try:
            return cls.from_dict(data)
        except ServingConfigError as exc:
            raise ServingConfigError(f"resource attribute {ATTRIBUTE_PREFIX}{exc}") from None

    def with_changes(self, **changes: Any) -> ServingConfig:
        """A copy with some fields replaced."""
        return dataclasses.replace(self, **changes)


_INT_FIELDS = frozenset(
    {"tp", "dp", "max_num_batched_tokens", "max_num_seqs", "max_model_len", "block_size"}
)
_BOOL_FIELDS = frozenset({"ep", "chunked_prefill", "prefix_caching", "async_scheduling"})


def _coerce(key: str, raw: object) -> Any:
    if key in _INT_FIELDS:
        return _parse_int(raw, key)
    if key in _BOOL_FIELDS:
        return parse_bool(raw, key)
    if key == "cpu_offload_gib":
        return _parse_float(raw, key)
    return str(raw).strip()


def engine_identity(source: Source) -> str:
    """The engine (replica) identity: ``coeffd.engine`` if set, else the source id."""
    v = source.get(ENGINE_ATTRIBUTE)
    return str(v) if v not in (None, "") else source.id


# --------------------------------------------------------------------------- settings


class ConfigurationSettings(BaseModel):
    """Static configuration of a sidecar deployment (mounted as the ``configuration`` section).

    ``model`` is a bundled model name or a path to a ``config.json`` (or its folder);
    ``hardware`` a bundled GPU name or a path to a BLIS-format sheet (``gpu`` picks the entry
    of a multi-GPU file).
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, protected_namespaces=(), allow_inf_nan=False
    )

    model: str = Field(description="bundled model name or path to config.json")
    model_name: str | None = Field(default=None, description="name used in the id and labels")
    hardware: str = Field(default="H100", description="bundled GPU name or hardware JSON path")
    gpu: str | None = Field(default=None, description="entry of a multi-GPU hardware file")
    tp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    ep: bool = False
    moe_comm_backend: str = ""
    vllm_version: str = ""
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    chunked_prefill: bool | None = None
    prefix_caching: bool | None = None
    cpu_offload_gib: float = Field(default=0.0, ge=0)
    block_size: int = Field(default=16, ge=1)
    async_scheduling: bool | None = None
    kv_cache_dtype: str = "auto"

    def load_model(self) -> ModelSpec:
        """The model description (bundled or from the path)."""
        return _resolve_model(self.model, name=self.model_name)

    def gpu_name(self) -> str:
        """The GPU name used in the configuration identity."""
        if self.gpu:
            return self.gpu
        p = Path(self.hardware)
        return p.stem if (self.hardware.endswith(".json") or p.exists()) else self.hardware

    def serving_config(self) -> ServingConfig:
        """The :class:`ServingConfig` this deployment serves (model hash from the file)."""
        spec = self.load_model()
        return ServingConfig(
            model=spec.name,
            gpu=self.gpu_name(),
            tp=self.tp,
            dp=self.dp,
            ep=self.ep,
            moe_comm_backend=self.moe_comm_backend,
            model_config_hash=spec.config_hash,
            vllm_version=self.vllm_version,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            chunked_prefill=self.chunked_prefill,
            prefix_caching=self.prefix_caching,
            cpu_offload_gib=self.cpu_offload_gib,
            block_size=self.block_size,
            async_scheduling=self.async_scheduling,
            kv_cache_dtype=self.kv_cache_dtype,
        )

    def basis(self) -> BlisBasis:
        """A ready :class:`BlisBasis` for this deployment."""
        hw = load_hardware(self.hardware, self.gpu)
        return BlisBasis(self.load_model(), hw, self.tp, self.dp, self.moe_comm_backend)


class CatalogSettings(BaseModel):
    """Where models and GPUs named by telemetry are found besides the bundled ones.

    Telemetry only ever *names* a model or GPU; these operator-owned directories extend
    the names it may use (entries resolved safely: plain names, regular files, bounded).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    #: ``<models_dir>/<name>/config.json`` or ``<models_dir>/<name>.json``; "" = bundled only.
    models_dir: str = ""
    #: ``<hardware_dir>/<GPU>.json`` (a BLIS-format sheet or one entry); "" = bundled only.
    hardware_dir: str = ""


def _resolve_model(ref: str, *, name: str | None = None) -> ModelSpec:
    p = Path(ref)
    if p.exists():
        return ModelSpec.from_config(p, name=name)
    if ref in MODELS:
        spec = load_model(ref)
        return dataclasses.replace(spec, name=name) if name else spec
    raise ModelConfigError(
        f"model {ref!r} is neither a config.json path nor a bundled model; "
        f"bundled: {', '.join(MODELS)}"
    )


class BasisResolver:
    """Turns :class:`ServingConfig` into ready :class:`BlisBasis` objects, cached by id.

    A configuration's ``model`` and ``gpu`` come from telemetry, so they are *names*,
    never paths (:mod:`learners.features.files`). Models come from ``model_paths``
    (operator settings: name → ``config.json`` path or folder) first, then the bundled
    catalogue, then ``models_dir`` (``<dir>/<name>/config.json`` or ``<dir>/<name>.json``);
    GPUs from ``hardware`` (an operator's sheet path) first, then the bundled sheet, then
    ``hardware_dir/<name>.json``. A configuration that cannot be resolved raises the same
    error each time but is logged only once; :meth:`problem` says why, as a metric label.

    >>> r = BasisResolver()
    >>> r.basis(ServingConfig(model="llama-3.1-8b-instruct", gpu="H100", tp=2)).tp
    2
    """

    #: Cached outcomes kept (configurations come from the network: bound them).
    MAX_CACHED = 10_000

    def __init__(
        self,
        model_paths: Mapping[str, str | os.PathLike[str]] | None = None,
        hardware: str | os.PathLike[str] | None = None,
        *,
        models_dir: str | os.PathLike[str] | None = None,
        hardware_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._model_paths = {k.lower(): v for k, v in (model_paths or {}).items()}
        self._hardware = None if hardware is None else os.fspath(hardware)
        self._models_dir = models_dir or None
        self._hardware_dir = hardware_dir or None
        self._cache: dict[str, BlisBasis | Exception] = {}
        self._lock = threading.Lock()

    def model(self, config: ServingConfig) -> ModelSpec:
        """The model description a configuration names."""
        path = self._model_paths.get(config.model.lower())
        if path is not None:
            spec = ModelSpec.from_config(path, name=config.model)
        else:
            spec = find_model(config.model, self._models_dir)
        if config.model_config_hash and config.model_config_hash != spec.config_hash:
            log.warning(
                "model_config_hash_mismatch",
                config=config.id,
                model=config.model,
                reported=config.model_config_hash,
                local=spec.config_hash,
            )
        return spec

    def hardware(self, config: ServingConfig) -> HardwareSpec:
        """The GPU sheet entry a configuration names."""
        return find_hardware(config.gpu, self._hardware_dir, self._hardware)

    def basis(self, config: ServingConfig) -> BlisBasis:
        """The basis for a configuration (cached; errors re-raised, logged once)."""
        key = config.id
        with self._lock:
            hit = self._cache.get(key)
        if isinstance(hit, BlisBasis):
            return hit
        if isinstance(hit, Exception):
            raise hit
        try:
            built: BlisBasis | Exception = BlisBasis(
                self.model(config),
                self.hardware(config),
                config.tp,
                config.dp,
                config.moe_comm_backend,
            )
        except ValueError as exc:
            log.warning(
                "basis_unresolved", config=config.id, label=config.short_label, error=str(exc)
            )
            built = exc
        with self._lock:
            while len(self._cache) >= self.MAX_CACHED:
                del self._cache[next(iter(self._cache))]  # oldest first (insertion order)
            self._cache[key] = built
        if isinstance(built, Exception):
            raise built
        return built

    def problem(self, config: ServingConfig) -> str | None:
        """None when ``config`` resolves, else why not (a bounded metric label):
        ``invalid_name`` (a path or unprintable), ``unknown_model``, ``unknown_gpu``,
        ``invalid_model`` / ``invalid_hardware`` (a file that does not parse),
        ``invalid_configuration`` (e.g. TP the model cannot be split by)."""
        try:
            self.basis(config)
        except ValueError as exc:
            return problem_reason(exc)
        return None


def problem_reason(exc: BaseException) -> str:
    """The metric label for a model/GPU resolution error (see :meth:`BasisResolver.problem`)."""
    for kind, reason in (
        (NotANameError, "invalid_name"),
        (UnknownModelError, "unknown_model"),
        (UnknownGpuError, "unknown_gpu"),
        (ModelConfigError, "invalid_model"),
        (HardwareError, "invalid_hardware"),
    ):
        if isinstance(exc, kind):
            return reason
    return "invalid_configuration"
