"""Configuration resolution: which serving configuration an observation belongs to.

It is decided per telemetry source: a sidecar has one static configuration (settings), a
fleet reads it from each stream's OTLP resource attributes (``coeffd.*``). A stream that
names no configuration is counted and skipped, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from coeffd.learners.features.config import ENGINE_ATTRIBUTE, ServingConfig, ServingConfigError
from coeffd.records.events import Source

__all__ = ["ConfigResolver"]

log = structlog.get_logger(__name__)


class ConfigResolver:
    """Source → :class:`ServingConfig`: the static one, or from resource attributes.

    A KV-event stream carries no resource: its source only names the engine
    (``coeffd.engine``, from the ZMQ topic). It resolves to the configuration that engine's
    spans announced, once they have been seen.

    ``check`` (the learners' :meth:`~learners.features.config.BasisResolver.problem`)
    vets a configuration the first time it is seen: one whose model or GPU names nothing
    known is unconfigured, its source skipped with that reason (:meth:`reason`), logged
    once. Telemetry only *names* models and GPUs; a name is never opened as a path.
    """

    #: Sources remembered (they come from the network: bounded).
    MAX_SOURCES = 100_000

    def __init__(
        self,
        static: ServingConfig | None = None,
        check: Callable[[ServingConfig], str | None] | None = None,
    ) -> None:
        self.static = static
        self.check = check
        self._cache: dict[str, ServingConfig | None] = {}
        self._reasons: dict[str, str] = {}  # source id → why it names no configuration
        self._engines: dict[str, ServingConfig] = {}
        self._warned: set[str] = set()

    def reason(self, source: Source) -> str:
        """Why ``source`` resolved to no configuration (a bounded metric label)."""
        return self._reasons.get(source.id, "no_configuration")

    def resolve(self, source: Source) -> ServingConfig | None:
        """The configuration of ``source`` (None if it names none, or not yet)."""
        if self.static is not None:
            return self.static
        sid = source.id
        if sid in self._cache:
            return self._cache[sid]
        engine = source.get(ENGINE_ATTRIBUTE)
        if engine is not None and source.get("coeffd.model") is None:
            linked = self._engines.get(str(engine))
            if linked is not None:  # not cached before: the engine may show up later
                self._cache[sid] = linked
            return linked
        try:
            cfg = ServingConfig.from_resource(source)
        except (ServingConfigError, ValueError, KeyError) as e:
            self._warn_once(sid, source, str(e))
            return None
        problem = self.check(cfg) if self.check is not None else None
        if problem is not None:
            # The learners logged the details once per configuration; say which source.
            self._warn_once(sid, source, f"{problem}: model {cfg.model!r}, gpu {cfg.gpu!r}")
            if len(self._cache) < self.MAX_SOURCES:
                self._cache[sid] = None
                self._reasons[sid] = problem
            return None
        if len(self._cache) < self.MAX_SOURCES:
            self._cache[sid] = cfg
            if engine is not None:
                self._engines[str(engine)] = cfg
        return cfg

    def _warn_once(self, sid: str, source: Source, error: str) -> None:
        if sid in self._warned or len(self._warned) >= 10_000:
            return
        self._warned.add(sid)
        log.warning(
            "telemetry source names no usable configuration; its observations are skipped",
            source=sid,
            error=error,
            attributes={k: _short(v) for k, v in source.attributes},
        )


def _short(value: object) -> object:
    # Attributes come from the network: a log line quotes at most 200 characters of one.
    return value if not isinstance(value, str) or len(value) <= 200 else value[:200] + "..."
