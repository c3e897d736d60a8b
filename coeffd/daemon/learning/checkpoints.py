"""Checkpoints of the learners' state, and the health of every write to disk.

A checkpoint is the learner registry's state plus what each configuration id stands for;
it is written by the writer thread on its own cadence (atomically, the previous good
copy kept) and restored at start-up, after a content check: a checkpoint whose checksum
holds but whose content is unexpected is skipped (counted), never a crash.

Writes that fail (disk full, read-only, permissions) make ``/readyz`` fail — checks
``checkpoints`` and ``snapshots`` — until a write works again.

The file is atomic, checksummed, with a previous good copy. A restart must not throw away hours of learning, and a crash mid-write must not leave a
checkpoint that restores garbage. So:

* the state (any msgpack-able structure: dicts, lists, str, int, float, bool, None,
  bytes, **numpy arrays and scalars**, stored losslessly with dtype and shape) is encoded
  with msgspec msgpack and framed as ``MAGIC | u64 length | sha256 | payload``;
* the file is written with ``atomic_write_bytes`` (temp + fsync + rename + dir fsync);
* before a new checkpoint replaces ``checkpoint.bin``, the current one is verified and
  copied (atomically too) to ``checkpoint.prev.bin``, so there is always one good older
  copy — and ``checkpoint.bin`` itself never goes missing, whenever a crash comes;
* ``restore`` verifies length and checksum and falls back to the previous copy when the
  latest is truncated or corrupt (disk error, foreign edit).

Tuples come back as lists (msgpack has one array type); learners should not rely on
tuple identity in their state.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import structlog

from coeffd.daemon.learning.metrics import ServeMetrics, describe_configuration
from coeffd.daemon.publish.atomic import atomic_write_bytes
from coeffd.daemon.publish.snapshot import Snapshot
from coeffd.daemon.writer import Writer
from coeffd.learners.features.config import ServingConfig, ServingConfigError
from coeffd.learners.registry import LearnerRegistry

__all__ = [
    "CheckpointContentError",
    "CheckpointError",
    "CheckpointStore",
    "Checkpointer",
    "WriteHealth",
    "decode_state",
    "encode_state",
]

log = structlog.get_logger(__name__)

_CHECKPOINT = "\0checkpoint"  # key of the checkpoint's write error (never a config id)


# ------------------------------------------------------------ the file format

MAGIC = b"COEFFDCK1\n"
_HEADER = struct.Struct(">Q32s")  # payload length, sha256(payload)
_EXT_NDARRAY = 1
_EXT_NPSCALAR = 2

LATEST = "checkpoint.bin"
PREVIOUS = "checkpoint.prev.bin"


class CheckpointError(ValueError):
    """A checkpoint file that is truncated, corrupt or not a checkpoint."""


class CheckpointContentError(CheckpointError):
    """A checkpoint whose checksum holds but whose content is not what coeffd writes
    (another version's layout, a foreign tool's file): restoring it would crash."""


#: What :meth:`CheckpointStore.restore` found wrong with one file: (``latest`` or
#: ``previous``, ``unreadable`` / ``corrupt`` / ``invalid_content``, the detail).
Problem = tuple[str, str, str]


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        if arr.dtype.hasobject:
            raise TypeError("numpy object arrays cannot be checkpointed")
        body = msgspec.msgpack.encode([arr.dtype.str, list(arr.shape), arr.tobytes()])
        return msgspec.msgpack.Ext(_EXT_NDARRAY, body)
    if isinstance(obj, np.generic):
        body = msgspec.msgpack.encode([obj.dtype.str, obj.tobytes()])
        return msgspec.msgpack.Ext(_EXT_NPSCALAR, body)
    raise TypeError(f"cannot checkpoint object of type {type(obj).__name__}")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == _EXT_NDARRAY:
        dtype, shape, raw = msgspec.msgpack.decode(data)
        # copy(): frombuffer views are read-only and would pin the decode buffer.
        return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape).copy()
    if code == _EXT_NPSCALAR:
        dtype, raw = msgspec.msgpack.decode(data)
        return np.frombuffer(raw, dtype=np.dtype(dtype))[0]
    raise CheckpointContentError(f"unknown msgpack extension type {code}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.msgpack.Decoder(ext_hook=_ext_hook)


def encode_state(state: Any) -> bytes:
    """Frame ``state`` as checkpoint bytes (header + checksum + msgpack)."""
    payload = _encoder.encode(state)
    return MAGIC + _HEADER.pack(len(payload), hashlib.sha256(payload).digest()) + payload


def decode_state(data: bytes) -> Any:
    """Verify and decode checkpoint bytes; raises ``CheckpointError``."""
    head = len(MAGIC) + _HEADER.size
    if len(data) < head or not data.startswith(MAGIC):
        raise CheckpointError("not a coeffd checkpoint (bad magic or truncated header)")
    length, digest = _HEADER.unpack_from(data, len(MAGIC))
    payload = data[head:]
    if len(payload) != length:
        raise CheckpointError(f"truncated: payload has {len(payload)} of {length} bytes")
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError("checksum mismatch")
    try:
        return _decoder.decode(payload)
    except CheckpointError:
        raise
    except (msgspec.DecodeError, ValueError, TypeError, IndexError, RecursionError) as exc:
        # The checksum held, so the bytes are what some writer meant: not ours (a bad
        # numpy dtype or shape, another format), not a torn write.
        raise CheckpointContentError(f"undecodable payload: {exc}") from exc


class Restored(msgspec.Struct, frozen=True):
    """A restored checkpoint: the state, the file it came from, whether we fell back."""

    state: Any
    path: str
    fell_back: bool
    mtime_wall_ns: int


class CheckpointStore:
    """``<dir>/checkpoint.bin`` (latest) and ``<dir>/checkpoint.prev.bin`` (previous good)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)  # created by the first save, not before
        self.latest_path = self.directory / LATEST
        self.previous_path = self.directory / PREVIOUS
        #: What the last :meth:`restore` found wrong (empty when both files were fine).
        self.problems: list[Problem] = []

    def _valid_bytes(self, path: Path) -> bytes | None:
        """The file's bytes if it holds a good checkpoint, else None."""
        try:
            data = path.read_bytes()
            decode_state(data)
        except (OSError, CheckpointError):
            return None
        return data

    def save(self, state: Any) -> Path:
        """Write a checkpoint of ``state`` atomically; the current good one becomes previous.

        Encoding errors (an unsupported type in ``state``) raise ``TypeError`` before any
        file is touched.
        """
        data = encode_state(state)
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.latest_path.exists():
            old = self._valid_bytes(self.latest_path)
            if old is not None:
                # Copied, not renamed: a rename left no latest until the new one was
                # written, and a kill -9 in that gap made the next start fall back to
                # the previous copy. One more small write per cadence buys a latest
                # that is there at every instant.
                atomic_write_bytes(self.previous_path, old, mode=0o600)
            else:
                log.warning("corrupt checkpoint not kept as previous", path=str(self.latest_path))
        path = atomic_write_bytes(self.latest_path, data, mode=0o600)
        log.info("checkpoint saved", path=str(path), bytes=len(data))
        return path

    def restore(self, validate: Callable[[Any], None] | None = None) -> Restored | None:
        """Load the newest usable checkpoint, or None when there is none.

        A file is usable when it reads, its checksum holds and ``validate(state)`` (the
        caller's schema check) does not raise; otherwise the previous copy is tried, then
        nothing (a fresh start). What was wrong is kept in :attr:`problems` and logged as
        one error line, so a bad file never turns into a restart loop.
        """
        self.problems = []
        fell_back = False
        found: Restored | None = None
        for label, path in (("latest", self.latest_path), ("previous", self.previous_path)):
            try:
                data = path.read_bytes()
                mtime = path.stat().st_mtime_ns
            except FileNotFoundError:
                fell_back = fell_back or path == self.latest_path
                continue
            except OSError as exc:
                self.problems.append((label, "unreadable", exc.strerror or str(exc)))
                fell_back = True
                continue
            try:
                state = decode_state(data)
                if validate is not None:
                    validate(state)
            except CheckpointContentError as exc:
                self.problems.append((label, "invalid_content", str(exc)))
                fell_back = True
                continue
            except CheckpointError as exc:
                self.problems.append((label, "corrupt", str(exc)))
                fell_back = True
                continue
            found = Restored(state, str(path), fell_back and path == self.previous_path, mtime)
            break
        if self.problems:
            detail = "; ".join(
                f"{label}: {why}: {text[:300]}" for label, why, text in self.problems
            )
            log.error(
                "checkpoint unusable; restored the previous one"
                if found is not None
                else "no usable checkpoint; starting fresh",
                directory=str(self.directory),
                problems=detail,
            )
        return found

    def load(self) -> Any | None:
        """Just the state of ``restore()`` (None when nothing restorable)."""
        restored = self.restore()
        return None if restored is None else restored.state

    def age_seconds(self) -> float | None:
        """Seconds since the latest checkpoint was written (None if none)."""
        try:
            return time.time() - self.latest_path.stat().st_mtime
        except FileNotFoundError:
            return None


# ----------------------------------------------------- the cadence and health


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


_STATE_KEYS = frozenset({"version", "registry", "configs"})


def _unrecognised(state: dict[str, Any]) -> list[str]:
    """How a checked state differs from what :meth:`Checkpointer.checkpoint` writes."""
    out = []
    if state.get("version") != 1:
        out.append(f"version {state.get('version')!r} (this build writes 1)")
    extra = sorted(str(k) for k in state if k not in _STATE_KEYS)
    if extra:
        out.append(f"unknown keys {extra[:5]}")
    registry = state.get("registry")
    if not isinstance(registry, dict) or "sets" not in registry:
        out.append("no learner sets")
    return out


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
        unknown = _unrecognised(state)
        skipped = 0
        for cid, cfg in state.get("configs", {}).items():
            try:
                self.configs[cid] = ServingConfig.from_dict(cfg)
            except (ServingConfigError, ValueError, KeyError, TypeError):
                skipped += 1
                continue
            describe_configuration(self.metrics, self.configs[cid])
        if skipped:
            unknown.append(f"{skipped} configuration description(s) not understood")
        n_sets = len(state.get("registry", {}).get("sets", {}))
        if unknown:
            # The checksum holds and nothing in it broke the check, but this is not what
            # checkpoint() writes (another version or tool): say so, not "restored".
            log.warning(
                "checkpoint content not recognised; restored only what it could",
                path=restored.path,
                fell_back=restored.fell_back,
                configurations=n_sets,
                problems="; ".join(unknown),
            )
        else:
            log.info(
                "learner state restored",
                path=restored.path,
                fell_back=restored.fell_back,
                configurations=n_sets,
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
