"""Command-line entry point (placeholder until the foundation lands)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the coeffd command line."""
    return 0
