"""File output off the pipeline worker: snapshots and checkpoints on their own thread.

Every snapshot and checkpoint is fsynced (so a crash never leaves a torn file), and an
fsync on a busy or virtualised disk can take seconds; done on the pipeline worker, that
would stall learning and every receiver behind it. The worker hands finished objects to
this writer instead: the latest snapshot per configuration (a newer one replaces a pending
older one — a reader only ever wants the newest) and the latest checkpoint state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from coeffd.daemon.publish.snapshot import InvalidCoefficientsError, Snapshot
from coeffd.daemon.publish.store import SnapshotStore

if TYPE_CHECKING:  # the checkpoint module imports the writer
    from coeffd.daemon.learning.checkpoints import CheckpointStore

__all__ = ["Failed", "Writer", "Written"]

_CHECKPOINT = "\0checkpoint"  # never a configuration id

log = structlog.get_logger(__name__)

#: Called after a snapshot reached the disk: (snapshot, wall seconds when written).
Written = Callable[[Snapshot, float], None]
#: Called when the store refused a snapshot: (snapshot, reason).
Refused = Callable[[Snapshot, str], None]
#: Called when a write failed (disk full, read-only, permissions): (snapshot or None for
#: a checkpoint, the OS error). Not a refusal: the vector was fine, the disk was not.
Failed = Callable[[Snapshot | None, str], None]


class Writer:
    """One background thread writing the newest snapshot per configuration and the newest
    checkpoint; :meth:`close` writes what is pending and stops.

    >>> import tempfile
    >>> w = Writer(SnapshotStore(tempfile.mkdtemp()), None)
    >>> w.flush(1.0), w.close()
    (True, None)
    """

    def __init__(
        self,
        store: SnapshotStore | None,
        checkpoints: CheckpointStore | None,
        *,
        on_written: Written | None = None,
        on_refused: Refused | None = None,
        on_checkpoint: Callable[[], None] | None = None,
        on_failed: Failed | None = None,
        retry_s: float = 5.0,
    ) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self._on_written = on_written
        self._on_refused = on_refused
        self._on_checkpoint = on_checkpoint
        self._on_failed = on_failed
        self._failed_keys: set[str] = set()  # checkpoint / configurations failing to write
        self._retry: dict[str, Snapshot] = {}  # snapshots whose write failed, by config
        #: Seconds before a failed snapshot write is tried again.
        self.retry_s = retry_s
        self._snapshots: dict[str, Snapshot] = {}
        self._checkpoint: Any = None
        self._busy = False
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="coeffd-writer", daemon=True)
        self._thread.start()

    def submit_snapshot(self, snapshot: Snapshot) -> None:
        """Queue ``snapshot`` (replacing a pending one of the same configuration)."""
        with self._cond:
            self._snapshots[snapshot.config_id] = snapshot
            self._cond.notify()

    def submit_checkpoint(self, state: Any) -> None:
        """Queue a checkpoint of ``state`` (replacing a pending one)."""
        with self._cond:
            self._checkpoint = state
            self._cond.notify()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything queued so far is on disk; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._snapshots or self._checkpoint is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = 60.0) -> None:
        """Write what is pending, then stop the thread."""
        self.flush(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._snapshots or self._checkpoint is not None or self._closing):
                    if not self._retry:
                        self._cond.wait()
                    elif not self._cond.wait(self.retry_s):
                        # Snapshots whose write failed (a full or read-only disk) are tried
                        # again, unless a newer one of the configuration is pending.
                        for cid, snap in self._retry.items():
                            self._snapshots.setdefault(cid, snap)
                        self._retry.clear()
                if self._closing and not self._snapshots and self._checkpoint is None:
                    return
                snapshots = list(self._snapshots.values())
                self._snapshots.clear()
                state, self._checkpoint = self._checkpoint, None
                self._busy = True
            try:
                for snap in snapshots:
                    self._write_snapshot(snap)
                if state is not None and self.checkpoints is not None:
                    self._write_checkpoint(state)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write_snapshot(self, snap: Snapshot) -> None:
        if self.store is None:
            return
        try:
            self.store.publish(snap)
        except OSError as e:
            self._failing(snap.config_id, "snapshot write failed", e, config=snap.config_id)
            with self._cond:
                self._retry[snap.config_id] = snap
            if self._on_failed is not None:
                self._on_failed(snap, str(e))
            return
        except (InvalidCoefficientsError, ValueError) as e:
            log.error("snapshot refused", config=snap.config_id, error=str(e))
            if self._on_refused is not None:
                self._on_refused(snap, str(e))
            return
        with self._cond:
            self._retry.pop(snap.config_id, None)
        self._recovered(snap.config_id, "snapshot writes work again", config=snap.config_id)
        if self._on_written is not None:
            self._on_written(snap, time.time())

    def _write_checkpoint(self, state: Any) -> None:
        assert self.checkpoints is not None
        try:
            self.checkpoints.save(state)
        except (OSError, TypeError) as e:
            self._failing(_CHECKPOINT, "checkpoint not written", e)
            if self._on_failed is not None:
                self._on_failed(None, str(e))
            return
        self._recovered(_CHECKPOINT, "checkpoint writes work again")
        if self._on_checkpoint is not None:
            self._on_checkpoint()

    def _failing(self, key: str, event: str, error: Exception, **context: str) -> None:
        # once when a write starts failing, not every cadence: the metric counts them all
        if key not in self._failed_keys:
            self._failed_keys.add(key)
            log.error(event, error=str(error), **context)

    def _recovered(self, key: str, event: str, **context: str) -> None:
        if key in self._failed_keys:
            self._failed_keys.discard(key)
            log.info(event, **context)
