"""config.example.toml loads, and documents every settings key with its default."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from daemon.settings import Settings, load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"


def _keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _keys(ann, f"{prefix}{name}.")
        else:
            out.add(prefix + name)
    return out


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[prefix + k] = v
    return out


def test_example_documents_every_key_with_its_default() -> None:
    doc = _flatten(tomllib.loads(EXAMPLE.read_text()))
    assert set(doc) == _keys(Settings)
    defaults = _flatten(Settings().model_dump())
    for key, value in doc.items():
        assert defaults[key] == value, key
    assert load_settings(EXAMPLE, None, {}) == Settings()
