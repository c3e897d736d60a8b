"""Telemetry names models and GPUs; it never hands coeffd a path to open (issue 17.1).

``coeffd.model=/dev/zero`` grew memory by gigabytes and ``coeffd.gpu=<a FIFO>`` blocked
the pipeline thread forever. Now a wire value is only a name: bundled, or an entry of an
operator-configured directory, read safely (regular files only, bounded).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from coeffd.learners.features.catalog import UnknownModelError, find_model
from coeffd.learners.features.config import BasisResolver, ServingConfig
from coeffd.learners.features.files import MAX_DESCRIPTION_BYTES, NotANameError, read_text_bounded
from coeffd.learners.features.hardware import UnknownGpuError, find_hardware

BUNDLED = Path(__file__).resolve().parents[3] / "coeffd/learners/features/data/models"


def finishes(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a thread; a regression (a blocking open) fails instead of hanging."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed back to the test
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "blocked: a name was opened as a path"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    p = tmp_path / "fifo.json"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize(
    "name",
    ["/dev/zero", "../../../dev/zero", "a/b/c", "..", ".", "", "x\x00y", "a\\b", "x" * 201],
)
def test_paths_are_not_names(name: str) -> None:
    with pytest.raises(NotANameError):
        find_model(name)
    with pytest.raises(NotANameError):
        find_hardware(name)


def test_fifo_and_device_paths_resolve_to_a_reason_without_opening(fifo: Path) -> None:
    r = BasisResolver()
    for model, gpu, reason in (
        (str(fifo), "H100", "invalid_name"),
        ("/dev/zero", "H100", "invalid_name"),
        ("llama-3.1-8b-instruct", str(fifo), "invalid_name"),
        ("llama-3.1-8b-instruct", "/dev/zero", "invalid_name"),
        ("no-such-model", "H100", "unknown_model"),
        ("llama-3.1-8b-instruct", "H999", "unknown_gpu"),
        ("llama-3.1-8b-instruct", "H100", None),
        ("meta-llama/Llama-3.1-8B-Instruct", "H100", None),  # HF repo ids still work
    ):
        cfg = ServingConfig(model=model, gpu=gpu)
        assert finishes(lambda c=cfg: r.problem(c)) == reason, (model, gpu)


def test_operator_directories_extend_the_names(tmp_path: Path) -> None:
    models, gpus = tmp_path / "models", tmp_path / "gpus"
    (models / "my-llama").mkdir(parents=True)
    gpus.mkdir()
    shutil.copy(BUNDLED / "llama-3.1-8b-instruct/config.json", models / "my-llama/config.json")
    shutil.copy(BUNDLED / "qwen3-14b/config.json", models / "my-qwen.json")
    (gpus / "X1.json").write_text('{"TFlopsPeak": 100.0, "BwPeakTBs": 1.0}')
    (gpus / "X2.json").write_text('{"X2": {"TFlopsPeak": 200.0, "BwPeakTBs": 2.0}}')
    r = BasisResolver(models_dir=models, hardware_dir=gpus)
    assert r.basis(ServingConfig(model="my-llama", gpu="X1")).hw.tflops_peak == 100.0
    assert r.basis(ServingConfig(model="org/my-qwen", gpu="X2")).hw.tflops_peak == 200.0
    assert r.problem(ServingConfig(model="my-llama", gpu="H100")) is None  # bundled too
    # outside the directory by name: refused, whatever exists there
    (tmp_path / "outside.json").write_text((models / "my-qwen.json").read_text())
    assert r.problem(ServingConfig(model="../outside", gpu="X1")) == "invalid_name"
    assert r.problem(ServingConfig(model="outside", gpu="X1")) == "unknown_model"
    with pytest.raises(UnknownModelError):
        find_model("outside", models)
    with pytest.raises(UnknownGpuError):
        find_hardware("X3", gpus)


def test_directory_entries_must_be_small_regular_files(tmp_path: Path, fifo: Path) -> None:
    models, gpus = tmp_path / "models", tmp_path / "gpus"
    models.mkdir()
    gpus.mkdir()
    os.mkfifo(models / "pipe.json")
    os.mkfifo(gpus / "PIPE.json")
    (models / "zero.json").symlink_to("/dev/zero")
    (gpus / "ZERO.json").symlink_to("/dev/zero")
    with (models / "huge.json").open("wb") as f:
        f.truncate(MAX_DESCRIPTION_BYTES + 1)  # sparse: no disk used
    (models / "bad-utf8.json").write_bytes(b'{"a": "\xff"}')
    r = BasisResolver(models_dir=models, hardware_dir=gpus)
    for model, gpu in (
        ("pipe", "H100"),
        ("zero", "H100"),
        ("huge", "H100"),
        ("bad-utf8", "H100"),
    ):
        cfg = ServingConfig(model=model, gpu=gpu)
        assert finishes(lambda c=cfg: r.problem(c)) == "invalid_model", model
    for gpu in ("PIPE", "ZERO"):
        cfg = ServingConfig(model="llama-3.1-8b-instruct", gpu=gpu)
        assert finishes(lambda c=cfg: r.problem(c)) == "invalid_hardware", gpu


def test_read_text_bounded_refuses_non_regular_files(tmp_path: Path, fifo: Path) -> None:
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(OSError, match=r"not a regular file|Is a directory"):
            finishes(lambda p=path: read_text_bounded(p))
    small = tmp_path / "ok.json"
    small.write_text("{}")
    assert read_text_bounded(small) == "{}"
    with pytest.raises(OSError, match="larger than 1 bytes"):
        read_text_bounded(small, limit=1)


def test_resolver_cache_is_bounded() -> None:
    r = BasisResolver()
    r.MAX_CACHED = 5  # type: ignore[misc]
    for i in range(20):
        r.problem(ServingConfig(model=f"m{i}", gpu="H100"))
    assert len(r._cache) <= 5
