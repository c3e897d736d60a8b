"""``coeffd pull`` the way a BLIS user runs it (issue 19), against a real HTTP server
over a real store, on real files: symlinked ``defaults.yaml``, block-style lists,
``--dry-run``/``--backup``, ``--format`` with ``--defaults``, ``--format blis-args`` and
names beside ids."""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from publish_support import BETA, BLIS_DEFAULTS, make_snapshot, serve

from coeffd.daemon.commands import pull
from coeffd.daemon.publish.defaults_schema import validate_defaults_yaml
from coeffd.daemon.publish.snapshot import ConfigurationRef
from coeffd.daemon.publish.store import SnapshotStore

NEW_ALPHA = (111.5, 22.25, 3.0)
NEW_BETA = tuple(b + 1.0 for b in BETA)

#: The flags BLIS's CLI parses (spec blis-trained-physics.md §8.2, plus --model).
BLIS_FLAGS = {
    "--alpha-coeffs",
    "--beta-coeffs",
    "--defaults-filepath",
    "--hardware-config",
    "--hardware",
    "--tp",
    "--dp",
    "--enable-expert-parallel",
    "--moe-comm-backend",
    "--latency-model",
    "--model-config-folder",
    "--model",
}


def _snap(cid: str = "cfg", version: int = 3, **desc: object):  # type: ignore[no-untyped-def]
    snap = make_snapshot(cid, version, alpha=NEW_ALPHA, beta=NEW_BETA)
    labels = {"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": "2", **desc}
    ref = ConfigurationRef(
        id=cid,
        labels={k: str(v) for k, v in labels.items()},
        description={"model": labels["model"], "gpu": labels["gpu"], "tp": int(labels["tp"])},
    )
    import msgspec

    return msgspec.structs.replace(snap, configuration=ref)


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    store = SnapshotStore(tmp_path / "snaps")
    store.publish(_snap())
    server, base = serve(store)
    try:
        yield base
    finally:
        server.stop()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = pull.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_defaults_through_a_symlink_rewrites_the_linked_file(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    blis = tmp_path / "blis"
    blis.mkdir()
    real = blis / "defaults.yaml"
    shutil.copyfile(BLIS_DEFAULTS, real)
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    code, out, err = _run(capsys, "--server", url, "--defaults", str(link))
    assert code == 0, err
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert validate_defaults_yaml(real) == (list(NEW_ALPHA), list(NEW_BETA))
    assert str(real.resolve()) in out and "llama-3.1-8b-instruct/H100/tp2" in out


def test_block_style_lists_stay_block_style_with_their_comments(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = BLIS_DEFAULTS.read_text()
    flow_alpha = "  alpha_coeffs: [12000.5, 650.25, 40.125]\n"
    assert flow_alpha in text
    block = "  alpha_coeffs:\n    - 12000.5   # queueing\n    - 650.25\n    - 40.125  # per token\n"
    target = tmp_path / "defaults.yaml"
    target.write_text(text.replace(flow_alpha, block))
    code, _, err = _run(capsys, "--server", url, "--defaults", str(target))
    assert code == 0, err
    after = target.read_text()
    want = "  alpha_coeffs:\n    - 111.5   # queueing\n    - 22.25\n    - 3.0  # per token\n"
    assert want in after
    assert validate_defaults_yaml(target) == (list(NEW_ALPHA), list(NEW_BETA))


def test_dry_run_prints_the_diff_and_writes_nothing_backup_keeps_the_old_file(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "defaults.yaml"
    shutil.copyfile(BLIS_DEFAULTS, target)
    before = target.read_bytes()
    code, out, err = _run(capsys, "--server", url, "--defaults", str(target), "--dry-run")
    assert code == 0, err
    assert target.read_bytes() == before
    minus = [ln for ln in out.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln for ln in out.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert minus == ["-  alpha_coeffs: [12000.5, 650.25, 40.125]", *minus[1:]]
    # plus whose vector it is, above the block (issue 33)
    assert plus[0].startswith("+# coeffd ") and "configuration cfg" in plus[0]
    assert len(minus) == len(plus) - 1 == 2 and "111.5" in plus[1]
    assert not (tmp_path / "defaults.yaml.bak").exists()

    code, out, err = _run(capsys, "--server", url, "--defaults", str(target), "--backup")
    assert code == 0, err
    assert (tmp_path / "defaults.yaml.bak").read_bytes() == before
    assert "defaults.yaml.bak" in out
    assert validate_defaults_yaml(target) == (list(NEW_ALPHA), list(NEW_BETA))


@pytest.mark.parametrize("fmt", ["json", "flags", "yaml"])
def test_format_with_defaults_is_refused_not_ignored(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    target = tmp_path / "defaults.yaml"
    shutil.copyfile(BLIS_DEFAULTS, target)
    before = target.read_bytes()
    code, out, err = _run(capsys, "--server", url, "--defaults", str(target), "--format", fmt)
    assert code == 2 and out == ""
    assert f"--format {fmt}" in err and "--defaults" in err
    assert target.read_bytes() == before


def test_dry_run_without_defaults_is_a_usage_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, "--server", url, "--dry-run")
    assert code == 2 and "--defaults" in err


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_blis_args_carry_the_whole_blis_run(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--server", url, "--format", "blis-args")
    assert code == 0, err
    args = shlex.split(out)
    assert {a for a in args if a.startswith("--")} <= BLIS_FLAGS
    assert _flag(args, "--latency-model") == "trained-physics"
    assert _flag(args, "--model") == "llama-3.1-8b-instruct"
    assert _flag(args, "--hardware") == "H100" and _flag(args, "--tp") == "2"
    # BLIS reads <folder>/config.json and the GPU's entry of the hardware sheet
    folder = Path(_flag(args, "--model-config-folder"))
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 32
    sheet = json.loads(Path(_flag(args, "--hardware-config")).read_text())
    assert sheet["H100"]["TFlopsPeak"] > 0
    alpha = tuple(float(v) for v in _flag(args, "--alpha-coeffs").split(","))
    beta = tuple(float(v) for v in _flag(args, "--beta-coeffs").split(","))
    assert (alpha, beta) == (NEW_ALPHA, NEW_BETA)


def test_blis_args_with_defaults_point_blis_at_the_rewritten_file(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "elsewhere" / "defaults.yaml"
    target.parent.mkdir()
    shutil.copyfile(BLIS_DEFAULTS, target)
    code, out, err = _run(
        capsys, "--server", url, "--defaults", str(target), "--format", "blis-args"
    )
    assert code == 0, err
    args = shlex.split(out)
    assert Path(_flag(args, "--defaults-filepath")) == target.absolute()
    assert "--alpha-coeffs" not in args and "--hardware-config" in args
    assert "updated" in err
    assert validate_defaults_yaml(target) == (list(NEW_ALPHA), list(NEW_BETA))


def test_several_configurations_are_listed_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    store.publish(_snap("aaa111", 1))
    store.publish(_snap("bbb222", 4, model="qwen2.5-7b-instruct", gpu="A100-80", tp="1"))
    server, url = serve(store)
    try:
        code, _, err = _run(capsys, "--server", url, "--format", "blis-args")
    finally:
        server.stop()
    assert code == 1 and "--config" in err
    lines = [ln.split() for ln in err.splitlines() if ln.startswith("  ")]
    assert [ln[:2] for ln in lines] == [
        ["aaa111", "llama-3.1-8b-instruct/H100/tp2"],
        ["bbb222", "qwen2.5-7b-instruct/A100-80/tp1"],
    ]


def test_pull_function_takes_a_namespace_without_the_newer_flags(url: str) -> None:
    """bench closedloop calls ``pull()`` with its own Namespace (server, config, version,
    format, defaults, timeout)."""
    import argparse

    args = argparse.Namespace(
        server=url, config=None, version=None, format="json", defaults=None, timeout=10.0
    )
    assert json.loads(pull.pull(args))["version"] == 3
