"""Settings: defaults < TOML < env < CLI, and one-line errors naming the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coeffd.daemon.cli import build_parser
from coeffd.daemon.commands.common import settings_from_args
from coeffd.daemon.settings import Settings, SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]


def _toml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "coeffd.toml"
    p.write_text(text)
    return p


def test_precedence_defaults_toml_env_cli(tmp_path: Path) -> None:
    cfg = _toml(
        tmp_path,
        """
[log]
level = "warning"
[pipeline]
queue_capacity = 111
drain_timeout_seconds = 3
[receivers.otlp_grpc]
endpoint = "127.0.0.1:1111"
max_message_bytes = 2048
""",
    )
    env = {
        "COEFFD_PIPELINE__QUEUE_CAPACITY": "222",
        "COEFFD_RECEIVERS__OTLP_GRPC__ENDPOINT": "127.0.0.1:2222",
    }
    s = load_settings(cfg, {"receivers": {"otlp_grpc": {"endpoint": "127.0.0.1:3333"}}}, env)
    assert s.receivers.otlp_grpc.endpoint == "127.0.0.1:3333"  # CLI beats env and TOML
    assert s.pipeline.queue_capacity == 222  # env beats TOML
    assert s.log.level == "warning"  # TOML beats default
    assert s.receivers.otlp_grpc.max_message_bytes == 2048
    assert s.pipeline.drain_timeout_seconds == 3.0
    assert s.receivers.otlp_http.endpoint == "0.0.0.0:4318"  # default
    assert s.http.endpoint == "0.0.0.0:9464"
    assert Settings().pipeline.queue_capacity == 200_000  # constructing directly: defaults only


def test_config_from_env_var_and_cli_flags(tmp_path: Path) -> None:
    cfg = _toml(tmp_path, '[http]\nendpoint = "127.0.0.1:9000"\n[log]\nformat = "json"\n')
    args = build_parser().parse_args(
        ["serve", "--http-endpoint", "127.0.0.1:9001", "--set", "pipeline.queue_capacity=77"]
    )
    old = os.environ.get("COEFFD_CONFIG")
    os.environ["COEFFD_CONFIG"] = str(cfg)
    try:
        s = settings_from_args(args)
    finally:
        if old is None:
            del os.environ["COEFFD_CONFIG"]
        else:
            os.environ["COEFFD_CONFIG"] = old
    assert s is not None
    assert s.http.endpoint == "127.0.0.1:9001"
    assert s.pipeline.queue_capacity == 77
    assert s.log.format == "json"


@pytest.mark.parametrize(
    ("layer", "value", "message"),
    [
        (
            "env",
            {"COEFFD_RECEIVERS__OTLP_GRPC__ENDPOINT": "foo"},
            "invalid setting receivers.otlp_grpc.endpoint='foo': expected HOST:PORT",
        ),
        (
            "env",
            {"COEFFD_PIPELINE__QUEUE_CAPACITY": "0"},
            "invalid setting pipeline.queue_capacity='0': Input should be greater than or equal to 1",
        ),
        (
            "toml",
            '[log]\nlevel = "loud"\n',
            "invalid setting log.level='loud': Input should be 'debug', 'info', 'warning' or 'error'",
        ),
        (
            "toml",
            "[pipeline]\nqueue_capasity = 5\n",
            "invalid setting pipeline.queue_capasity: unknown key",
        ),
        ("toml", "[pipeline\n", "invalid setting config="),
        (
            "env",
            {"COEFFD_PIPELINE__SHED_MIN_KEEP": "0"},
            "invalid setting pipeline.shed_min_keep='0': Input should be greater than 0",
        ),
        (
            "toml",
            "[pipeline]\nshed_start = 0.6\nshed_full = 0.5\n",
            "invalid setting pipeline=",
        ),
        (
            "env",
            {"COEFFD_JOINER__COMPOSITION_WAIT_S": "0"},
            "invalid setting joiner.composition_wait_s='0': Input should be greater than 0",
        ),
        (
            "toml",
            "[joiner]\nmax_composition_waits = 0\n",
            "invalid setting joiner.max_composition_waits=0: Input should be greater than 0",
        ),
        (
            "env",
            {"COEFFD_JOINER__LOOP_WAIT_MIN_CALIBRATION": "0"},
            "invalid setting joiner.loop_wait_min_calibration='0': Input should be greater than or equal to 1",
        ),
        (
            "env",
            {"COEFFD_JOINER__WINDOW_S": "inf"},
            "invalid setting joiner.window_s='inf': Input should be a finite number",
        ),
        (
            "toml",
            "[joiner]\nmax_lateness_s = 1e300\n",
            "invalid setting joiner.max_lateness_s=1e+300: Input should be less than or equal to 2592000",
        ),
        (
            "toml",
            "[learners]\nprior_strength = nan\n",
            "invalid setting learners.prior_strength=nan: Input should be a finite number",
        ),
    ],
)
def test_invalid_values_one_line(tmp_path: Path, layer: str, value: object, message: str) -> None:
    with pytest.raises(SettingsError) as ei:
        if layer == "env":
            load_settings(None, None, value)  # type: ignore[arg-type]
        else:
            load_settings(_toml(tmp_path, value), None, {})  # type: ignore[arg-type]
    assert str(ei.value).startswith(message)
    assert "\n" not in str(ei.value)
    if "shed_start" in str(value):  # a cross-key rule: both keys and a fix are named
        assert "pipeline.shed_full (0.5) must be above pipeline.shed_start (0.6)" in str(ei.value)


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (
            ["--otlp-grpc-endpoint", "foo"],
            {},
            "coeffd: invalid setting receivers.otlp_grpc.endpoint='foo': expected HOST:PORT\n",
        ),
        (
            [],
            {"COEFFD_HTTP__ENDPOINT": "localhost:99999"},
            "coeffd: invalid setting http.endpoint='localhost:99999': expected HOST:PORT\n",
        ),
        (
            ["--set", "pipeline.drain_timeout_seconds=-1"],
            {},
            "coeffd: invalid setting pipeline.drain_timeout_seconds='-1': Input should be greater than or equal to 0\n",
        ),
    ],
)
def test_serve_exits_2_with_one_line(argv: list[str], env: dict[str, str], expected: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "coeffd", "serve", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr == expected
