"""``coeffd basis`` command and the ``bench basis`` smoke run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from coeffd.daemon.commands import basis as basis_cmd

LLAMA_H100 = ["--model-config", "llama-3.1-8b-instruct", "--hardware", "H100", "--tp", "1"]


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    basis_cmd.add_parser(sub)
    args = p.parse_args(["basis", *argv])
    code: int = args.run(args)
    return code


def write_batch(tmp_path: Path, rows: object) -> str:
    f = tmp_path / "batch.json"
    f.write_text(json.dumps(rows))
    return str(f)


MIXB = [
    {"input_len": 1000, "progress_index": 0, "num_new_tokens": 1000, "output_len": 100},
    {"input_len": 3000, "progress_index": 2048, "num_new_tokens": 952, "output_len": 100},
    {"input_len": 150, "progress_index": 200, "num_new_tokens": 1, "output_len": 50},
    {"input_len": 250, "progress_index": 300, "num_new_tokens": 1, "output_len": 50},
    {"input_len": 350, "progress_index": 400, "num_new_tokens": 1, "output_len": 50},
]


def test_basis_prints_terms_and_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch = write_batch(tmp_path, MIXB)
    argv = ["--model-config", "llama-3.1-8b-instruct", "--hardware", "H100", "--tp", "1"]
    assert run([*argv, "--batch", batch, "--beta", "default"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time"] == 11497 and out["s"] == 11497.988841218023
    assert out["names"][0] == "T_pf_compute" and len(out["values"]) == 11
    assert out["terms"]["T_pf_kv"] == pytest.approx(76.3738937313, abs=1e-10)
    assert run([*argv, "--batch", batch]) == 0
    assert "step_time" not in json.loads(capsys.readouterr().out)


def test_basis_with_paths_and_dp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = (
        Path(__file__).resolve().parents[3]
        / "coeffd/learners/features/data/models/mixtral-8x7b-v0.1"
    )
    hw = tmp_path / "hw.json"
    hw.write_text(
        json.dumps({"H100x": {"TFlopsPeak": 989.5, "TFlopsFP8": 1979.0, "BwPeakTBs": 3.35}})
    )
    rows = [{"input_len": 512, "progress_index": 0, "num_new_tokens": 512, "output_len": 100}] + [
        {"input_len": 1000, "progress_index": 1024, "num_new_tokens": 1, "output_len": 50}
    ] * 8
    code = run(
        [
            "--model-config",
            str(ref / "config.json"),
            "--hardware",
            str(hw),
            "--tp",
            "2",
            "--dp",
            "2",
            "--moe-comm-backend",
            "deepep_low_latency",
            "--batch",
            write_batch(tmp_path, rows),
            "--beta",
            "0.152128,0.0,1.36252915,0.752037,32.09546717,4.41684444,126.024825,481.8613888,0.0,1.94710771,0.752037",
        ]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["step_time"] == 11631  # W4b


@pytest.mark.parametrize(
    ("rows", "extra", "match"),
    [
        ("{", [], "not valid JSON"),
        ({"a": 1}, [], "must be a JSON list"),
        ([{"input_len": 1}], [], "missing key 'progress_index'"),
        (
            [{"input_len": "x", "progress_index": 0, "num_new_tokens": 1, "output_len": 0}],
            [],
            "'input_len' must be a number",
        ),
        (
            [{"input_len": -1, "progress_index": 0, "num_new_tokens": 1, "output_len": 0}],
            [],
            "non-negative integer",
        ),
        ([3], [], "must be an object"),
        ([], ["--beta", "1,2"], "at least 7"),
        ([], ["--beta", "1, 2"], "comma-separated"),
        ([], ["--tp", "3"], "not divisible by tp"),
        ([], ["--hardware", "TPUv9"], "unknown GPU 'TPUv9'"),
        ([], ["--model-config", "gpt-9"], "bundled"),
    ],
)
def test_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: object, extra: list[str], match: str
) -> None:
    f = tmp_path / "batch.json"
    f.write_text(rows if isinstance(rows, str) else json.dumps(rows))
    # later flags win in argparse
    assert run([*LLAMA_H100, "--batch", str(f), *extra]) == 2
    err = capsys.readouterr().err
    assert match in err and err.startswith("coeffd basis: error:")


def test_missing_batch_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([*LLAMA_H100, "--batch", str(tmp_path / "no.json")]) == 2
    assert "cannot read batch file" in capsys.readouterr().err


def test_bench_basis_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import basis as bench_basis

    assert bench_basis.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "aggregate approximation error" in out
