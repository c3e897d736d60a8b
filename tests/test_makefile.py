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


def installs(lines: list[str]) -> list[tuple[str, str]]:
    """(installer, what it installs) of each install command: the project (``-e ...``)
    with uv, else with pip (the fallback), in that order."""
    out = []
    for line in lines:
        for part in line.replace(";", "&&").split("&&"):
            words = part.split()
            if "install" not in words:
                continue
            tool = "uv" if words[0].endswith("/uv") else "pip"
            out.append((tool, " ".join(words[words.index("install") + 1 :])))
    return [(tool, what.split("-e ", 1)[1]) for tool, what in out if "-e " in what]


def test_run_installs_only_the_runtime_dependencies(tmp_path: Path) -> None:
    lines = dry_run("run", tmp_path / "venv")
    assert installs(lines) == [("uv", "."), ("pip", ".")]
    assert lines[-1].strip().endswith("bin/coeffd demo")


@pytest.mark.parametrize("target", ["test", "pytest", "lint", "typecheck", "setup"])
def test_the_development_targets_add_the_dev_extras(tmp_path: Path, target: str) -> None:
    """One install of the dev extras with the runtime (issue 32: two runs cost a second
    resolution), by uv, else by pip."""
    assert installs(dry_run(target, tmp_path / "venv")) == [("uv", "'.[dev]'"), ("pip", "'.[dev]'")]


def test_uv_is_installed_from_the_venv_itself(tmp_path: Path) -> None:
    """Nothing installed by hand: uv comes from PyPI into the new venv, by its own pip."""
    text = "\n".join(dry_run("setup", tmp_path / "venv"))
    venv = str(tmp_path / "venv")
    assert f"{venv}/bin/python -m pip install --quiet uv && {venv}/bin/uv pip install" in text
    assert f"--python {venv}/bin/python" in text


def test_ci_runs_make_test() -> None:
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    assert script[-1] == "make test"
