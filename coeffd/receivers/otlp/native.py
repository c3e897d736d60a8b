"""The compiled decoder (``_wire.c``), when it is built and not switched off.

``_wire`` walks the wire bytes of an ``ExportTraceServiceRequest`` in C and builds the
records the pure-Python decoder (:mod:`.decode`) builds, from the same kind tables
(:func:`.kinds.wire_plan`); ``python -m bench ingest`` measures both. The pure-Python
path stays: it is used when the extension did not build or import, when
``COEFFD_PURE_DECODE=1`` is set, for ``Decoder(native=False)``, and by the compiled
decoder itself for the rare requests it hands back (see ``_wire.c``).

>>> isinstance(AVAILABLE, bool) and (AVAILABLE or bool(UNAVAILABLE))
True
"""

from __future__ import annotations

import os
from typing import Any

from coeffd.receivers.otlp.kinds import wire_plan

__all__ = ["AVAILABLE", "PLAN", "UNAVAILABLE", "wire"]

#: The extension module, or None.
wire: Any = None
#: Its compiled plan of the kinds (a capsule), or None.
PLAN: Any = None
#: Why the extension is not used ("" when it is).
UNAVAILABLE = ""

if os.environ.get("COEFFD_PURE_DECODE", "") not in ("", "0"):
    UNAVAILABLE = "COEFFD_PURE_DECODE is set"
else:
    try:
        from coeffd.receivers.otlp import _wire  # type: ignore[attr-defined]

        PLAN = _wire.compile_plan(wire_plan())
        wire = _wire
    except ImportError as e:  # not built (no compiler at install time) or another ABI
        UNAVAILABLE = f"compiled decoder not importable: {e}"

AVAILABLE = wire is not None
