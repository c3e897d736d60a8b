"""`make run` on a fresh clone installs only the runtime dependencies before the demo starts;
the targets that lint, type-check, test or benchmark add the dev extras (issue 33, item 11:
`make run` installed 823 MB, Helm SDK and Kubernetes schemas included)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(target: str, venv: Path) -> list[str]:
    """The commands `make TARGET` would run with no virtualenv yet at ``venv``."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(ROOT), target, f"VENV={venv}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.splitlines()


def installs(lines: list[str]) -> list[str]:
    return [line.split("pip install", 1)[1].strip() for line in lines if "pip install" in line]


def test_run_installs_only_the_runtime_dependencies(tmp_path: Path) -> None:
    lines = dry_run("run", tmp_path / "venv")
    assert installs(lines) == ["--quiet --upgrade pip", "--quiet -e ."]
    assert lines[-1].strip().endswith("bin/coeffd demo")


@pytest.mark.parametrize("target", ["test", "pytest", "lint", "typecheck", "setup"])
def test_the_development_targets_add_the_dev_extras(tmp_path: Path, target: str) -> None:
    assert installs(dry_run(target, tmp_path / "venv"))[-1] == "--quiet -e '.[dev]'"


def test_ci_runs_make_test() -> None:
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    assert script[-1] == "make test"
