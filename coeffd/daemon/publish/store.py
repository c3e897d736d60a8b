"""Snapshots on disk: one directory per configuration, versions written atomically.

Layout::

    <dir>/<config_id>/v<version>.json   immutable, one per published version
    <dir>/<config_id>/latest.json       a copy of the newest version, atomically replaced

``latest.json`` is a regular file rather than a symlink: replacing a symlink and then
reading through it are two steps a reader can interleave with a prune.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import msgspec
import structlog
from prometheus_client import CollectorRegistry, Gauge

from coeffd.daemon.publish.atomic import atomic_write_bytes, is_temp_file
from coeffd.daemon.publish.snapshot import (
    CONFIG_ID_RE,
    Snapshot,
    decode_snapshot,
    encode_snapshot,
    validate_config_id,
    validate_for_blis,
)

__all__ = ["LATEST_NAME", "SnapshotStore", "StaleVersionError"]

log = structlog.get_logger(__name__)

_VERSION_FILE_RE = re.compile(r"^v(\d+)\.json$")
LATEST_NAME = "latest.json"


class StaleVersionError(ValueError):
    """A snapshot whose version does not exceed the latest published one."""


class SnapshotStore:
    """Versioned snapshot files per configuration, written atomically.

    One writer per directory (the daemon); any number of readers, in- or out-of-process.
    ``retention`` versions are kept per configuration (the newest; at least 1).
    Pass a ``registry`` to export ``coeffd_snapshot_version`` and
    ``coeffd_snapshot_timestamp_seconds`` per configuration.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        retention: int = 20,
        *,
        registry: CollectorRegistry | None = None,
        stale_temp_age_s: float = 3600.0,
    ) -> None:
        if retention < 1:
            raise ValueError("retention must be >= 1")
        self.directory = Path(directory)
        self.retention = retention
        self._lock = threading.Lock()
        self._version_gauge: Gauge | None = None
        self._time_gauge: Gauge | None = None
        if registry is not None:
            self._version_gauge = Gauge(
                "coeffd_snapshot_version",
                "Version of the latest published snapshot",
                ["config"],
                registry=registry,
            )
            self._time_gauge = Gauge(
                "coeffd_snapshot_timestamp_seconds",
                "Wall time of the latest published snapshot",
                ["config"],
                registry=registry,
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temp(stale_temp_age_s)

    # -- paths

    def _config_dir(self, config_id: str) -> Path:
        return self.directory / validate_config_id(config_id)

    def _remove_stale_temp(self, max_age_s: float) -> None:
        """Delete temp files of crashed writers; young ones may belong to a live writer."""
        cutoff = time.time() - max_age_s
        for path in self.directory.glob("*/.*.tmp"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
            except OSError:
                continue

    # -- writing

    def next_version(self, config_id: str) -> int:
        """The version number the next snapshot of ``config_id`` should carry."""
        versions = self.versions(config_id)
        return (versions[-1] + 1) if versions else 1

    def publish(self, snapshot: Snapshot) -> Path:
        """Validate and write ``snapshot``; return the path of its version file.

        Raises ``InvalidCoefficientsError`` (nothing written) for a vector BLIS would
        reject and ``StaleVersionError`` unless the version is above the latest.
        """
        validate_for_blis(snapshot.alpha, snapshot.beta)
        if snapshot.version < 1:
            raise StaleVersionError(f"version must be >= 1, got {snapshot.version}")
        cdir = self._config_dir(snapshot.config_id)
        data = encode_snapshot(snapshot)
        with self._lock:
            existing = self.versions(snapshot.config_id)
            if existing and snapshot.version <= existing[-1]:
                raise StaleVersionError(
                    f"{snapshot.config_id}: version {snapshot.version} <= latest {existing[-1]}"
                )
            cdir.mkdir(parents=True, exist_ok=True)
            path = atomic_write_bytes(cdir / f"v{snapshot.version}.json", data)
            # latest.json last: a reader that sees version N there can always open vN.json.
            atomic_write_bytes(cdir / LATEST_NAME, data)
            self._prune(cdir, [*existing, snapshot.version])
        if self._version_gauge is not None and self._time_gauge is not None:
            self._version_gauge.labels(snapshot.config_id).set(snapshot.version)
            self._time_gauge.labels(snapshot.config_id).set(snapshot.wall_ns / 1e9)
        # Debug: a busy daemon publishes every configuration about once a second.
        log.debug(
            "snapshot published",
            config=snapshot.config_id,
            version=snapshot.version,
            observations=sum(snapshot.observations.values()),
        )
        return path

    def _prune(self, cdir: Path, versions: list[int]) -> None:
        for v in sorted(versions)[: -self.retention]:
            try:
                (cdir / f"v{v}.json").unlink()
            except FileNotFoundError:
                continue

    # -- reading

    def configurations(self) -> list[str]:
        """Ids of configurations with a published snapshot, sorted."""
        out = []
        try:
            entries = list(self.directory.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []
        for entry in entries:
            if CONFIG_ID_RE.match(entry.name) and (entry / LATEST_NAME).is_file():
                out.append(entry.name)
        return sorted(out)

    def versions(self, config_id: str) -> list[int]:
        """Retained versions of ``config_id``, ascending (temp files ignored)."""
        cdir = self._config_dir(config_id)
        try:
            names = os.listdir(cdir)
        except (FileNotFoundError, NotADirectoryError):
            # nothing retained (a file in the way fails the next write: counted there)
            return []
        found = []
        for name in names:
            m = _VERSION_FILE_RE.match(name)
            if m and not is_temp_file(cdir / name):
                found.append(int(m.group(1)))
        return sorted(found)

    def _read(self, path: Path) -> Snapshot | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:  # a name too long, a directory in the way: not a snapshot
            log.warning("unreadable snapshot skipped", path=str(path)[:200], error=exc.strerror)
            return None
        try:
            return decode_snapshot(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Only a foreign edit can get here (writes are atomic); skip, don't crash the API.
            log.warning("unreadable snapshot skipped", path=str(path), error=str(exc))
            return None

    def latest(self, config_id: str) -> Snapshot | None:
        """The newest snapshot of ``config_id``, or None."""
        return self._read(self._config_dir(config_id) / LATEST_NAME)

    def get(self, config_id: str, version: int) -> Snapshot | None:
        """Snapshot ``version`` of ``config_id`` if it is retained, else None."""
        return self._read(self._config_dir(config_id) / f"v{int(version)}.json")

    def history(self, config_id: str) -> list[Snapshot]:
        """All retained snapshots of ``config_id``, oldest first."""
        out = []
        for v in self.versions(config_id):
            snap = self.get(config_id, v)  # may vanish between listdir and open (prune)
            if snap is not None:
                out.append(snap)
        return out
