"""``coeffd pull --format blis-args`` describes the engine the coefficients were learned
on (issue 31): BLIS's scheduler budget, sequence cap, context length, KV size and block
size; what the configuration does not report is left to BLIS and named on stderr; and the
real ``blis run`` accepts the list and runs with the measured budget."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from blis_support import blis_binary
from publish_support import make_snapshot, serve

from coeffd.daemon.commands import pull
from coeffd.daemon.publish.blis import to_blis_args
from coeffd.daemon.publish.snapshot import ConfigurationRef, Snapshot
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.learners.features.config import ServingConfig

#: BLIS's trained-physics coefficients for llama-3.1-8b on H100 are not needed: these are
#: plausible µs-scale values so a ``blis run`` gives finite latencies.
ALPHA = (12000.0, 800.0, 40.0)
BETA = (0.1, 0.0, 1.2, 0.7, 30.0, 4.0, 120.0, 480.0, 0.0, 2.0, 0.7)


def _snapshot(**knobs: object) -> Snapshot:
    cfg = ServingConfig.from_dict({"model": "llama-3.1-8b-instruct", "gpu": "H100", **knobs})
    description = {**cfg.to_dict(), "kv_blocks_total_gpu": 29_000}
    ref = ConfigurationRef(id=cfg.id, labels=cfg.labels, description=description)
    snap = make_snapshot(cfg.id, 1, alpha=ALPHA, beta=BETA)
    return msgspec.structs.replace(snap, configuration=ref)


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    store = SnapshotStore(tmp_path / "snaps")
    store.publish(_snapshot(max_num_batched_tokens=512, max_num_seqs=64, max_model_len=8192))
    server, base = serve(store)
    try:
        yield base
    finally:
        server.stop()


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _pull_args(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    code = pull.main(["--server", url, "--format", "blis-args"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return shlex.split(out), err


def test_blis_args_carry_the_measured_engine(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    args, err = _pull_args(url, capsys)
    assert _flag(args, "--max-num-batched-tokens") == "512"
    assert _flag(args, "--max-num-seqs") == "64"
    assert _flag(args, "--max-model-len") == "8192"
    assert _flag(args, "--total-kv-blocks") == "29000"
    assert _flag(args, "--block-size-in-tokens") == "16"
    assert "left to BLIS" not in err


def test_unreported_knobs_are_left_to_blis_and_named() -> None:
    snap = _snapshot(max_num_seqs=0 or None, prefix_caching=True, async_scheduling=True)
    snap = msgspec.structs.replace(
        snap,
        configuration=msgspec.structs.replace(
            snap.configuration,
            description={
                k: v
                for k, v in snap.configuration.description.items()
                if k != "kv_blocks_total_gpu"
            },
        ),
    )
    args, notes = to_blis_args(snap)
    assert "--max-num-batched-tokens" not in args and "--total-kv-blocks" not in args
    assert _flag(args, "--block-size-in-tokens") == "16"
    left = next(n for n in notes if n.startswith("left to BLIS's defaults"))
    for flag in ("--max-num-batched-tokens (2048)", "--max-num-seqs (256)", "--total-kv-blocks"):
        assert flag in left
    assert any("prefix_caching=True" in n for n in notes)
    assert any("one-step output delay" in n for n in notes)


def test_values_blis_rejects_are_never_printed() -> None:
    snap = _snapshot()
    desc = {**snap.configuration.description, "max_num_seqs": -3, "kv_blocks_total_gpu": 0}
    snap = msgspec.structs.replace(
        snap, configuration=msgspec.structs.replace(snap.configuration, description=desc)
    )
    args, notes = to_blis_args(snap)
    assert "--max-num-seqs" not in args and "--total-kv-blocks" not in args
    assert "--max-num-seqs (256)" in notes[-1] or any("--max-num-seqs (256)" in n for n in notes)


def _blis_run(blis: Path, args: list[str], out: Path) -> dict[str, float]:
    proc = subprocess.run(
        [str(blis), "run", *args, "--num-requests", "40", "--rate", "20", "--prompt-tokens",
         "1500", "--prompt-tokens-stdev", "0", "--prompt-tokens-min", "1500",
         "--prompt-tokens-max", "1500", "--output-tokens", "20", "--output-tokens-stdev", "0",
         "--output-tokens-min", "20", "--output-tokens-max", "20", "--metrics-path", str(out)],
        capture_output=True, text=True, timeout=300, check=False, cwd=blis.parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics: dict[str, float] = json.loads(out.read_text())
    return metrics


def test_blis_runs_the_pulled_engine(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blis, why = blis_binary()
    if blis is None:
        pytest.skip(why)
    args, _ = _pull_args(url, capsys)
    learned = _blis_run(blis, args, tmp_path / "512.json")
    wider = list(args)
    wider[wider.index("--max-num-batched-tokens") + 1] = "2048"
    default = _blis_run(blis, wider, tmp_path / "2048.json")
    # a 1500-token prompt takes three chunks under a 512-token budget, one under 2048
    key = next(k for k in learned if "ttft" in k.lower() and "mean" in k.lower())
    assert learned[key] > default[key] > 0
