"""BLIS formats: flags, YAML block, strict defaults.yaml validation and in-place rewrite."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import yaml as pyyaml
from publish_support import BLIS_DEFAULTS, make_snapshot

from coeffd.daemon.publish.blis import to_flag_args, to_flags, to_json, to_yaml_block
from coeffd.daemon.publish.defaults_rewrite import rewrite_defaults
from coeffd.daemon.publish.defaults_schema import (
    DefaultsYamlError,
    check_defaults_text,
    validate_defaults_yaml,
)
from coeffd.daemon.publish.snapshot import InvalidCoefficientsError, decode_snapshot

REAL_BLIS_DEFAULTS = Path("/work/shared/data/blis/defaults.yaml")  # read-only reference

ODD_ALPHA = (15563.199579123456, 1e-05, 0.1 + 0.2)
ODD_BETA = (0.152128, 0.0, 1.36252915, 1e16, 32.09546717, 4.4, 126.0, 481.86, 0.0, 1.947, 5e-324)


def test_flags_are_blis_parsable_and_exact() -> None:
    snap = make_snapshot(alpha=ODD_ALPHA, beta=ODD_BETA)
    flags = to_flags(snap)
    args = flags.split(" ")
    assert args == to_flag_args(snap)
    assert args[0] == "--alpha-coeffs" and args[2] == "--beta-coeffs"
    assert " " not in args[1] and " " not in args[3]
    assert tuple(float(x) for x in args[1].split(",")) == ODD_ALPHA
    assert tuple(float(x) for x in args[3].split(",")) == ODD_BETA


def test_yaml_block_parses_back_exactly() -> None:
    snap = make_snapshot(alpha=ODD_ALPHA, beta=ODD_BETA)
    block = to_yaml_block(snap)
    assert block.startswith("# coeffd ")
    # PyYAML is a YAML 1.1 parser: it reads 1e-05 as a string unless it has a dot.
    parsed = pyyaml.safe_load(block)["trained_physics_coefficients"]
    assert tuple(parsed["alpha_coeffs"]) == ODD_ALPHA
    assert tuple(parsed["beta_coeffs"]) == ODD_BETA
    # The block alone is a valid BLIS defaults.yaml.
    alpha, beta = check_defaults_text(block, require_coefficients=True)
    assert tuple(alpha or ()) == ODD_ALPHA and tuple(beta or ()) == ODD_BETA
    assert decode_snapshot(to_json(snap)) == snap


def test_fixture_and_real_blis_file_pass_strict_validator() -> None:
    assert validate_defaults_yaml(BLIS_DEFAULTS) is not None
    if REAL_BLIS_DEFAULTS.exists():
        got = validate_defaults_yaml(REAL_BLIS_DEFAULTS)
        assert got is not None and len(got[1]) == 11


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda t: t + "models: {}\n", "field models not found"),
        (lambda t: t.replace("    GPU: A100-80\n", "    GPU: A100-80\n    gpu: x\n"), "field gpu"),
        (lambda t: t.replace("  alpha_coeffs:", "  gamma_coeffs: [1]\n  alpha_coeffs:"), "gamma"),
        (lambda t: t.replace("version: 0.0.1", "version: 0.0.1\nversion: 0.0.2"), "duplicate"),
        (lambda t: t.replace("tensor_parallelism: 2", "tensor_parallelism: two"), "into int"),
        (lambda t: t.replace("base_latency: 90.0", "base_latency: fast"), "into float64"),
        (lambda t: t.replace("prompt_tokens: 300", "prompt_tokens: [300]"), "scalar"),
        (lambda t: t.replace("[12000.5, 650.25, 40.125]", "[12000.5, x, 40.125]"), "number"),
        (lambda t: t.replace("    8: {k6", "    eight: {k6"), "tier key"),
        (lambda t: t.replace("{k6: 0.01, k7: 1.0}", "{k6: 0.01, k8: 1.0}"), "field k8"),
        (lambda t: t.replace("defaults:\n", "defaults: [\n", 1), "parse error"),
    ],
)
def test_strict_validator_rejects(edit, problem: str) -> None:  # type: ignore[no-untyped-def]
    text = edit(BLIS_DEFAULTS.read_text())
    with pytest.raises(DefaultsYamlError, match=problem):
        check_defaults_text(text)


def _outside_block(text: str) -> list[str]:
    return [ln for ln in text.splitlines(keepends=True) if "_coeffs:" not in ln]


def test_rewrite_changes_only_the_block(tmp_path: Path) -> None:
    target = tmp_path / "defaults.yaml"
    shutil.copyfile(BLIS_DEFAULTS, target)
    before = target.read_text()
    rewrite_defaults(target, ODD_ALPHA, ODD_BETA)
    after = target.read_text()
    assert _outside_block(after) == _outside_block(before)  # comments, alignment: byte-for-byte
    assert len(after.splitlines()) == len(before.splitlines())
    alpha, beta = validate_defaults_yaml(target) or ([], [])
    assert tuple(alpha) == ODD_ALPHA and tuple(beta) == ODD_BETA
    line = next(ln for ln in after.splitlines() if "beta_coeffs:" in ln)
    assert line.startswith("  beta_coeffs: [") and line.endswith("]")  # flow style kept
    assert not [p for p in tmp_path.iterdir() if p.name != "defaults.yaml"]  # no temp left


@pytest.mark.parametrize(
    ("alpha", "beta", "exc"),
    [
        ((1.0, 2.0, 3.0), (1.0,) * 5 + (math.nan,) + (1.0,) * 5, InvalidCoefficientsError),
        ((1.0, -2.0, 3.0), (1.0,) * 11, InvalidCoefficientsError),
        ((1.0, 2.0), (1.0,) * 11, InvalidCoefficientsError),
        ((1.0, 2.0, 3.0), (1.0,) * 6, InvalidCoefficientsError),
        ((1.0, 2.0, 3.0), (0.0,) * 11, InvalidCoefficientsError),
    ],
)
def test_rewrite_refuses_invalid_file_untouched(
    tmp_path: Path, alpha: tuple[float, ...], beta: tuple[float, ...], exc: type[Exception]
) -> None:
    target = tmp_path / "defaults.yaml"
    shutil.copyfile(BLIS_DEFAULTS, target)
    before = target.read_bytes()
    with pytest.raises(exc):
        rewrite_defaults(target, alpha, beta)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["defaults.yaml"]


def test_rewrite_refuses_file_blis_would_reject(tmp_path: Path) -> None:
    target = tmp_path / "defaults.yaml"
    target.write_text(BLIS_DEFAULTS.read_text() + "unknown_top_level: 1\n")
    before = target.read_bytes()
    with pytest.raises(DefaultsYamlError, match="unknown_top_level"):
        rewrite_defaults(target, (1.0, 2.0, 3.0), (1.0,) * 11)
    assert target.read_bytes() == before


def test_rewrite_accepts_blis_minimum_lengths(tmp_path: Path) -> None:
    target = tmp_path / "defaults.yaml"
    shutil.copyfile(BLIS_DEFAULTS, target)
    rewrite_defaults(target, (1.0, 2.0, 3.0, 4.0), (1.0,) * 7)
    got = validate_defaults_yaml(target)
    assert got == ([1.0, 2.0, 3.0, 4.0], [1.0] * 7)


def test_rewrite_appends_missing_block(tmp_path: Path) -> None:
    text = BLIS_DEFAULTS.read_text()
    start = text.index("# Fitted offline")
    end = text.index("# LoRA")
    stripped = text[:start] + text[end:]
    target = tmp_path / "defaults.yaml"
    target.write_text(stripped)
    assert validate_defaults_yaml(target, require_coefficients=False) is None
    rewrite_defaults(target, ODD_ALPHA, ODD_BETA)
    after = target.read_text()
    assert after.startswith(stripped)
    alpha, beta = validate_defaults_yaml(target) or ([], [])
    assert tuple(alpha) == ODD_ALPHA and tuple(beta) == ODD_BETA


def test_rewrite_block_style_and_missing_list(tmp_path: Path) -> None:
    target = tmp_path / "defaults.yaml"
    target.write_text(
        "# top comment\nversion: 0.0.1\ntrained_physics_coefficients:\n"
        "  alpha_coeffs:\n  - 1.0\n  - 2.0\n  - 3.0\n  beta_coeffs:\n  - 1.0\n"
        "  - 1.0\n  - 1.0\n  - 1.0\n  - 1.0\n  - 1.0\n  - 1.0\n# tail comment\n"
    )
    rewrite_defaults(target, ODD_ALPHA, ODD_BETA)
    text = target.read_text()
    assert text.startswith("# top comment\n") and text.endswith("# tail comment\n")
    assert validate_defaults_yaml(target) == (list(ODD_ALPHA), list(ODD_BETA))
    # Only one list present: ruamel round-trip fallback, still valid and comment-preserving.
    target.write_text("# keep me\ntrained_physics_coefficients:\n  alpha_coeffs: [1.0, 2.0, 3.0]\n")
    rewrite_defaults(target, ODD_ALPHA, ODD_BETA)
    assert target.read_text().startswith("# keep me\n")
    assert validate_defaults_yaml(target) == (list(ODD_ALPHA), list(ODD_BETA))
