"""Crash-safe file replacement.

Readers (the HTTP API, ``coeffd pull``, BLIS itself reading ``defaults.yaml``) must only
ever see the old or the new content of a file, never a prefix of it. The recipe: write a
temporary file in the *same directory* (``rename`` is only atomic within one file
system), flush and ``fsync`` it so its data is durable before it becomes visible, rename
it over the target, then ``fsync`` the directory so the rename itself survives a power
loss. A crash leaves at worst a ``*.tmp`` file behind, which readers ignore.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def temp_path_for(path: Path) -> Path:
    """A unique hidden temporary name next to ``path`` (same directory, ``.tmp`` suffix)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}{TEMP_SUFFIX}")


def fsync_dir(directory: Path) -> None:
    """Make a rename/creation in ``directory`` durable (no-op where directories can't be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, mode: int | None = None
) -> Path:
    """Replace ``path`` with ``data`` atomically and durably; returns the final path.

    ``mode`` defaults to the existing file's permission bits (so rewriting a user's
    ``defaults.yaml`` keeps its mode), else 0o644.
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if mode is None:
        try:
            mode = target.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    tmp = temp_path_for(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # O_CREAT's mode is filtered by the umask
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)
    return target


def atomic_write_text(
    path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", mode: int | None = None
) -> Path:
    """``atomic_write_bytes`` for text."""
    return atomic_write_bytes(path, text.encode(encoding), mode=mode)


def is_temp_file(path: Path) -> bool:
    """True for a temporary file left by an interrupted ``atomic_write_*``."""
    return path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX)
