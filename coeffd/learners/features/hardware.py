"""GPU data sheets in BLIS's ``hardware_config.json`` format, plus link bandwidths.

Trained-physics uses only ``TFlopsPeak``, ``TFlopsFP8`` and ``BwPeakTBs`` (spec §1.3); the
extended features also use ``NvlinkGBs`` (GPU↔GPU, per direction) and ``PcieGBs`` (host
link, per direction). The bundled sheet ``data/hardware.json`` is coeffd's own; for H100,
A100-SXM, A100-80 and L40S its BLIS keys equal BLIS's bundled values (spec §9.1); H200 and
B200 borrow H100's mfu values (not calibrated). ``TFlopsPeak`` is dense BF16/FP16 TFLOPS,
``TFlopsFP8`` dense FP8 TFLOPS (0 = no native FP8), ``BwPeakTBs`` HBM TB/s, ``NvlinkGBs`` 0 =
no NVLink (peers talk over PCIe). The sheet holds GPU entries only: ``coeffd pull --format
blis-args`` hands it to BLIS as ``--hardware-config``, and BLIS decodes every top-level key
as a GPU (a ``"_comment"`` string made ``blis run`` fail, issue 31).

Field names are matched case-insensitively, as Go's JSON decoder does (notes item 20), so a
sheet BLIS accepts is accepted here too.

>>> hw = load_hardware("H100")
>>> hw.flops_per_us(weight_bytes=2.0), hw.flops_per_us(weight_bytes=1.0), hw.bytes_per_us
(989500000.0, 1979000000.0, 3350000.0)
>>> load_hardware("H999")
Traceback (most recent call last):
...
coeffd.learners.features.hardware.UnknownGpuError: unknown GPU 'H999' in bundled sheet; available: A100-80, A100-SXM, B200, H100, H200, L40S
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from coeffd.learners.features.files import plain_name, read_text_bounded

__all__ = [
    "HardwareError",
    "HardwareSpec",
    "UnknownGpuError",
    "available_gpus",
    "find_hardware",
    "load_hardware",
    "load_sheet",
]


class HardwareError(ValueError):
    """A GPU that no sheet describes, or a sheet that cannot be read."""


class UnknownGpuError(HardwareError):
    """A GPU name that neither the bundled sheet nor the operator's directory describes."""


# Canonical key → dataclass field.
_KEYS: dict[str, str] = {
    "TFlopsPeak": "tflops_peak",
    "TFlopsFP8": "tflops_fp8",
    "BwPeakTBs": "bw_peak_tbs",
    "mfuPrefill": "mfu_prefill",
    "mfuDecode": "mfu_decode",
    "MemoryGiB": "memory_gib",
    "NvlinkGBs": "nvlink_gbs",
    "PcieGBs": "pcie_gbs",
}
_KEYS_LOWER = {k.lower(): v for k, v in _KEYS.items()}


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One GPU entry. Units: TFLOPS (10¹² FLOP/s), TB/s (10¹² B/s), GB/s (10⁹ B/s), GiB."""

    name: str
    tflops_peak: float
    tflops_fp8: float = 0.0
    bw_peak_tbs: float = 0.0
    mfu_prefill: float = 0.0
    mfu_decode: float = 0.0
    memory_gib: float = 0.0
    nvlink_gbs: float = 0.0  # 0 = no NVLink: peers communicate over PCIe
    pcie_gbs: float = 0.0
    source: str = "bundled"

    def flops_per_us(self, weight_bytes: float) -> float:
        """``Φ`` in FLOP/µs: the FP8 peak iff weights are exactly 1 byte and it exists (§2)."""
        if weight_bytes == 1.0 and self.tflops_fp8 > 0:
            return 1e6 * self.tflops_fp8
        return 1e6 * self.tflops_peak

    @property
    def bytes_per_us(self) -> float:
        """``BW`` in bytes/µs (TB/s × 10⁶)."""
        return 1e6 * self.bw_peak_tbs

    @property
    def interconnect_bytes_per_us(self) -> float:
        """GPU↔GPU bandwidth in bytes/µs: NVLink when present, else the PCIe link."""
        gbs = self.nvlink_gbs if self.nvlink_gbs > 0 else self.pcie_gbs
        return 1e3 * gbs

    @property
    def host_bytes_per_us(self) -> float:
        """Host (CPU↔GPU) link bandwidth in bytes/µs."""
        return 1e3 * self.pcie_gbs

    def to_blis(self) -> dict[str, float]:
        """The entry in BLIS's key format (extensions included)."""
        return {k: float(getattr(self, f)) for k, f in _KEYS.items()}


def _entry(name: str, raw: object, source: str) -> HardwareSpec:
    if not isinstance(raw, Mapping):
        raise HardwareError(f"{source}: entry {name!r} must be a JSON object")
    values: dict[str, float] = {}
    for key, v in raw.items():
        fld = _KEYS_LOWER.get(str(key).lower())
        if fld is None:
            continue  # _comment and unknown keys are ignored, as in BLIS
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            raise HardwareError(f"{source}: {name}.{key} must be a finite number, got {v!r}")
        values[fld] = float(v)
    if "tflops_peak" not in values:
        raise HardwareError(f"{source}: entry {name!r} has no 'TFlopsPeak'")
    if "bw_peak_tbs" not in values:
        raise HardwareError(f"{source}: entry {name!r} has no 'BwPeakTBs'")
    return HardwareSpec(name=name, source=source, **values)


def _parse_sheet(data: object, source: str) -> dict[str, HardwareSpec]:
    if not isinstance(data, Mapping):
        raise HardwareError(f"{source}: a hardware sheet must be a JSON object")
    # A single entry ({"TFlopsPeak": ...}) is a one-GPU sheet named after the file.
    if any(str(k).lower() in _KEYS_LOWER for k in data):
        name = Path(source).stem
        return {name: _entry(name, data, source)}
    return {
        str(name): _entry(str(name), entry, source)
        for name, entry in data.items()
        if not str(name).startswith("_")
    }


@cache
def _bundled() -> dict[str, HardwareSpec]:
    text = (
        resources.files("coeffd.learners.features")
        .joinpath("data/hardware.json")
        .read_text("utf-8")
    )
    return _parse_sheet(json.loads(text), "bundled")


def load_sheet(path: str | os.PathLike[str] | None = None) -> dict[str, HardwareSpec]:
    """All entries of a sheet (the bundled one when ``path`` is None)."""
    if path is None:
        return dict(_bundled())
    p = Path(path)
    try:
        data = json.loads(read_text_bounded(p))  # regular files only, bounded
    except OSError as exc:
        raise HardwareError(f"{p}: cannot read hardware sheet: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise HardwareError(f"{p}: not valid JSON: {exc}") from exc
    return _parse_sheet(data, str(p))


def available_gpus() -> list[str]:
    """Names in the bundled sheet, sorted."""
    return sorted(_bundled())


def _looks_like_path(s: str) -> bool:
    return s.endswith(".json") or os.sep in s or "/" in s


def load_hardware(name_or_path: str | os.PathLike[str], gpu: str | None = None) -> HardwareSpec:
    """A GPU entry by bundled name (``H100``), or from a user's JSON sheet.

    A path may point at a BLIS-format sheet (name → entry; ``gpu`` selects the entry,
    optional when the sheet has one) or at a single entry. ``path.json:NAME`` also works.
    Unknown names raise :class:`HardwareError` listing the available names, sorted.
    """
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or _looks_like_path(text):
        if gpu is None and ":" in text and not Path(text).exists():
            text, gpu = text.rsplit(":", 1)
        sheet = load_sheet(text)
        if gpu is None:
            if len(sheet) == 1:
                return next(iter(sheet.values()))
            raise HardwareError(
                f"{text}: sheet has several GPUs, choose one of: {', '.join(sorted(sheet))}"
            )
        where = text
    else:
        sheet, gpu, where = _bundled(), text, "bundled sheet"
    try:
        return sheet[gpu]
    except KeyError:
        raise UnknownGpuError(
            f"unknown GPU {gpu!r} in {where}; available: {', '.join(sorted(sheet))}"
        ) from None


def find_hardware(
    name: str, directory: str | os.PathLike[str] | None = None, sheet: str | None = None
) -> HardwareSpec:
    """A GPU by *name* only (telemetry's ``coeffd.gpu``): never a path.

    Looked up in the operator's ``sheet`` (a path from settings) when given, then the
    bundled sheet, then ``directory/<name>.json`` (a BLIS-format sheet holding ``name``,
    or a single entry). Raises :class:`UnknownGpuError` when none has it.

    >>> find_hardware("H100").name
    'H100'
    >>> find_hardware("/dev/zero")
    Traceback (most recent call last):
    ...
    coeffd.learners.features.files.NotANameError: gpu '/dev/zero' is not a plain name (no path separators, '..', control characters; at most 200 characters)
    """
    plain_name(name, "gpu")
    if sheet is not None:
        try:
            return load_hardware(sheet, name)
        except UnknownGpuError:
            pass
    bundled = _bundled()
    if name in bundled:
        return bundled[name]
    if directory is not None:
        entries = load_sheet_if_present(Path(directory) / f"{name}.json")
        if entries is not None:
            if name in entries:
                return entries[name]
            if len(entries) == 1:
                return next(iter(entries.values()))
    where = "the bundled sheet" + (f" or {directory}" if directory is not None else "")
    raise UnknownGpuError(
        f"unknown GPU {name!r}: not in {where}; bundled: {', '.join(sorted(bundled))}"
    )


def load_sheet_if_present(path: Path) -> dict[str, HardwareSpec] | None:
    """:func:`load_sheet`, or None when there is no such file."""
    try:
        return load_sheet(path)
    except HardwareError as exc:
        if isinstance(exc.__cause__, FileNotFoundError | NotADirectoryError):
            return None
        raise


def spec_from_mapping(name: str, entry: Mapping[str, Any]) -> HardwareSpec:
    """Build a :class:`HardwareSpec` from a BLIS-format entry held in memory (tests, settings).

    >>> spec_from_mapping("test", {"TFlopsPeak": 989.0, "BwPeakTBs": 3.35}).flops_per_us(2.0)
    989000000.0
    """
    return _entry(name, entry, "<dict>")
