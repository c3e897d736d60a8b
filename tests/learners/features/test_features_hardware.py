"""Hardware sheet: BLIS keys equal BLIS's bundled values (§9.1), lookups and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coeffd.learners.features.hardware import (
    HardwareError,
    available_gpus,
    load_hardware,
    load_sheet,
)

BLIS_SHEET = Path("/work/shared/data/blis/hardware_config.json")
BLIS_KEYS = ("TFlopsPeak", "TFlopsFP8", "BwPeakTBs", "mfuPrefill", "mfuDecode", "MemoryGiB")

SPEC_9_1 = {
    "H100": (989.5, 1979.0, 3.35, 0.45, 0.30, 80.0),
    "A100-SXM": (312, 0, 2.039, 0.38, 0.18, 80.0),
    "A100-80": (312, 0, 2.039, 0.38, 0.18, 80.0),
    "L40S": (362.05, 1466.0, 0.864, 0.32, 0.08, 48.0),
}


@pytest.mark.parametrize("gpu", sorted(SPEC_9_1))
def test_bundled_equals_spec_9_1(gpu: str) -> None:
    entry = load_hardware(gpu).to_blis()
    assert tuple(entry[k] for k in BLIS_KEYS) == SPEC_9_1[gpu]


def test_bundled_equals_blis_file() -> None:
    if not BLIS_SHEET.is_file():
        pytest.skip(f"{BLIS_SHEET} not present (BLIS reference data not mounted)")
    theirs = json.loads(BLIS_SHEET.read_text())
    for gpu in ("H100", "A100-SXM", "A100-80", "L40S"):
        ours = load_hardware(gpu).to_blis()
        for k in BLIS_KEYS:
            assert ours[k] == float(theirs[gpu][k]), (gpu, k)
    # BLIS's own file loads through our reader too.
    assert set(load_sheet(BLIS_SHEET)) == set(theirs)


def test_required_gpus_and_link_bandwidths() -> None:
    assert {"H100", "H200", "A100-SXM", "A100-80", "L40S", "B200"} <= set(available_gpus())
    for gpu in available_gpus():
        hw = load_hardware(gpu)
        assert hw.pcie_gbs > 0 and hw.host_bytes_per_us > 0
        assert hw.interconnect_bytes_per_us > 0  # NVLink, or PCIe for L40S
    assert load_hardware("L40S").nvlink_gbs == 0
    assert (
        load_hardware("L40S").interconnect_bytes_per_us == load_hardware("L40S").host_bytes_per_us
    )


def test_fp8_peak_selection() -> None:
    h100, a100, l40s = (load_hardware(g) for g in ("H100", "A100-80", "L40S"))
    assert h100.flops_per_us(1.0) == 1.979e9
    assert h100.flops_per_us(0.5) == 9.895e8  # W4A16 keeps the BF16 peak
    assert a100.flops_per_us(1.0) == 3.12e8  # no FP8 peak
    assert l40s.flops_per_us(1.0) == 1.466e9


def test_unknown_gpu_lists_sorted_names() -> None:
    with pytest.raises(HardwareError) as exc:
        load_hardware("MI300X")
    msg = str(exc.value)
    assert "MI300X" in msg
    listed = msg.split("available: ")[1].split(", ")
    assert listed == sorted(listed) and "H100" in listed


def test_user_sheet(tmp_path: Path) -> None:
    p = tmp_path / "gpus.json"
    p.write_text(
        json.dumps(
            {
                "_comment": "mine",
                "X1": {"tflopspeak": 100, "BWPEAKTBS": 1.0, "_comment": "keys case-insensitive"},
                "X2": {"TFlopsPeak": 200, "BwPeakTBs": 2.0, "NvlinkGBs": 100},
            }
        )
    )
    assert load_hardware(p, "X1").tflops_peak == 100
    assert load_hardware(f"{p}:X2").nvlink_gbs == 100
    with pytest.raises(HardwareError, match="choose one of: X1, X2"):
        load_hardware(str(p))
    with pytest.raises(HardwareError, match=r"unknown GPU 'X3'.*available: X1, X2"):
        load_hardware(p, "X3")
    single = tmp_path / "mygpu.json"
    single.write_text(json.dumps({"TFlopsPeak": 50, "BwPeakTBs": 0.5}))
    assert load_hardware(single).name == "mygpu"


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"X": {"BwPeakTBs": 1}}', "TFlopsPeak"),
        ('{"X": {"TFlopsPeak": 1}}', "BwPeakTBs"),
        ('{"X": {"TFlopsPeak": "fast", "BwPeakTBs": 1}}', "finite number"),
        ('{"X": 3}', "JSON object"),
    ],
)
def test_bad_sheets(tmp_path: Path, content: str, match: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(HardwareError, match=match):
        load_hardware(p, "X")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="cannot read"):
        load_hardware(tmp_path / "nope.json")
