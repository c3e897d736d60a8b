"""``coeffd pull`` as a newcomer meets it (issue 33): names it does not know are refused
with the closest known ones, a partly described configuration answers the learned one,
id prefixes, an offline path, ``$COEFFD_SERVER``, ``--json``. In-process ``pull.main``
against the daemon's API over real HTTP."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import orjson
import pytest
from publish_support import BLIS_DEFAULTS, make_snapshot, serve

from coeffd.daemon.commands import configurations, pull
from coeffd.daemon.publish.defaults_schema import validate_defaults_yaml
from coeffd.daemon.publish.snapshot import ConfigurationRef, Snapshot
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.learners.features.config import ServingConfig

#: what the demo learns: every knob reported, not only model/GPU/TP
BUSY = ServingConfig(
    model="llama-3.1-8b-instruct", gpu="H100", tp=1, max_num_batched_tokens=2048, max_num_seqs=256
)
QUIET = dataclasses.replace(BUSY, max_num_batched_tokens=4096)
MIXTRAL = ServingConfig(model="mixtral-8x7b-v0.1", gpu="H100", tp=2, max_num_batched_tokens=2048)

Fleet = tuple[str, SnapshotStore]
Capsys = pytest.CaptureFixture[str]


def learned(cfg: ServingConfig, observations: int, version: int = 2) -> Snapshot:
    return msgspec.structs.replace(
        make_snapshot(cfg.id, version),
        configuration=ConfigurationRef(id=cfg.id, labels=cfg.labels, description=cfg.to_dict()),
        observations={"beta": observations},
        beta=tuple(0.01 * observations + b for b in make_snapshot().beta),
    )


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    store = SnapshotStore(tmp_path / "snapshots")
    for cfg, n in ((BUSY, 7874), (QUIET, 900), (MIXTRAL, 2045)):
        store.publish(learned(cfg, n))
    server, url = serve(store)
    try:
        yield url, store
    finally:
        server.stop()


def _pull(capsys: Capsys, *args: str) -> tuple[int, str, str]:
    code = pull.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("flags", "wrong", "closest"),
    [
        (
            ["--model", "llama-3.1-70b-instuct", "--hardware", "H200"],
            "model",
            "llama-3.1-70b-instruct",
        ),
        (["--model", "llama-3.1-70b-instruct", "--hardware", "H20O"], "GPU", "H200"),
    ],
)
def test_unknown_names_are_refused_with_the_closest(
    fleet: Fleet, capsys: Capsys, flags: list[str], wrong: str, closest: str
) -> None:
    url, _ = fleet
    code, out, err = _pull(capsys, "--server", url, *flags, "--tp", "4")
    assert code != 0 and out == ""  # no coefficients for a typo
    assert len(err.strip().splitlines()) == 1
    assert f"unknown {wrong}" in err and f"did you mean {closest}" in err
    assert "H100" in err if wrong == "GPU" else "mixtral-8x7b-v0.1" in err  # the known ones


def test_gpu_names_are_case_insensitive(fleet: Fleet, capsys: Capsys) -> None:
    url, _ = fleet
    code, out, err = _pull(
        capsys, "--server", url, "--model", "llama-3.1-70b-instruct", "--hardware", "h100",
        "--tp", "4", "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    answer = orjson.loads(out)
    want = ServingConfig(model="llama-3.1-70b-instruct", gpu="H100", tp=4)
    assert answer["configuration"]["id"] == want.id


def test_model_hardware_tp_answers_the_learned_configuration(fleet: Fleet, capsys: Capsys) -> None:
    url, store = fleet
    args = ["--server", url, "--model", BUSY.model, "--hardware", "H100", "--tp", "1"]
    code, out, err = _pull(capsys, *args, "--format", "json")
    assert code == 0, err
    answer = orjson.loads(out)
    own = store.latest(BUSY.id)
    assert own is not None
    assert answer["source"] == "configuration" and answer["configuration"]["id"] == BUSY.id
    assert answer["beta"] == list(own.beta) and answer["version"] == own.version
    # which one, and how to pick the other
    assert f"configuration {BUSY.id}" in err
    assert QUIET.id in err and "--max-num-batched-tokens 4096" in err
    # the flag it names selects the other one
    code, out, _ = _pull(capsys, *args, "--max-num-batched-tokens", "4096", "--json")
    assert code == 0 and orjson.loads(out)["configuration"]["id"] == QUIET.id
    # one match: no list
    code, out, err = _pull(capsys, "--server", url, "--model", MIXTRAL.model, "--hardware", "H100")
    assert code == 0 and "learned configurations match" not in err
    assert f"configuration {MIXTRAL.id}" in err and out.startswith("--alpha-coeffs ")


def test_config_prefix_unknown_and_ambiguous(fleet: Fleet, capsys: Capsys) -> None:
    url, store = fleet
    code, out, err = _pull(capsys, "--server", url, "--config", BUSY.id[:4], "--json")
    assert code == 0, err
    assert orjson.loads(out)["configuration"]["id"] == BUSY.id
    code, out, err = _pull(capsys, "--server", url, "--config", "deadbeef0000")
    assert code == 1 and out == ""
    assert "unknown configuration 'deadbeef0000'" in err and "coeffd configurations" in err
    twin = "".join(BUSY.id[:4]) + "00000000"
    store.publish(make_snapshot(twin, 1))
    code, _, err = _pull(capsys, "--server", url, "--config", BUSY.id[:4])
    assert code == 2 and BUSY.id in err and twin in err


def test_snapshot_dir_works_offline(fleet: Fleet, capsys: Capsys) -> None:
    _, store = fleet
    where = str(store.directory)
    code, out, err = _pull(capsys, "--snapshot-dir", where, "--config", MIXTRAL.id[:5])
    assert code == 0, err
    assert out.startswith("--alpha-coeffs ")
    code, out, err = _pull(
        capsys, "--snapshot-dir", where, "--model", BUSY.model, "--hardware", "H100", "--json"
    )
    assert code == 0, err
    assert orjson.loads(out)["configuration"]["id"] == BUSY.id


def test_coeffd_server_env_and_json_spellings(
    fleet: Fleet, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = fleet
    monkeypatch.setenv("COEFFD_SERVER", url)
    code, out, err = _pull(capsys, "--config", MIXTRAL.id, "--json")
    assert code == 0, err
    assert orjson.loads(out)["configuration"]["id"] == MIXTRAL.id
    parser = configurations.argparse.ArgumentParser()
    configurations.add_parser(parser.add_subparsers())
    args = parser.parse_args(["configurations", "--format", "json"])
    assert configurations.run(args) == 0
    rows = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["id"] for r in rows} == {BUSY.id, QUIET.id, MIXTRAL.id}


def test_unknown_option_prints_the_commands_usage(capsys: Capsys) -> None:
    from coeffd.daemon import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["pull", "--cfg", "X"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("usage: coeffd pull ") and "unrecognized arguments: --cfg X" in err


# ----------------------------------------------------------------- defaults.yaml


def _defaults_copy(tmp_path: Path, extra: str = "") -> Path:
    """The fixture, with ``extra`` under every ``defaults`` entry (as an older BLIS had)."""
    text = BLIS_DEFAULTS.read_text()
    if extra:
        text = re.sub(r"(\n    GPU: \S+)", lambda m: f"{m.group(1)}\n    {extra}", text)
    target = tmp_path / "defaults.yaml"
    target.write_text(text)
    return target


def test_a_configurations_write_says_whose_and_what_is_still_prior(
    fleet: Fleet, capsys: Capsys, tmp_path: Path
) -> None:
    url, store = fleet
    snap = msgspec.structs.replace(
        learned(MIXTRAL, 3000, version=5),
        identification={
            "T_pf_compute": "data",
            "T_weight": "prior",
            "L": "prior",
            "one": "data+prior",
        },
        observations={"beta": 3000, "finished_to_departed": 400, "output_token": 400},
    )
    store.publish(snap)
    target = _defaults_copy(tmp_path)
    code, _, err = _pull(capsys, "--server", url, "--config", MIXTRAL.id, "--defaults", str(target))
    assert code == 0, err
    lines = target.read_text().splitlines()
    above = lines[lines.index("trained_physics_coefficients:") - 1]
    assert above.startswith("# coeffd ") and f"configuration {MIXTRAL.id}" in above
    assert "version 5" in above and "still at their prior: alpha0 and 2 of 11 beta" in above
    assert validate_defaults_yaml(target) == (list(snap.alpha), list(snap.beta))
    warning = next(ln for ln in err.splitlines() if "warning" in ln)
    assert "alpha[0] (queueing_time)" in warning and "T_weight, L" in warning
    assert "identify_with" in warning


def test_defaults_of_another_blis_and_non_blis_yaml_say_what_to_do(
    fleet: Fleet, capsys: Capsys, tmp_path: Path
) -> None:
    url, _ = fleet
    target = _defaults_copy(tmp_path, "vllm_version: v0.8.5")
    before = target.read_bytes()
    code, out, err = _pull(
        capsys, "--server", url, "--config", MIXTRAL.id, "--defaults", str(target)
    )
    assert code == 1 and out == "" and target.read_bytes() == before
    assert len(err.splitlines()) == 1 and len(err) < 600
    assert err.count("vllm_version") == 1
    assert "fields this coeffd does not know (vllm_version, 3 entries)" in err
    assert "--format blis-args" in err  # what to do instead
    other = tmp_path / "other.yaml"
    other.write_text("foo: 1\nbar: [2, 3]\n")
    code, _, err = _pull(capsys, "--server", url, "--config", MIXTRAL.id, "--defaults", str(other))
    assert code == 1 and "not a BLIS defaults.yaml" in err and "top-level keys (foo, bar)" in err
