"""Bundled model descriptions by name: ``data/models/<name>/config.json``.

The files are coeffd's own: the architecture keys BLIS reads, with the public values
of each model's HuggingFace ``config.json`` (no tokenizer or weights metadata).

>>> sorted(MODELS)[:3]
['deepseek-v2-lite', 'llama-2-7b-hf', 'llama-3.1-70b-instruct']
>>> load_model("Mixtral-8x7B-v0.1").num_experts   # names are case-insensitive
8
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from coeffd.learners.features.files import plain_name
from coeffd.learners.features.model import ModelConfigError, ModelSpec

__all__ = [
    "MODELS",
    "UnknownModelError",
    "canonical_model_name",
    "find_model",
    "load_model",
    "model_config",
    "resolve_model",
]


class UnknownModelError(ModelConfigError):
    """A model name that neither the catalogue nor the operator's directory describes."""


def _models_dir() -> Any:
    return resources.files("coeffd.learners.features").joinpath("data/models")


@cache
def _names() -> tuple[str, ...]:
    return tuple(
        sorted(
            p.name
            for p in _models_dir().iterdir()
            if p.is_dir() and p.joinpath("config.json").is_file()
        )
    )


def model_config(name: str) -> dict[str, Any]:
    """The raw bundled ``config.json`` of a model (a fresh dict)."""
    key = _canonical(name)
    text = _models_dir().joinpath(key, "config.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def canonical_model_name(name: str) -> str | None:
    """The catalogue key a name refers to (case-insensitive, HF repo ids too), else None.

    >>> canonical_model_name("meta-llama/Llama-3.1-8B-Instruct")
    'llama-3.1-8b-instruct'
    >>> canonical_model_name("my-private-model") is None
    True
    """
    # HF repo ids ("meta-llama/Llama-3.1-8B-Instruct") match by their last component.
    key = name.strip().lower().rsplit("/", 1)[-1]
    return key if key in _names() else None


def _canonical(name: str) -> str:
    key = canonical_model_name(name)
    if key is not None:
        return key
    raise KeyError(f"unknown bundled model {name!r}; available: {', '.join(_names())}")


@cache
def load_model(name: str) -> ModelSpec:
    """A bundled model by name (case-insensitive; an HF repo id's last part also works)."""
    key = _canonical(name)
    return ModelSpec.from_config(model_config(key), name=key, source=f"bundled:{key}/config.json")


class _Catalogue(Mapping[str, ModelSpec]):
    """Read-only mapping name → :class:`ModelSpec`, parsed lazily."""

    def __getitem__(self, name: str) -> ModelSpec:
        return load_model(name)

    def __iter__(self) -> Iterator[str]:
        return iter(_names())

    def __len__(self) -> int:
        return len(_names())

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            _canonical(name)
        except KeyError:
            return False
        return True

    def __repr__(self) -> str:
        return f"MODELS({', '.join(_names())})"


MODELS: Mapping[str, ModelSpec] = _Catalogue()


def resolve_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """A bundled model name, or a path to a ``config.json`` (or a folder holding one)."""
    text = os.fspath(name_or_path)
    p = Path(text)
    if p.exists():
        return ModelSpec.from_config(p)
    if text in MODELS:
        return load_model(text)
    raise ModelConfigError(
        f"{text!r} is neither a config.json path nor a bundled model; "
        f"bundled: {', '.join(_names())}"
    )


def find_model(name: str, directory: str | os.PathLike[str] | None = None) -> ModelSpec:
    """A model by *name* only (telemetry's ``coeffd.model``): never a path.

    The bundled catalogue first (case-insensitive; an HF repo id ``org/name`` by its
    last part), then the operator's ``directory``: ``<dir>/<name>/config.json`` or
    ``<dir>/<name>.json``. The name (each part of an ``org/name``) must be a plain name:
    no ``..``, no other separators. Raises :class:`UnknownModelError` when nothing has it,
    :class:`~learners.features.files.NotANameError` for a path.

    >>> find_model("meta-llama/Llama-3.1-8B-Instruct").name
    'llama-3.1-8b-instruct'
    >>> find_model("/dev/zero")
    Traceback (most recent call last):
    ...
    coeffd.learners.features.files.NotANameError: model '/dev/zero' is not a plain name (no path separators, '..', control characters; at most 200 characters)
    """
    key = plain_name(name, "model", org=True).rsplit("/", 1)[-1]
    canon = canonical_model_name(name)
    if canon is not None:
        return load_model(canon)
    if directory is not None:
        base = Path(directory)
        for candidate in (base / key / "config.json", base / f"{key}.json"):
            try:
                return ModelSpec.from_config(candidate, name=key)
            except ModelConfigError as exc:
                if isinstance(exc.__cause__, FileNotFoundError | NotADirectoryError):
                    continue
                raise
    where = "bundled" + (f" or in {directory}" if directory is not None else "")
    raise UnknownModelError(f"unknown model {name!r}: not {where}; bundled: {', '.join(_names())}")
