"""Every settings error is one plain line on stderr and exit 2, whichever layer it comes
from (TOML, environment, --set, flags) and whatever is wrong (issues 17.11, 19.5).

Each case is an input that used to start, traceback or exit 1 with a JSON log line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coeffd.daemon.cli import main
from coeffd.daemon.settings import SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]


def _serve(
    tmp: Path,
    *args: str,
    env: dict[str, str] | None = None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, str, str]:
    for k in [k for k in os.environ if k.upper().startswith("COEFFD_")]:
        monkeypatch.delenv(k)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    code = main(
        [
            "serve",
            "--snapshot-dir", str(tmp / "snap"),
            "--state-dir", str(tmp / "state"),
            "--http-endpoint", "127.0.0.1:0",
            "--otlp-grpc-endpoint", "127.0.0.1:0",
            "--otlp-http-endpoint", "127.0.0.1:0",
            *args,
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code: int, out: str, err: str, *expected: str) -> None:
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("coeffd: invalid setting "), err
    for text in expected:
        assert text in err, err


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (b'[log]\nlevel = "\xff"\n', ("not UTF-8",)),
        (b"[pipeline]\nqueue_capacity = true\n", ("pipeline.queue_capacity=True", "integer")),
        (b"[pipeline]\nshed_start = false\n", ("pipeline.shed_start=False", "a number")),
        (b"[receivers.otlp_grpc]\nenabled = 1\n", ("receivers.otlp_grpc.enabled=1", "a boolean")),
        (b"[state]\nstate_dir = 5\n", ("state.state_dir=5", "string")),
        (b"[learners]\nfleet_quirk = -0.01\n", ("learners.fleet_quirk=-0.01", "greater than")),
        (b"[pipelne]\nqueue_capacity = 5\n", ("pipelne: unknown key",)),
        (b"x = [1,\n", ("config=",)),
    ],
)
def test_bad_toml(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    toml: bytes,
    expected: tuple[str, ...],
) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(toml)
    _one_line(*_serve(tmp_path, "--config", str(cfg), capsys=capsys, monkeypatch=monkeypatch),
              *expected)  # fmt: skip
    assert not (tmp_path / "state").exists() and not (tmp_path / "snap").exists()


def test_a_fifo_as_config_file_does_not_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    _one_line(*_serve(tmp_path, "--config", str(fifo), capsys=capsys, monkeypatch=monkeypatch),
              "not a regular file")  # fmt: skip


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"COEFFD_PIPELNE__QUEUE_CAPACITY": "5"}, ("COEFFD_PIPELNE__QUEUE_CAPACITY", "'pipelne'")),
        ({"COEFFD_PIPELINE__QUEUE_CAPACTY": "5"}, ("pipeline has no key 'queue_capacty'",)),
        ({"coeffd_receivers__otlp_grcp__endpoint": "x"}, ("receivers has no key 'otlp_grcp'",)),
        ({"COEFFD_PIPELINE__QUEUE_CAPACITY": "true"}, ("pipeline.queue_capacity='true'",)),
    ],
)
def test_bad_environment(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    expected: tuple[str, ...],
) -> None:
    _one_line(*_serve(tmp_path, env=env, capsys=capsys, monkeypatch=monkeypatch), *expected)


def test_kubernetes_service_links_are_not_settings() -> None:
    # A Service named coeffd puts these in every pod of the namespace.
    env = {
        "COEFFD_PORT": "tcp://10.0.0.1:4317",
        "COEFFD_SERVICE_HOST": "10.0.0.1",
        "COEFFD_PORT_4317_TCP_PROTO": "tcp",
    }
    assert load_settings(environ=env).pipeline.queue_capacity == 200_000
    s = load_settings(environ={"COEFFD_LEARNERS__DRIFT__ENABLED": "false"})
    assert s.learners.drift.enabled is False


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--mode", "sidecar"), ("configuration.model: required with mode = sidecar",)),
        (("--model-config", "no-such-model"), ("configuration.model='no-such-model'", "bundled:")),
        (("--model-config", "llama-3.1-8b-instruct", "--hardware", "H101"),
         ("configuration.hardware='H101'", "H100")),
        (("--model-config", "llama-3.1-8b-instruct", "--hardware", "H999"),
         ("configuration.hardware='H999'",)),
        (("--model-config", "llama-3.1-8b-instruct", "--tp", "3"), ("configuration.tp=3",)),
        (("--set", "catalog.models_dir=/nonexistent-dir"), ("catalog.models_dir=",)),
        (("--set", "pipelne.queue_capacity=5"), ("pipelne: unknown key",)),
        (("--set", "pipeline.blas_threads=-1"),
         ("pipeline.blas_threads='-1'", "1 (the default) on a machine shared with vLLM")),
    ],
)  # fmt: skip
def test_bad_flags(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    expected: tuple[str, ...],
) -> None:
    _one_line(*_serve(tmp_path, *args, capsys=capsys, monkeypatch=monkeypatch), *expected)


def test_unwritable_state_dir_fails_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out, err = _serve(
        tmp_path, "--state-dir", str(blocker / "state"), capsys=capsys, monkeypatch=monkeypatch
    )
    _one_line(code, out, err, "state.state_dir=", "choose a directory")
    code, out, err = _serve(
        tmp_path, "--snapshot-dir", str(blocker), capsys=capsys, monkeypatch=monkeypatch
    )
    _one_line(code, out, err, "publish.snapshot_dir=", "not a directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")
def test_read_only_state_dir_fails_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    _one_line(*_serve(tmp_path, "--state-dir", str(ro), capsys=capsys, monkeypatch=monkeypatch),
              "not writable")  # fmt: skip


def test_a_real_process_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "coeffd", "serve", "--log-format", "json",
         "--model-config", "no-such-model", "--state-dir", str(tmp_path / "t"),
         "--snapshot-dir", str(tmp_path / "s")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    _one_line(proc.returncode, proc.stdout, proc.stderr, "configuration.model='no-such-model'")


def test_load_settings_raises_settings_error_for_every_layer(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(b'[http]\nenabled = "yes"\n')
    with pytest.raises(SettingsError, match=r"http\.enabled='yes'"):
        load_settings(cfg, environ={})
    # the same value through the environment is a string by nature: parsed
    assert load_settings(environ={"COEFFD_HTTP__ENABLED": "yes"}).http.enabled is True


def test_operator_paths_are_read_safely_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a FIFO or a device as the sidecar's model or hardware file: refused, never read
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    code, out, err = _serve(tmp_path, "--model-config", str(fifo),
                            capsys=capsys, monkeypatch=monkeypatch)  # fmt: skip
    _one_line(code, out, err, "configuration.model=", "not a regular file")
    code, out, err = _serve(
        tmp_path, "--model-config", "llama-3.1-8b-instruct", "--hardware", "/dev/zero.json",
        capsys=capsys, monkeypatch=monkeypatch,
    )  # fmt: skip
    _one_line(code, out, err, "configuration.hardware=")
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    code, out, err = _serve(
        tmp_path, "--model-config", "llama-3.1-8b-instruct", "--hardware", str(zero),
        capsys=capsys, monkeypatch=monkeypatch,
    )  # fmt: skip
    _one_line(code, out, err, "configuration.hardware=", "not a regular file")
