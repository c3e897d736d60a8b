"""Checkpoints of the learners' state, and the health of every write to disk.

A checkpoint is the learner registry's state plus what each configuration id stands for;
it is written by the writer thread on its own cadence (atomically, the previous good
copy kept) and restored at start-up, after a content check: a checkpoint whose checksum
holds but whose content is unexpected is skipped (counted), never a crash.

Writes that fail (disk full, read-only, permissions) make ``/readyz`` fail — checks
``checkpoints`` and ``snapshots`` — until a write works again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from coeffd.daemon.checkpoint import CheckpointContentError, CheckpointStore
from coeffd.daemon.learning.metrics import ServeMetrics, describe_configuration
from coeffd.daemon.publish.snapshot import Snapshot
from coeffd.daemon.writer import Writer
from coeffd.learners.features.config import ServingConfig, ServingConfigError
from coeffd.learners.registry import LearnerRegistry

__all__ = ["Checkpointer", "WriteHealth"]

log = structlog.get_logger(__name__)

_CHECKPOINT = "\0checkpoint"  # key of the checkpoint's write error (never a config id)


class WriteHealth:
    """Writes failing now, by configuration id (or the checkpoint); readiness reads it.

    The writer thread reports, the HTTP thread asks: each report replaces one entry.
    """

    def __init__(self, metrics: ServeMetrics) -> None:
        self.metrics = metrics
        self._errors: dict[str, str] = {}

    def checkpointed(self) -> None:
        """Writer thread: a checkpoint reached the disk."""
        self._errors.pop(_CHECKPOINT, None)
        self.metrics.checkpoints.inc()

    def written(self, snap: Snapshot) -> None:
        """Writer thread: ``snap`` reached the disk."""
        self._errors.pop(snap.config_id, None)

    def failed(self, snap: Snapshot | None, error: str) -> None:
        """Writer thread: a snapshot or checkpoint did not reach the disk."""
        if snap is None:
            self._errors[_CHECKPOINT] = error
            self.metrics.checkpoint_failures.inc()
        else:
            self._errors[snap.config_id] = error
            self.metrics.snapshot_write_failures.labels(snap.config_id).inc()

    def checkpoint_problem(self) -> str | None:
        """Readiness: why the last checkpoint write failed (None when it worked)."""
        error = self._errors.get(_CHECKPOINT)
        return None if error is None else f"last checkpoint write failed: {error}"

    def snapshot_problem(self) -> str | None:
        """Readiness: the configurations whose last snapshot write failed (None if none)."""
        failing = [(k, v) for k, v in list(self._errors.items()) if k != _CHECKPOINT]
        if not failing:
            return None
        return f"snapshot writes failing for {len(failing)} configuration(s): {failing[0][1]}"


@dataclass(eq=False, kw_only=True)
class Checkpointer:
    """Restore at start-up, checkpoint on a cadence (and at close) through the writer.

    ``configs`` is the consumer's map of configuration id → :class:`ServingConfig`:
    checkpointed with the learners and filled again on restore.
    """

    store: CheckpointStore | None
    registry: LearnerRegistry
    metrics: ServeMetrics
    configs: dict[str, ServingConfig]
    writer: Writer
    interval_s: float
    clock: Callable[[], float]
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self._last = self.clock()

    def due(self, now: float) -> bool:
        """Whether the cadence calls for a checkpoint at ``now``."""
        return self.store is not None and now - self._last >= self.interval_s

    def restore(self) -> bool:
        """Load the newest good checkpoint (if any); True when state was restored."""
        if self.store is None:
            return False
        restored = self.store.restore(validate=self.check_state)
        for file, reason, _ in self.store.problems:
            self.metrics.checkpoint_unusable.labels(file, reason).inc()
        if restored is None:
            return False
        state = restored.state
        self.registry.load_state(state.get("registry", {}))
        for cid, cfg in state.get("configs", {}).items():
            try:
                self.configs[cid] = ServingConfig.from_dict(cfg)
            except (ServingConfigError, ValueError, KeyError, TypeError):
                continue
            describe_configuration(self.metrics, self.configs[cid])
        log.info(
            "learner state restored",
            path=restored.path,
            fell_back=restored.fell_back,
            configurations=len(state.get("registry", {}).get("sets", {})),
        )
        return True

    def check_state(self, state: Any) -> None:
        """Raise :class:`CheckpointContentError` unless ``state`` is what
        :meth:`checkpoint` writes and every learner set in it rebuilds."""
        if not isinstance(state, dict):
            raise CheckpointContentError(f"expected a map, got {type(state).__name__}")
        configs = state.get("configs", {})
        if not isinstance(configs, dict) or not all(isinstance(c, dict) for c in configs.values()):
            raise CheckpointContentError("configs: expected a map of configuration maps")
        try:
            self.registry.check_state(state.get("registry", {}))
        except ValueError as e:
            raise CheckpointContentError(f"registry: {e}") from e

    def checkpoint(self) -> None:
        """Checkpoint the learners' state now (written atomically by the writer thread;
        the previous good copy is kept)."""
        if self.store is None:
            return
        state = {
            "version": 1,
            "registry": self.registry.state_dict(),
            "configs": {cid: c.to_dict() for cid, c in self.configs.items()},
        }
        self.writer.submit_checkpoint(state)
        self._last = self.clock()
