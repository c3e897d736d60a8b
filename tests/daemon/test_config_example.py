"""config.example.toml loads, and documents every settings key with its default."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from coeffd.daemon.settings import Settings, load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"


def _keys(model: type[BaseModel], prefix: str = "") -> tuple[set[str], set[str]]:
    """(keys with a TOML-expressible default, keys whose default is None)."""
    out: set[str] = set()
    unset: set[str] = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            sub, sub_unset = _keys(ann, f"{prefix}{name}.")
            out |= sub
            unset |= sub_unset
        elif field.default is None:
            unset.add(prefix + name)
        else:
            out.add(prefix + name)
    return out, unset


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[prefix + k] = v
    return out


def test_example_documents_every_key_with_its_default() -> None:
    text = EXAMPLE.read_text()
    doc = _flatten(tomllib.loads(text))
    keys, unset = _keys(Settings)
    assert set(doc) == keys
    # TOML has no null: keys that default to unset are documented as comments.
    for key in unset:
        assert f"# {key.rpartition('.')[2]} =" in text or f"# [{key}]" in text, key
    defaults = _flatten(Settings().model_dump(mode="json"))
    for key, value in doc.items():
        assert defaults[key] == value, key
    assert load_settings(EXAMPLE, None, {}) == Settings()
