"""Names, never paths, from telemetry; description files read safely.

Telemetry is untrusted input: a ``coeffd.model`` or ``coeffd.gpu`` resource attribute
once reached ``Path.read_text`` as a path, and a FIFO blocked the pipeline thread forever
while ``/dev/zero`` grew memory by gigabytes. So a value from the wire is only ever a
*name* (:func:`plain_name`), looked up in the bundled catalogue or as an entry of a
directory the operator configured; and every description file (an operator's path too)
is read with :func:`read_text_bounded`: regular files only, opened without blocking,
at most :data:`MAX_DESCRIPTION_BYTES`.

>>> plain_name("H100", "gpu")
'H100'
>>> plain_name("../../etc/passwd", "gpu")
Traceback (most recent call last):
...
coeffd.learners.features.files.NotANameError: gpu '../../etc/passwd' is not a plain name (no path separators, '..', control characters; at most 200 characters)
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["MAX_DESCRIPTION_BYTES", "NotANameError", "plain_name", "read_text_bounded"]

#: A HuggingFace ``config.json`` is a few KB; a hardware sheet too. 4 MiB is generous.
MAX_DESCRIPTION_BYTES = 4 * 1024 * 1024
_MAX_NAME = 200


class NotANameError(ValueError):
    """A value that should name a model or GPU looks like a path (or is unprintable)."""


def plain_name(value: str, what: str, *, org: bool = False) -> str:
    """``value`` if it is a plain name usable as one directory entry, else raise.

    No ``/`` or ``\\``, not ``.`` or ``..``, printable, 1 to 200 characters. ``org``
    also allows one ``/`` between two plain names (a HuggingFace repo id ``org/name``).
    """
    parts = value.split("/", 1) if org else [value]
    if len(value) > _MAX_NAME or not all(_plain(p) for p in parts):
        shown = value if len(value) <= 60 else value[:60] + "..."
        raise NotANameError(
            f"{what} {shown!r} is not a plain name (no path separators, '..', control "
            f"characters; at most {_MAX_NAME} characters)"
        )
    return value


def _plain(part: str) -> bool:
    return (
        bool(part)
        and part not in (".", "..")
        and "/" not in part
        and "\\" not in part
        and part.isprintable()
    )


def read_text_bounded(path: str | os.PathLike[str], limit: int = MAX_DESCRIPTION_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes.

    Opened with ``O_NONBLOCK`` so a FIFO cannot block the caller, then refused unless it
    is a regular file (devices, FIFOs, sockets, directories). Raises :class:`OSError`
    (``FileNotFoundError`` included) naming the reason; callers already handle it.
    """
    p = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(p, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(p))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(p))
        with os.fdopen(fd, "rb") as f:
            fd = -1  # the file object owns it now
            data = f.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:  # grew while we read
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(p))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise OSError(errno.EILSEQ, "not UTF-8 text", str(p)) from None
