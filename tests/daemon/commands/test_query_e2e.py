"""The query tier end to end: three ``coeffd serve`` sidecars fed by simfleet over OTLP
(two of one configuration, one of another) and one ``coeffd serve --mode query``.

* the query lists exactly the two configurations (and the fleet vector);
* the shared one is the exact information-form merge of its two members' statistics
  (as each sidecar serves them), to 1e-9 relative, with learners at forgetting 1;
* its step-time error against simfleet's noiseless truth is no worse than either
  sidecar's own vector;
* ``coeffd configurations`` and ``coeffd pull`` work unchanged against it;
* a killed sidecar's configuration is still served, marked stale; a restarted query tier
  keeps it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from serve_support import ROOT, Daemon, start_daemon, wait_quiet

from coeffd.learners.config import LearnersConfig
from coeffd.learners.features.config import BasisResolver, ServingConfig
from coeffd.learners.merge import merge_set_states
from coeffd.learners.registry import LearnerRegistry
from coeffd.simfleet import RunResult, SampleRates, run
from coeffd.simfleet.scenarios import fleet_shared_engine, steady

pytestmark = pytest.mark.slow

#: Learners whose statistics add exactly (no forgetting; forgetting 1 is what makes the
#: merge equal one learner fed both streams, tests/learners/test_merge.py).
EXACT = (
    "learners.forgetting=1.0",
    "learners.steady_forgetting=1.0",
    "learners.drift.enabled=false",
    "query.statistics_interval_seconds=0.5",
)
LLAMA = ("--model-config", "llama-3.1-8b-instruct", "--hardware", "H100", "--tp", "1")
QWEN = ("--model-config", "qwen2.5-7b-instruct", "--hardware", "H100", "--tp", "1")
SECONDS = 25.0


def _sets(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


def _sidecar(tmp: Path, name: str, config: tuple[str, ...]) -> Daemon:
    # joiner.window_s=5: a source's last window is finished on the receiver's clock once
    # it falls idle, so wait_quiet waits that long after the feed (30 s at the default);
    # the merge is exact whatever the joins, and simfleet's processes export within 1 s.
    return start_daemon(
        tmp / name, "--mode", "sidecar", *config, *_sets(*EXACT, "joiner.window_s=5")
    )


def _started(*starts: Any) -> list[Daemon]:
    """Start daemons concurrently (each start is mostly the child's imports)."""
    with ThreadPoolExecutor(len(starts)) as pool:
        return list(pool.map(lambda start: start(), starts))


def _feed(d: Daemon, engines: Any, seed: int, out: dict[str, RunResult], key: str) -> None:
    out[key] = run(
        engines,
        SECONDS,
        seed,
        rates=SampleRates(1.0, 1.0, 0.0, 100),
        otlp_endpoint=f"127.0.0.1:{d.ports['otlp_grpc']}",
        max_events=100_000,
        record_steps=True,
        drain_s=5.0,
    )


def _query(tmp: Path, peers: list[Daemon]) -> Daemon:
    urls = ",".join(p.url("") for p in peers)
    return start_daemon(
        tmp / "query",
        "--mode", "query", "--peers", urls,
        *_sets(*EXACT, "query.refresh_interval_seconds=0.5", "query.peer_ttl_seconds=600"),
    )  # fmt: skip


def _json(d: Daemon, path: str) -> Any:
    status, body = d.get(path)
    assert status == 200, (path, status, body[:300])
    return json.loads(body)


def _wait(pred: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError("condition not met in time")


def _maybe_json(d: Daemon, path: str) -> Any:
    status, body = d.get(path)
    return json.loads(body) if status == 200 else None


def _step_error(beta: Any, runs: list[RunResult], cfg: ServingConfig) -> float:
    """Mean relative error of ``beta`` against the noiseless true step times of the last
    steps of every engine in ``runs``."""
    basis = BasisResolver().basis(cfg)
    steps = [s for res in runs for eng in res.engines for s in eng.steps[-1500:] if s.blis]
    x = np.array([basis.terms(s.blis) for s in steps])
    truth = np.array([s.truth_us for s in steps])
    return float(np.mean(np.abs(x @ np.asarray(beta) - truth) / truth))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("query")
    a, b, c = _started(
        *(partial(_sidecar, tmp, n, cfg) for n, cfg in (("a", LLAMA), ("b", LLAMA), ("c", QWEN)))
    )
    runs: dict[str, RunResult] = {}
    feeds = [
        threading.Thread(target=_feed, args=(a, steady(SECONDS), 1, runs, "a")),
        threading.Thread(target=_feed, args=(b, steady(SECONDS), 2, runs, "b")),
        threading.Thread(
            target=_feed,
            args=(
                c,
                [fleet_shared_engine("q", "qwen2.5-7b-instruct", "H100", 1, 6.0)],
                3,
                runs,
                "c",
            ),
        ),
    ]
    for t in feeds:
        t.start()
    for t in feeds:
        t.join()
    for d in (a, b, c):
        wait_quiet(d)
    q = _query(tmp, [a, b, c])
    yield {"tmp": tmp, "a": a, "b": b, "c": c, "q": q, "runs": runs}
    for d in (q, a, b, c):
        if d.proc.poll() is None:
            d.stop()


def test_query_lists_the_configurations_and_merges_the_shared_one_exactly(fleet: Any) -> None:
    a, b, c, q = fleet["a"], fleet["b"], fleet["c"], fleet["q"]
    llama = ServingConfig.from_dict({"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": 1})
    own = {k: _json(d, "/v1/statistics") for k, d in (("a", a), ("b", b), ("c", c))}
    shared = [cid for cid in own["a"]["configurations"] if cid in own["b"]["configurations"]]
    assert len(shared) == 1
    cid = shared[0]
    (other,) = own["c"]["configurations"]
    states = [own[k]["configurations"][cid]["set"] for k in ("a", "b")]
    # the exact merge of what the two sidecars serve, estimated as any instance would
    reference = LearnerRegistry(LearnersConfig(forgetting=1.0, steady_forgetting=1.0))  # type: ignore[call-arg]
    reference.load_state({"sets": {cid: merge_set_states(states)}})
    expected = reference.estimate(cid)
    merged_obs = expected.vectors["beta"].observations
    assert merged_obs == sum(s["learners"]["beta_steady"]["n_learned"] for s in states)

    def caught_up() -> Any:
        snap = _maybe_json(q, f"/v1/coefficients/{cid}")
        return snap if snap and snap["observations"].get("beta") == merged_obs else None

    snap = _wait(caught_up)
    listed = _wait(
        lambda: (
            {e["id"] for e in _json(q, "/v1/configurations")["configurations"]} >= {"fleet"}
            and _json(q, "/v1/configurations")["configurations"]
        )
    )
    assert {e["id"] for e in listed} == {cid, other, "fleet"}
    assert snap["instance_count"] == 2 and not any(i["stale"] for i in snap["instances"])
    np.testing.assert_allclose(snap["beta"], expected.beta, rtol=1e-9)
    np.testing.assert_allclose(snap["alpha"], expected.alpha, rtol=1e-9)
    # and it predicts the true step time no worse than either sidecar's own statistics
    # (estimated the same way: a sidecar's published snapshot may be an older version)
    runs = [fleet["runs"]["a"], fleet["runs"]["b"]]
    errors = {"query": _step_error(snap["beta"], runs, llama)}
    for k, state in zip(("a", "b"), states, strict=True):
        alone = LearnerRegistry(LearnersConfig(forgetting=1.0, steady_forgetting=1.0))  # type: ignore[call-arg]
        alone.load_state({"sets": {cid: state}})
        errors[k] = _step_error(alone.estimate(cid).beta, runs, llama)
    assert errors["query"] <= max(errors["a"], errors["b"]), errors


def test_cli_answers_through_the_query_tier(fleet: Any) -> None:
    q = fleet["q"]
    cmd = [sys.executable, "-m", "coeffd"]
    listed = subprocess.run(
        [*cmd, "configurations", "--server", q.url("")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "llama-3.1-8b-instruct" in listed.stdout and "qwen2.5-7b-instruct" in listed.stdout
    pulled = subprocess.run(
        [*cmd, "pull", "--server", q.url(""), "--model", "llama-3.1-70b-instruct",
         "--hardware", "H100", "--tp", "4", "--format", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr
    answer = json.loads(pulled.stdout)
    assert len(answer["beta"]) == 11 and answer["source"] != "configuration"


def test_a_killed_sidecar_stays_stale_and_survives_a_query_restart(fleet: Any) -> None:
    tmp, a, b, c, q = (fleet[k] for k in ("tmp", "a", "b", "c", "q"))
    (other,) = _json(c, "/v1/statistics")["configurations"]
    _wait(lambda: _maybe_json(q, f"/v1/coefficients/{other}"))  # the query has seen it
    c.stop()

    def stale() -> Any:
        snap = _maybe_json(q, f"/v1/coefficients/{other}")
        return snap if snap and snap["instances"][0]["stale"] else None

    snap = _wait(stale)
    assert snap["instance_count"] == 1 and len(snap["beta"]) == 11
    scraped = q.scrape()
    assert scraped[("coeffd_query_peers", (("state", "stale"),))] == 1
    assert scraped[("coeffd_query_peer_errors_total", (("reason", "unreachable"),))] >= 1
    q.stop()
    again = _query(tmp, [a, b, c])
    try:
        kept = _wait(lambda: _maybe_json(again, f"/v1/coefficients/{other}"))
        assert kept["instances"][0]["stale"] is True
        assert kept["beta"] == snap["beta"]
    finally:
        again.stop()
