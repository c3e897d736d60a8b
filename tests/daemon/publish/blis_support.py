"""The real BLIS binary for tests that run it (issue 31): built once per test process from
the offline source bundle by its ``build`` script, or a skip reason saying why not."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

#: The build script beside the BLIS source bundle: ``$COEFFD_BLIS_BUILD``, else the shared
#: tools beside this checkout.
BUILD = Path(
    os.environ.get("COEFFD_BLIS_BUILD")
    or Path(__file__).resolve().parents[4] / "shared" / "tools" / "blis" / "build"
)


@functools.cache
def blis_binary() -> tuple[Path | None, str]:
    """(path of the built ``blis``, "") or (None, why it is not there)."""
    if not BUILD.is_file():
        return None, f"no BLIS build script at {BUILD} (set COEFFD_BLIS_BUILD)"
    try:
        proc = subprocess.run(
            [str(BUILD)], capture_output=True, text=True, timeout=900, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"building BLIS failed: {exc}"
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        return None, f"building BLIS failed (exit {proc.returncode}): {proc.stderr[-300:]}"
    return Path(lines[-1]), ""
