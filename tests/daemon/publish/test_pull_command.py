"""``coeffd pull`` as a real subprocess against a real HTTP server over a real store."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from publish_support import BLIS_DEFAULTS, make_snapshot, serve
from publish_support import run_pull as _pull

from coeffd.daemon.publish.defaults_rewrite import own_comment
from coeffd.daemon.publish.defaults_schema import validate_defaults_yaml
from coeffd.daemon.publish.store import SnapshotStore

ROOT = Path(__file__).resolve().parents[3]


def _outside_block(text: str) -> list[str]:
    return [ln for ln in text.splitlines(keepends=True) if "_coeffs:" not in ln]


def test_pull_defaults_rewrites_only_block(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    snap = make_snapshot("only-config", 7)
    store.publish(snap)
    server, url = serve(store)
    try:
        target = tmp_path / "defaults.yaml"
        shutil.copyfile(BLIS_DEFAULTS, target)
        before = target.read_text()
        proc = _pull("--server", url, "--defaults", str(target))
        assert proc.returncode == 0, proc.stderr
        assert "version 7" in proc.stdout
        after = target.read_text()
        # one line more: whose vector it is (issue 33), right above the block
        comment = own_comment(after)
        assert comment is not None and "configuration only-config" in comment
        assert _outside_block(after.replace(comment + "\n", "")) == _outside_block(before)
        assert validate_defaults_yaml(target) == (list(snap.alpha), list(snap.beta))

        proc = _pull("--server", url, "--format", "flags")
        assert proc.returncode == 0, proc.stderr
        args = proc.stdout.split()
        assert tuple(float(x) for x in args[3].split(",")) == snap.beta
    finally:
        server.stop()


def test_pull_refuses_invalid_snapshot_file_untouched(tmp_path: Path) -> None:
    snapdir = tmp_path / "snaps"
    store = SnapshotStore(snapdir)
    store.publish(make_snapshot("cfg", 1))
    # A server-side file edited by hand to a negative β: the client must still refuse.
    latest = snapdir / "cfg" / "latest.json"
    latest.write_bytes(latest.read_bytes().replace(b'"beta":[0.15', b'"beta":[-0.15'))
    server, url = serve(store)
    try:
        target = tmp_path / "defaults.yaml"
        shutil.copyfile(BLIS_DEFAULTS, target)
        before = target.read_bytes()
        proc = _pull("--server", url, "--config", "cfg", "--defaults", str(target))
        assert proc.returncode == 1
        assert "refusing" in proc.stderr and "non-negative" in proc.stderr
        assert target.read_bytes() == before
    finally:
        server.stop()


def test_pull_several_configs_lists_and_fails(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    store.publish(make_snapshot("cfg-a", 1))
    store.publish(make_snapshot("cfg-b", 2))
    server, url = serve(store)
    try:
        proc = _pull("--server", url, "--format", "json")
        assert proc.returncode == 1
        assert "cfg-a" in proc.stderr and "cfg-b" in proc.stderr and "--config" in proc.stderr
        proc = _pull("--server", url, "--config", "cfg-b", "--format", "yaml")
        assert proc.returncode == 0 and "trained_physics_coefficients:" in proc.stdout
        proc = _pull("--server", url, "--config", "missing", "--format", "yaml")
        assert proc.returncode == 1 and "unknown configuration 'missing'" in proc.stderr
        assert "coeffd configurations" in proc.stderr  # where the ids are
    finally:
        server.stop()


def test_pull_network_error(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _pull("--server", f"http://127.0.0.1:{port}", "--format", "flags")
    assert proc.returncode == 1
    assert "cannot reach coeffd" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("server", ["ftp://x", "not a url"])
def test_pull_bad_server_url(server: str) -> None:
    from coeffd.daemon.commands import pull

    assert pull.main(["--server", server]) == 2  # a usage error
