"""Fuzzed settings (TOML files, environment, --set): a clear one-line ``SettingsError`` or
valid settings, never a traceback (issues 17.11, 19.5). Bounded: a few hundred examples.

Keys are drawn from the real settings models (and misspelled), values of every TOML type
for every key, so most examples are near misses of valid settings.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from coeffd.daemon.cli import build_parser
from coeffd.daemon.commands.common import settings_from_args
from coeffd.daemon.settings import Settings, SettingsError, _section_model, load_settings


def _keys(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        sub = _section_model(field.annotation)
        out += _keys(sub, (*prefix, name)) if sub is not None else [(*prefix, name)]
    return out


KEYS = _keys(Settings)
_key = st.sampled_from(KEYS) | st.lists(
    st.sampled_from([p for k in KEYS for p in k] + ["pipelne", "x", "", "a b"]), min_size=1,
    max_size=3,
).map(tuple)  # fmt: skip
_scalar = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["0.0.0.0:4317", "tcp://127.0.0.1:5557", "H100", "llama-3.1-8b-instruct",
                     "json", "sidecar", "learning", "", "1e400", "1_0"]),
)  # fmt: skip
_value = _scalar | st.lists(_scalar, max_size=3)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return (
            "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        )
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


def _toml(pairs: list[tuple[tuple[str, ...], Any]]) -> str:
    lines = []
    for key, value in pairs:
        dotted = ".".join(json.dumps(p) for p in key)  # quoted keys: any text is a key
        lines.append(f"{dotted} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _clean(err: SettingsError) -> None:
    text = str(err)
    assert "\n" not in text and text.startswith("invalid setting"), text
    assert "Traceback" not in text


def _load(**kw: Any) -> None:
    try:
        load_settings(**kw)
    except SettingsError as e:
        _clean(e)


_fuzz = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


@_fuzz
@given(pairs=st.lists(st.tuples(_key, _value), max_size=5))
def test_toml(tmp_path_factory: pytest.TempPathFactory, pairs: list[Any]) -> None:
    path = tmp_path_factory.mktemp("toml") / "c.toml"
    path.write_text(_toml(pairs))
    _load(config=path, environ={})


@_fuzz
@given(data=st.binary(max_size=200))
def test_toml_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("raw") / "c.toml"
    path.write_bytes(data)
    _load(config=path, environ={})


_env_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                    max_size=20)  # fmt: skip


@_fuzz
@given(pairs=st.lists(st.tuples(_key, _scalar.map(str) | _env_text), max_size=4))
def test_environment(pairs: list[tuple[tuple[str, ...], str]]) -> None:
    environ = {"COEFFD_" + "__".join(k).upper(): v for k, v in pairs}
    _load(environ=environ)


@_fuzz
@given(items=st.lists(
    st.tuples(_key, _scalar.map(str)).map(lambda kv: ".".join(kv[0]) + "=" + kv[1]) | _env_text,
    max_size=4,
))  # fmt: skip
def test_set_flags(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], items: list[str]
) -> None:
    tmp = tmp_path_factory.mktemp("set")
    argv = ["serve", "--state-dir", str(tmp / "s"), "--snapshot-dir", str(tmp / "p")]
    argv += [f"--set={item}" for item in items]  # (an item may start with "-")
    args = build_parser().parse_args(argv)
    result = settings_from_args(args)
    err = capsys.readouterr().err
    if result is None:
        assert err.count("\n") == 1 and err.startswith("coeffd: invalid setting"), err
    else:
        assert isinstance(result, Settings) and err == ""


def test_the_keys_cover_the_settings() -> None:
    assert ("pipeline", "queue_capacity") in KEYS and ("catalog", "models_dir") in KEYS
    assert len(KEYS) > 50
