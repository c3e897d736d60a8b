"""``python -m bench [NAME [ARGS]]``: run ``bench/<NAME>.py``'s ``main(argv)`` (all without NAME)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def _names() -> list[str]:
    here = str(Path(__file__).parent)
    return sorted(m.name for m in pkgutil.iter_modules([here]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    """Dispatch to one benchmark; without a name, list them."""
    names = _names()
    if argv and argv[0] in ("-h", "--help"):
        print("usage: python -m bench [NAME [ARGS]]\nbenchmarks: " + ", ".join(names))
        return 0
    if not argv:  # `make bench`: every benchmark in turn, each with its defaults
        missed = []
        for name in names:
            print(f"\n=== bench {name} ===", flush=True)
            # A benchmark returns non-zero when it measured a figure below its target;
            # that is a result to read, not a failure of the run.
            if int(importlib.import_module(f"bench.{name}").main([])) != 0:
                missed.append(name)
        print(f"\nbenchmarks reporting a missed target: {', '.join(missed) or 'none'}")
        return 0
    name = argv[0]
    if name not in names:
        print(f"unknown benchmark {name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{name}")
    code: int = module.main(argv[1:])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
