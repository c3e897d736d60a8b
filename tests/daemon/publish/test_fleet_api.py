"""``/v1/predict`` and ``coeffd pull`` for the fleet: real HTTP server, real store, real
files, ``coeffd pull`` as a subprocess."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml as pyyaml
from publish_support import BLIS_DEFAULTS, make_snapshot
from publish_support import run_pull as _pull

from coeffd.base.http import HttpServer
from coeffd.daemon import api
from coeffd.daemon.fleet import FleetPublisher, fleet_snapshot
from coeffd.daemon.publish.defaults_schema import validate_defaults_yaml
from coeffd.daemon.publish.snapshot import validate_for_blis
from coeffd.daemon.publish.store import SnapshotStore
from coeffd.learners.features import BLIS_DEFAULT_BETA, MODELS, BlisBasis, load_hardware
from coeffd.learners.features.catalog import model_config
from coeffd.learners.features.config import ServingConfig
from coeffd.learners.fleet.error import ERROR_BASES
from coeffd.learners.fleet.members import MemberStats
from coeffd.learners.fleet.model import FleetModel
from coeffd.learners.fleet.results import FLEET_ID, LocoError
from coeffd.learners.registry import LearnerRegistry
from tests.support.synthetic_steps import synth_steps

KNOWN = [
    ServingConfig(model="llama-3.1-8b-instruct", gpu="H100", tp=1),
    ServingConfig(model="llama-3.1-8b-instruct", gpu="A100-80", tp=2),
    ServingConfig(model="mixtral-8x7b-v0.1", gpu="H100", tp=2),
    ServingConfig(model="qwen3-30b-a3b", gpu="A100-80", tp=1),
]
UNSEEN = ServingConfig(model="mixtral-8x7b-v0.1", gpu="A100-80", tp=4)
TRUE_BETA = np.array(BLIS_DEFAULT_BETA) * 0.8 + np.array([0, 0.3] + [0] * 6 + [0.5, 0, 0])


def _member(cfg: ServingConfig, seed: int) -> MemberStats:
    basis = BlisBasis(MODELS[cfg.model], load_hardware(cfg.gpu), cfg.tp)
    s = synth_steps(basis, TRUE_BETA, 300, sigma=0.02, seed=seed)
    w = 1.0 / s.y**2
    return MemberStats(
        key=cfg.id,
        description=cfg.to_dict(),
        beta_a=(s.x * w[:, None]).T @ s.x,
        beta_b=s.x.T @ (w * s.y),
        beta_n=300.0,
        rows_x=s.x,
        rows_y=s.y,
    )


@pytest.fixture
def fleet_server(tmp_path: Path) -> Iterator[tuple[str, SnapshotStore, FleetModel]]:
    store = SnapshotStore(tmp_path / "snaps")
    for cfg in KNOWN:
        store.publish(make_snapshot(cfg.id, 3))
    model = FleetModel([_member(c, i) for i, c in enumerate(KNOWN)])
    store.publish(fleet_snapshot(model.result(), 1))
    pub = FleetPublisher(LearnerRegistry())
    pub.model = model  # what refit() swaps in on the worker thread
    server = HttpServer("127.0.0.1", 0, name="test-api")
    api.mount(server.router, store, pub)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", store, model
    finally:
        server.stop()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _predict(url: str, **query: str) -> tuple[int, bytes]:
    return _get(f"{url}/v1/predict?{urllib.parse.urlencode(query)}")


def test_fleet_snapshot_is_served_and_listed_by_name(fleet_server) -> None:
    url, _, _ = fleet_server
    _, body = _get(f"{url}/v1/configurations")
    listed = {c["id"]: c for c in orjson.loads(body)["configurations"]}
    assert set(listed) == {c.id for c in KNOWN} | {FLEET_ID}
    assert listed[FLEET_ID]["labels"]["kind"] == "fleet"
    status, body = _get(f"{url}/v1/coefficients/{FLEET_ID}")
    assert status == 200 and orjson.loads(body)["loco"]["mean"]["fleet"]["mape"] > 0


def test_predict_known_configuration_is_its_own_snapshot(fleet_server) -> None:
    url, store, _ = fleet_server
    cfg = KNOWN[2]
    status, body = _predict(url, model=cfg.model, gpu=cfg.gpu, tp=str(cfg.tp))
    assert status == 200
    answer = orjson.loads(body)
    snap = store.latest(cfg.id)
    assert snap is not None
    assert answer["source"] == "configuration" and answer["configuration"]["id"] == cfg.id
    assert tuple(answer["beta"]) == snap.beta and tuple(answer["alpha"]) == snap.alpha
    assert answer["expected_error"] == pytest.approx(0.05) and answer["version"] == 3


def test_predict_unseen_configuration_from_the_fleet(fleet_server) -> None:
    url, _, model = fleet_server
    status, body = _predict(
        url, **{"coeffd.model": UNSEEN.model, "gpu": UNSEEN.gpu, "tp": str(UNSEEN.tp)}
    )
    assert status == 200
    answer = orjson.loads(body)
    assert answer["configuration"]["id"] == UNSEEN.id
    p = model.predict(UNSEEN.to_dict())
    assert answer["source"] == p.source
    validate_for_blis(answer["alpha"], answer["beta"])
    assert isinstance(answer["expected_error"], float) and answer["expected_error"] < 0.05
    assert answer["error_basis"] == ERROR_BASES[p.error_basis]
    # only the factor model says how much of its error is noise and how much doubt
    assert ("error_parts" in answer) == (p.error_basis == "model")
    assert answer["version"] == 1 and set(answer["similar"]) <= {c.id for c in KNOWN}
    # the same vectors in the BLIS formats
    _, flags = _predict(url, model=UNSEEN.model, gpu=UNSEEN.gpu, tp="4", format="flags")
    args = flags.decode().split()
    assert [float(v) for v in args[3].split(",")] == answer["beta"]
    _, yml = _predict(url, model=UNSEEN.model, gpu=UNSEEN.gpu, tp="4", format="yaml")
    text = yml.decode()
    assert text.startswith(f"# coeffd: {answer['source']} coefficients for mixtral-8x7b-v0.1")
    assert "expected step-time error" in text.splitlines()[0]
    block = pyyaml.safe_load(text)["trained_physics_coefficients"]
    assert block["beta_coeffs"] == answer["beta"]


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ({"model": "m", "gpu": "H100", "path": "/etc/passwd"}, "unknown key"),
        ({"model": "m", "gpu": "H100", "tp": "four"}, "tp"),
        ({"model": "m", "gpu": "H100", "tp": "0"}, "tp"),
        ({"gpu": "H100"}, "model"),
        ({"model": "x" * 300, "gpu": "H100"}, "too long"),
        ({"model": "m\x00", "gpu": "H100"}, "printable"),
        ({"model": "m", "gpu": "H100", "format": "xml"}, "format"),
    ],
)
def test_predict_bad_queries_are_400(fleet_server, query, fragment) -> None:
    url, _, _ = fleet_server
    status, body = _predict(url, **query)
    assert status == 400
    assert fragment in orjson.loads(body)["error"]["message"]


def test_predict_model_values_are_names_never_paths(fleet_server, tmp_path) -> None:
    url, _, _ = fleet_server
    # a config.json on the server's disk: the value is a name, so nothing reads it
    (tmp_path / "config.json").write_text(json.dumps(model_config("llama-3.1-8b-instruct")))
    status, body = _predict(url, model=str(tmp_path), gpu="H100", tp="1")
    # not a model name it knows (nor a name at all): refused, the file never read
    assert status == 400
    assert "unknown model" in orjson.loads(body)["error"]["message"]


# ------------------------------------------------------------------------------- pull


def _defaults(tmp_path: Path) -> Path:
    target = tmp_path / "defaults.yaml"
    shutil.copyfile(BLIS_DEFAULTS, target)
    return target


def test_pull_defaults_on_a_fleet_writes_the_fleet_vector(fleet_server, tmp_path) -> None:
    url, store, _ = fleet_server
    target = _defaults(tmp_path)
    proc = _pull("--server", url, "--defaults", str(target))
    assert proc.returncode == 0, proc.stderr
    fleet = store.latest(FLEET_ID)
    assert fleet is not None
    assert validate_defaults_yaml(target) == (list(fleet.alpha), list(fleet.beta))
    for cfg in KNOWN:  # never one configuration's vector
        assert list(store.latest(cfg.id).beta) != list(fleet.beta)  # type: ignore[union-attr]
    lines = target.read_text().splitlines()
    at = lines.index("trained_physics_coefficients:")
    comment = lines[at - 1]
    assert comment.startswith("# coeffd") and "fleet vector" in comment
    assert f"over {len(KNOWN)} configurations" in comment
    loco = fleet.loco["mean"]["fleet"].mape
    assert loco is not None and f"step-time error {100 * loco:.1f} %" in comment
    assert "leave-one-configuration-out" in comment and "T" in comment.split(", ")[-1]
    assert "the fleet vector" in proc.stdout

    # a second pull replaces our comment instead of stacking another
    proc = _pull("--server", url, "--defaults", str(target))
    assert proc.returncode == 0, proc.stderr
    assert sum("fleet vector" in ln for ln in target.read_text().splitlines()) == 1

    # --config names one: that configuration's vector, its own description
    cfg = KNOWN[0]
    proc = _pull("--server", url, "--config", cfg.id, "--defaults", str(target))
    assert proc.returncode == 0, proc.stderr
    snap = store.latest(cfg.id)
    assert snap is not None
    assert validate_defaults_yaml(target) == (list(snap.alpha), list(snap.beta))
    text = target.read_text()
    assert "fleet vector" not in text  # the comment follows the vector
    assert f"# coeffd {snap.coeffd_version}: configuration {cfg.id} (" in text
    assert text.startswith("# coeffd test fixture")  # others' comments stay


def test_pull_defaults_blis_args_on_a_fleet_guess_no_setup(fleet_server, tmp_path) -> None:
    # The fleet vector stands for every configuration: the argument list reads the file
    # but names no model, GPU or TP (it used to say --tp 1), and stderr names the flags.
    url, store, _ = fleet_server
    target = _defaults(tmp_path)
    proc = _pull("--server", url, "--defaults", str(target), "--format", "blis-args")
    assert proc.returncode == 0, proc.stderr
    fleet = store.latest(FLEET_ID)
    assert fleet is not None
    assert validate_defaults_yaml(target) == (list(fleet.alpha), list(fleet.beta))
    args = shlex.split(proc.stdout)
    assert args == [
        "--latency-model", "trained-physics", "--defaults-filepath", str(target.absolute())
    ]  # fmt: skip
    notes = [ln for ln in proc.stderr.splitlines() if ln.startswith("coeffd pull: note:")]
    assert len(notes) == 1 and "fleet vector" in notes[0], proc.stderr
    for flag in ("--model M", "--model-config-folder", "--hardware G", "--hardware-config",
                 "--tp N"):  # fmt: skip
        assert flag in notes[0]
    # pinned by --config: that configuration's own setup, nothing left to add
    proc = _pull("--server", url, "--config", KNOWN[1].id, "--format", "blis-args")
    assert proc.returncode == 0, proc.stderr
    args = shlex.split(proc.stdout)
    assert args[args.index("--hardware") + 1] == "H100" and args[args.index("--tp") + 1] == "1"
    assert "fleet vector" not in proc.stderr and "--tp N" not in proc.stderr


def test_pull_defaults_several_configurations_without_fleet_refuses(tmp_path) -> None:
    store = SnapshotStore(tmp_path / "snaps")
    store.publish(make_snapshot("cfg-a", 1))
    store.publish(make_snapshot("cfg-b", 1))
    server = HttpServer("127.0.0.1", 0, name="test-api")
    api.mount(server.router, store)
    server.start()
    try:
        target = _defaults(tmp_path)
        before = target.read_bytes()
        proc = _pull("--server", f"http://127.0.0.1:{server.port}", "--defaults", str(target))
        assert proc.returncode == 1 and "fleet" in proc.stderr
        assert target.read_bytes() == before
    finally:
        server.stop()


def test_pull_model_hardware_tp_writes_the_prediction(fleet_server, tmp_path) -> None:
    url, _, _ = fleet_server
    target = _defaults(tmp_path)
    args = ["--server", url, "--model", UNSEEN.model, "--hardware", UNSEEN.gpu, "--tp", "4"]
    proc = _pull(*args, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    answer = orjson.loads(proc.stdout)
    assert answer["configuration"]["id"] == UNSEEN.id and answer["source"] != "configuration"
    assert "expected step-time error" in proc.stderr
    proc = _pull(*args, "--defaults", str(target))
    assert proc.returncode == 0, proc.stderr
    assert validate_defaults_yaml(target) == (answer["alpha"], answer["beta"])
    text = target.read_text()
    assert f"# coeffd: {answer['source']} coefficients for mixtral-8x7b-v0.1/A100-80/4" in text
    proc = _pull(*args)  # flags by default
    assert proc.returncode == 0 and proc.stdout.startswith("--alpha-coeffs ")


def test_pull_model_config_json_sends_name_and_hash(fleet_server, tmp_path) -> None:
    url, _, _ = fleet_server
    folder = tmp_path / "mixtral-8x7b-v0.1"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(model_config("mixtral-8x7b-v0.1")))
    proc = _pull(
        "--server", url, "--model", str(folder / "config.json"), "--hardware", "A100-80",
        "--tp", "4", "--format", "json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    desc = orjson.loads(proc.stdout)["configuration"]["description"]
    assert desc["model_config_hash"] == MODELS["mixtral-8x7b-v0.1"].config_hash
    assert "/" not in desc["model"]


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "m"],  # no --hardware
        ["--hardware", "H100"],  # no --model
        ["--model", "m", "--hardware", "H100", "--config", "x"],
        ["--model", "m", "--hardware", "H100", "--set", "novalue"],
    ],
)
def test_pull_describe_usage_errors(args) -> None:
    from coeffd.daemon.commands import pull

    assert pull.main(["--server", "http://127.0.0.1:9", *args]) == 2


def test_pull_defaults_refuses_a_fleet_vector_worse_than_blis_defaults(tmp_path) -> None:
    # early in a demo: a fleet fitted on a few seconds of data, its LOCO error above the
    # defaults' on the same steps (the numbers a real fleet had after ~40 s)
    members = [_member(c, i) for i, c in enumerate(KNOWN)]
    fit = FleetModel(members).result()
    loco = {
        m.key: {"fleet": LocoError(0.175, 300), "blis_default": LocoError(0.082, 300)}
        for m in members
    }
    worse = dataclasses.replace(fit, loco=loco, summary={"fleet": 0.175, "blis_default": 0.082})
    store = SnapshotStore(tmp_path / "snaps")
    for cfg in KNOWN:
        store.publish(make_snapshot(cfg.id, 1))
    store.publish(fleet_snapshot(worse, 4))
    server = HttpServer("127.0.0.1", 0, name="test-api")
    api.mount(server.router, store)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        target = _defaults(tmp_path)
        before = target.read_bytes()
        for extra in ([], ["--dry-run"], ["--format", "blis-args"]):
            proc = _pull("--server", url, "--defaults", str(target), *extra)
            assert proc.returncode == 1, proc.stderr
            assert "17.5 %" in proc.stderr and "8.2 %" in proc.stderr  # both errors named
            assert "--force" in proc.stderr and "--config" in proc.stderr
            assert target.read_bytes() == before and proc.stdout == ""
        proc = _pull("--server", url, "--defaults", str(target), "--force")
        assert proc.returncode == 0, proc.stderr
        fleet = store.latest(FLEET_ID)
        assert fleet is not None
        assert validate_defaults_yaml(target) == (list(fleet.alpha), list(fleet.beta))
        text = target.read_text()
        assert "step-time error 17.5 % (BLIS defaults 8.2 %)" in text  # said in the file too
        # --force without --defaults is a usage error
        assert _pull("--server", url, "--force").returncode == 2
    finally:
        server.stop()
