"""The closed loop: judge published coefficients as a BLIS user will, in TTFT and E2E.

``python -m bench closedloop [--quick] [--scenario dense|moe] [--sync] [--duration 600]
[--seeds 1,2] [--replicas 4]``

For each seed, one serving configuration with simfleet's known true coefficients:

1. **Learn**: an in-process ``coeffd serve`` (:func:`daemon.assemble.build_app`,
   real OTLP/gRPC receiver, real HTTP API) is fed by simfleet over the wire for
   ``duration_s`` simulated seconds at the learning load, once per sampling
   (vLLM's default 1.0 / 0.01 / 0.001, and every step); the coefficients are then taken
   the way ``coeffd pull --format json`` takes them (same code, over HTTP).
2. **Serve**: simfleet's engine serves the same seeded workloads (same arrivals, same
   prompt and output lengths; :data:`REPLICAS` of them, pooled) at a low, a medium and a near-saturation load — a fraction of the
   configuration's capacity, measured in the same run — once with the true coefficients,
   once with each pulled vector and once with BLIS's shipped defaults. These runs are
   noise-free (no step noise, no stalls, no API-delay noise): BLIS simulates the mean
   physics, so any difference from the truth run is the coefficients' doing.
3. **Report**: mean / p50 / p99 TTFT (arrival → first response) and E2E
   (arrival → departure) of each run relative to the truth run, over the requests that
   arrived after a warm-up (10 % of the run) and finished in every run.

Targets (issue 15, every-step sampling, 600 simulated s): |mean|, |p99| TTFT and E2E
within 1 % of the truth below saturation. The default sampling rows are reported beside
them (issue 14 judges learning at default sampling with :func:`run`).

Library use::

    from bench.closedloop import run, DEFAULT_RATES, DENSE_RATES
    res = run(scenario="moe", sample_rates={"default": DEFAULT_RATES},
              async_scheduling=False, duration_s=300, seeds=(1, 2))
    res.worst("default", "mean_e2e", loads=("low", "medium"))  # worst |relative diff|
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from coeffd.learners.evaluation import regime_error
from coeffd.simfleet import (
    BLIS_ALPHA,
    BLIS_BETA,
    Coefficients,
    CoefficientSchedule,
    EngineSpec,
    Noise,
    SampleRates,
    ServingSetup,
    Workload,
)
from coeffd.simfleet import (
    run as simulate,
)
from coeffd.simfleet.run import config_id, resource_attributes
from coeffd.simfleet.scenarios import true_coefficients

FloatArray = npt.NDArray[np.float64]

DEFAULT_RATES = SampleRates(1.0, 0.01, 0.001, 100)  # vLLM's defaults (spec §3)
DENSE_RATES = SampleRates(1.0, 1.0, 0.001, 100)  # every step summarized
NOISELESS = Noise(sigma=0.0, stall_rate=0.0, stall_us=0.0, alpha_sigma=0.0, kv_sigma=0.0)
#: serving loads as fractions of the configuration's measured capacity
LOADS: dict[str, float] = {"low": 0.3, "medium": 0.6, "near_saturation": 0.85}
METRICS: tuple[str, ...] = ("mean_ttft", "p50_ttft", "p99_ttft", "mean_e2e", "p50_e2e", "p99_e2e")
TARGET = 0.01  # |relative difference| below saturation, every-step sampling
#: The resolution runs scale the true β by 1 ± this: a metric that moves more than
#: TARGET for it cannot be judged at TARGET (see :data:`REPLICAS`).
RESOLUTION = 0.001
#: the factors of the two resolution runs (the truth slower, then faster)
RESOLUTION_FACTORS: tuple[float, float] = (1 + RESOLUTION, 1 - RESOLUTION)
#: Serving workloads (seeds) pooled per load: with one, p99 TTFT over its few thousand
#: requests moved −2.6…+1.2 % for the truth 0.1 % off (the batching shifts); four pooled
#: moved it ≤ 0.8 % (seeds 1-2, 30 % and 60 % load), means and E2E ≤ 0.2 %
REPLICAS = 4
REPLICA_KEY_STRIDE = 1 << 32  # a pooled request's key: replica · stride + arrival index


def resolution_name(factor: float) -> str:
    """The run name of the truth scaled by ``factor`` (e.g. ``truth×1.001``)."""
    return f"truth×{factor:.3f}"


#: Configurations the closed loop knows: (serving, workload of the learning run).
CONFIGURATIONS: dict[str, ServingSetup] = {
    "dense": ServingSetup(model="llama-3.1-8b-instruct", gpu="H100", tp=1),
    "moe": ServingSetup(model="mixtral-8x7b-v0.1", gpu="H100", tp=2),
}


@dataclass(frozen=True)
class Latency:
    """TTFT and E2E statistics of one serving run, µs, over the matched requests."""

    requests: int
    mean_ttft: float
    p50_ttft: float
    p99_ttft: float
    mean_e2e: float
    p50_e2e: float
    p99_e2e: float

    def relative_to(self, truth: Latency) -> dict[str, float]:
        """(this − truth) / truth for every statistic."""
        return {m: getattr(self, m) / getattr(truth, m) - 1.0 for m in METRICS}


@dataclass(frozen=True)
class Pulled:
    """The vector one learning run published, as ``coeffd pull`` returned it."""

    alpha: tuple[float, ...]
    beta: tuple[float, ...]
    version: int
    observations: int
    unidentified: tuple[str, ...]
    learn_wall_s: float
    snapshot: dict[str, Any] = field(default_factory=dict, repr=False)
    #: (version, wall_ns, alpha, beta) of every version still retained, oldest first
    history: list[tuple[int, int, tuple[float, ...], tuple[float, ...]]] = field(
        default_factory=list, repr=False
    )

    @property
    def estimated_std(self) -> dict[str, float]:
        """The daemon's own estimate of its error per regime (snapshot)."""
        return dict(self.snapshot.get("step_time_rel_std") or {})

    def steady_versions(self) -> list[tuple[int, int, tuple[float, ...], tuple[float, ...]]]:
        """Versions published in the second half of the learning run (wall clock)."""
        if not self.history:
            return []
        mid = (self.history[0][1] + self.history[-1][1]) / 2
        return [h for h in self.history if h[1] >= mid]


@dataclass
class LoadResult:
    """One serving load: the truth run and each other run relative to it."""

    load: str
    fraction: float
    rate_per_s: float
    truth: Latency
    runs: dict[str, Latency]  # "blis_default" and one per sampling name

    @property
    def diffs(self) -> dict[str, dict[str, float]]:
        return {name: lat.relative_to(self.truth) for name, lat in self.runs.items()}


@dataclass
class VersionChange:
    """How much published versions moved in steady state (second half of learning)."""

    versions: int  # published in the second half
    distinct: int  # of which with numbers of their own (the rest are heartbeats)
    max_step_time_change: float  # consecutive versions, fixed regime batches
    e2e_change: float  # closed loop mean E2E, first vs last of them, medium load


@dataclass
class SeedResult:
    seed: int
    capacity_per_s: float
    truth: Coefficients
    pulled: dict[str, Pulled]
    loads: list[LoadResult]
    #: sampling name → regime → |predicted − true| / true step time (noiseless truth)
    regime_error: dict[str, dict[str, float]] = field(default_factory=dict)
    versions: dict[str, VersionChange] = field(default_factory=dict)


@dataclass
class ClosedLoopResult:
    """Everything :func:`run` measured; :meth:`worst` condenses it for targets."""

    scenario: str
    async_scheduling: bool
    duration_s: float
    serve_duration_s: float
    seeds: list[SeedResult]

    def diff(self, seed: int, load: str, run_name: str, metric: str) -> float:
        for s in self.seeds:
            if s.seed == seed:
                for lr in s.loads:
                    if lr.load == load:
                        return lr.diffs[run_name][metric]
        raise KeyError((seed, load))

    def worst(self, run_name: str, metric: str, loads: Sequence[str] = ("low", "medium")) -> float:
        """Largest |relative difference| of ``metric`` over seeds and ``loads``."""
        vals = [
            abs(lr.diffs[run_name][metric])
            for s in self.seeds
            for lr in s.loads
            if lr.load in loads and run_name in lr.runs
        ]
        return max(vals) if vals else math.nan


# ---------------------------------------------------------------------------- serving


def engine_spec(
    scenario: str, async_scheduling: bool = True, rate_per_s: float = 6.0
) -> EngineSpec:
    """The configuration's engine with its true coefficients (simfleet's recipe)."""
    try:
        sc = CONFIGURATIONS[scenario]
    except KeyError:
        raise ValueError(
            f"unknown closed-loop scenario {scenario!r}; known: {', '.join(CONFIGURATIONS)}"
        ) from None
    sc = replace(sc, async_scheduling=async_scheduling)
    key = f"closedloop/{sc.model}/{sc.gpu}/tp{sc.tp}"
    return EngineSpec(
        f"closedloop-{scenario}",
        sc,
        CoefficientSchedule((true_coefficients(key),)),
        Workload(rate_per_s=rate_per_s, profile="mixed"),
    )


def with_coefficients(
    spec: EngineSpec, alpha: Sequence[float], beta: Sequence[float], rate_per_s: float
) -> EngineSpec:
    """``spec`` serving at ``rate_per_s``, noise-free, with these α/β (KV transfer
    physics stays the truth's: BLIS does not model it)."""
    t = spec.truth.points[0]
    c = Coefficients(
        0.0, (alpha[0], alpha[1], alpha[2]), tuple(beta), t.kv_base_us, t.kv_bytes_per_us
    )
    return replace(
        spec,
        truth=CoefficientSchedule((c,)),
        noise=NOISELESS,
        workload=replace(spec.workload, rate_per_s=rate_per_s),
    )


def serve(spec: EngineSpec, duration_s: float, seed: int) -> dict[int, tuple[int, int, int]]:
    """Serve ``spec``'s workload; arrival index → (arrival, first response, departure) ns.

    Arrivals stop at ``duration_s``; the engine then drains for up to ``duration_s`` more
    so a slow coefficient set still finishes the same requests."""
    return _latencies(_served(spec, duration_s, seed, record_steps=False))


def serve_steps(
    spec: EngineSpec, duration_s: float, seed: int
) -> tuple[dict[int, tuple[int, int, int]], FloatArray, FloatArray]:
    """:func:`serve`, plus the BLIS terms and start times (ns) of every step it ran: the
    batches a closed loop's latencies are made of, to say which coefficients moved them."""
    from coeffd.learners.features.basis import batch_stats

    eng = _served(spec, duration_s, seed, record_steps=True)
    steps = [s for s in eng.steps or [] if s.blis]
    stats = np.array([batch_stats(s.blis) for s in steps]).reshape(-1, 6)
    starts = np.array([s.start_ns for s in steps], dtype=np.float64)
    return _latencies(eng), _basis(spec).terms_many(stats), starts


def _served(spec: EngineSpec, duration_s: float, seed: int, record_steps: bool) -> Any:
    """The one engine of a serving run (arrivals stop at ``duration_s``, then up to as
    long again to drain), with its latencies and, if asked, its step records."""
    res = simulate([spec], duration_s, seed, telemetry=False, drain_s=duration_s,
                   record_latencies=True, record_steps=record_steps)  # fmt: skip
    return res.engines[0]


def _latencies(eng: Any) -> dict[int, tuple[int, int, int]]:
    return {i: (a, f, d) for i, a, f, d in eng.latencies or []}


def _basis(spec: EngineSpec) -> Any:
    """The BLIS basis of ``spec``'s deployment, as simfleet's physics builds it."""
    from coeffd.learners.features import BlisBasis, load_hardware, load_model

    sc = spec.serving
    return BlisBasis(load_model(sc.model), load_hardware(sc.gpu), sc.tp, sc.dp, sc.moe_comm_backend)


def serve_pooled(
    spec: EngineSpec, duration_s: float, seed: int, replicas: int = REPLICAS
) -> dict[int, tuple[int, int, int]]:
    """:func:`serve` ``replicas`` workloads (seeds ``seed``, ``seed + 1000``, …) and pool
    their requests after each one's warm-up (the first tenth of ``duration_s``)."""
    out: dict[int, tuple[int, int, int]] = {}
    for k in range(replicas):
        runs = serve(spec, duration_s, seed + 1000 * k)
        if not runs:
            continue
        warm = min(v[0] for v in runs.values()) + 0.1 * duration_s * 1e9
        out.update({k * REPLICA_KEY_STRIDE + i: v for i, v in runs.items() if v[0] >= warm})
    return out


def latency(runs: dict[int, tuple[int, int, int]], keys: Sequence[int]) -> Latency:
    """Statistics over the requests ``keys`` (µs)."""
    a = np.array([runs[k] for k in keys], dtype=np.float64)
    ttft = (a[:, 1] - a[:, 0]) / 1e3
    e2e = (a[:, 2] - a[:, 0]) / 1e3
    return Latency(
        requests=len(keys),
        mean_ttft=float(ttft.mean()),
        p50_ttft=float(np.percentile(ttft, 50)),
        p99_ttft=float(np.percentile(ttft, 99)),
        mean_e2e=float(e2e.mean()),
        p50_e2e=float(np.percentile(e2e, 50)),
        p99_e2e=float(np.percentile(e2e, 99)),
    )


def capacity(spec: EngineSpec, seed: int, seconds: float = 90.0) -> float:
    """Requests/s the engine completes with the true coefficients when always loaded
    (arrivals far above what it can serve), after a warm-up of a third of the run."""
    over = with_coefficients(spec, spec.truth.points[0].alpha, spec.truth.points[0].beta, 200.0)
    res = simulate([over], seconds, seed, telemetry=False, drain_s=0.0, record_latencies=True)
    t0 = min(a for _, a, _, _ in res.engines[0].latencies or [(0, 0, 0, 0)])
    warm = t0 + seconds / 3 * 1e9
    done = [d for _, _, _, d in res.engines[0].latencies or [] if d >= warm]
    return len(done) / (seconds * 2 / 3)


# ---------------------------------------------------------------------------- learning


def learn(
    spec: EngineSpec,
    rates: SampleRates,
    duration_s: float,
    seed: int,
    overrides: Mapping[str, Any] | None = None,
) -> Pulled:
    """Feed an in-process ``coeffd serve`` from simfleet over OTLP/gRPC; pull what it
    published over HTTP with ``coeffd pull``'s own code.

    Simulated time runs faster than real time, so the daemon runs on the data's own
    clock (``live=False``, as for replays); load shedding and engine sampling are off so
    the figures measure learning, not the machine's speed. ``overrides``: extra settings
    (nested dict, as ``--set`` builds them).
    """
    import orjson

    from coeffd.daemon.assemble import build_app
    from coeffd.daemon.commands.pull import pull
    from coeffd.daemon.publish.snapshot import decode_snapshot
    from coeffd.daemon.settings import load_settings

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="coeffd-closedloop-") as tmp:
        base: dict[str, Any] = {
            "log": {"level": "warning"},
            "http": {"endpoint": "127.0.0.1:0"},
            "receivers": {
                "otlp_grpc": {"endpoint": "127.0.0.1:0"},
                "otlp_http": {"enabled": False},
            },
            "pipeline": {
                "shed_learning": False,
                "sample_engines": False,
                "tick_interval_seconds": 0.2,
            },
            "publish": {"snapshot_dir": str(Path(tmp) / "snapshots")},
            "state": {"state_dir": ""},
        }
        settings = load_settings(overrides=_merge(base, dict(overrides or {})), environ={})
        app = build_app(settings, live=False)
        app.start()
        try:
            simulate(
                [spec], duration_s, seed, rates=rates,
                otlp_endpoint=f"127.0.0.1:{app.grpc_port}", drain_s=5.0,
            )  # fmt: skip
            server = f"http://127.0.0.1:{app.http_port}"
            cid = config_id(resource_attributes(spec, "engine_core", 0))
            body = _settled_pull(app, server, cid, pull)
            snap = decode_snapshot(body)
            history = []
            for v in range(1, snap.version + 1):
                try:
                    text = pull(_pull_args(server, cid, v))
                except Exception:  # pruned (publish.retention)
                    continue
                h = decode_snapshot(text.encode())
                history.append((h.version, h.wall_ns, tuple(h.alpha), tuple(h.beta)))
        finally:
            app.stop()
    doc = orjson.loads(body)
    return Pulled(
        alpha=tuple(snap.alpha),
        beta=tuple(snap.beta),
        version=snap.version,
        observations=int(snap.observations.get("beta", 0)),
        unidentified=tuple(snap.unidentified),
        learn_wall_s=time.perf_counter() - t0,
        snapshot=doc,
        history=history,
    )


def _pull_args(server: str, config: str, version: int | None = None) -> argparse.Namespace:
    """What ``coeffd pull --server S --config C [--version V] --format json`` parses to."""
    return argparse.Namespace(
        server=server, config=config, version=version, format="json", defaults=None, timeout=30.0
    )


def _settled_pull(app: Any, server: str, cid: str, pull: Any) -> bytes:
    """Wait until the daemon has learned what it received and published it, then pull."""
    app.pipeline.wait_idle(600.0)
    args = _pull_args(server, cid)
    last, stable_since = "", time.monotonic()
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        try:
            text: str = pull(args)
        except Exception:  # nothing published yet
            text = ""
        if text != last:
            last, stable_since = text, time.monotonic()
        elif (
            text
            and time.monotonic() - stable_since >= 5 * app.settings.pipeline.tick_interval_seconds
        ):
            return text.encode()
        time.sleep(app.settings.pipeline.tick_interval_seconds)
    if not last:
        raise RuntimeError("the daemon published nothing")
    return last.encode()


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ---------------------------------------------------------------------------- the loop


def run(
    scenario: str = "dense",
    sample_rates: Mapping[str, SampleRates] | None = None,
    async_scheduling: bool = True,
    duration_s: float = 600.0,
    seeds: Sequence[int] = (1,),
    loads: Mapping[str, float] | None = None,
    learn_load: float = 0.3,
    serve_duration_s: float | None = None,
    settings: Mapping[str, Any] | None = None,
    log: Any = None,
    resolution: bool = False,
    replicas: int = REPLICAS,
    capacity_s: float = 90.0,
) -> ClosedLoopResult:
    """Learn at each sampling, then serve each load with truth / pulled / BLIS defaults.

    ``sample_rates``: name → simfleet sample rates (default: ``default`` and ``dense``).
    ``learn_load``: the learning run's load, as a fraction of capacity. ``settings``:
    daemon settings overrides for the learning runs (nested dict). ``log``: a callable
    taking one line (progress), e.g. ``print``. ``resolution``: also serve with the true
    β scaled by 1 ± :data:`RESOLUTION` (runs named by :func:`resolution_name`).
    ``replicas``: serving workloads pooled per load (:func:`serve_pooled`).
    ``capacity_s``: simulated seconds of :func:`capacity`, which sets the loads (30 s
    gave 17.8-20.4 req/s where 90 s gave 19.0-20.7 over seeds 1-5 of the dense engine, at
    a third of the CPU).
    """
    rates = dict(sample_rates or {"default": DEFAULT_RATES, "dense": DENSE_RATES})
    load_map = dict(loads or LOADS)
    serve_s = serve_duration_s or duration_s
    say = log or (lambda _line: None)
    out: list[SeedResult] = []
    base = engine_spec(scenario, async_scheduling)
    for seed in seeds:
        cap = capacity(base, seed, capacity_s)
        say(f"  seed {seed}: capacity {cap:.2f} req/s with the true coefficients")
        learn_spec = replace(base, workload=replace(base.workload, rate_per_s=learn_load * cap))
        pulled: dict[str, Pulled] = {}
        for name, r in rates.items():
            p = learn(learn_spec, r, duration_s, seed, settings)
            pulled[name] = p
            say(
                f"    learned at {name} sampling ({r.journey}/{r.step}/{r.rich}): v{p.version}, "
                f"{p.observations} step observations, {p.learn_wall_s:.0f} s wall; "
                f"unidentified {list(p.unidentified)}"
            )
        truth = base.truth.points[0]
        vectors: dict[str, tuple[Sequence[float], Sequence[float]]] = {
            "blis_default": (BLIS_ALPHA, BLIS_BETA),
            **{name: (p.alpha, p.beta) for name, p in pulled.items()},
        }
        if resolution:
            # the truth itself 0.1 % off: how far a metric moves for an error no learner
            # can avoid (a p99 over a few thousand requests jumps with the batching)
            for f in RESOLUTION_FACTORS:
                vectors[resolution_name(f)] = (truth.alpha, tuple(b * f for b in truth.beta))
        load_results = []
        for load, frac in load_map.items():
            rate = frac * cap
            # the serving seed differs from the learning seed: a workload the daemon never saw
            sseed = seed + 10_000
            t_spec = with_coefficients(base, truth.alpha, truth.beta, rate)
            t_runs = serve_pooled(t_spec, serve_s, sseed, replicas)
            others = {
                name: serve_pooled(with_coefficients(base, a, b, rate), serve_s, sseed, replicas)
                for name, (a, b) in vectors.items()
            }
            keys = sorted(k for k in t_runs if all(k in o for o in others.values()))
            lr = LoadResult(
                load,
                frac,
                rate,
                latency(t_runs, keys),
                {name: latency(o, keys) for name, o in others.items()},
            )
            load_results.append(lr)
            say(_load_line(lr))
        sr = SeedResult(seed, cap, truth, pulled, load_results)
        terms = regime_terms(base)
        mix = np.vstack(list(terms.values()))
        medium = sorted(load_map.values())[len(load_map) // 2] * cap
        for name, p in pulled.items():
            sr.regime_error[name] = regime_error(terms, p.beta, truth.beta)
            sr.versions[name] = _version_change(base, p, mix, medium, serve_s, seed + 10_000)
            say(_quality_line(name, sr.regime_error[name], p, sr.versions[name], truth.alpha))
        out.append(sr)
    return ClosedLoopResult(scenario, async_scheduling, duration_s, serve_s, out)


def regime_terms(spec: EngineSpec) -> dict[str, Any]:
    """BLIS terms of the fixed per-regime batches for ``spec``'s configuration."""
    from coeffd.learners.evaluation import regime_batches

    sc = spec.serving
    basis = _basis(spec)
    batches = regime_batches(sc.max_num_batched_tokens, sc.max_num_seqs)
    return {r: np.array([basis.terms(b) for b in bs]) for r, bs in batches.items()}


def _version_change(
    spec: EngineSpec, p: Pulled, mix: Any, rate: float, serve_s: float, seed: int
) -> VersionChange:
    from coeffd.daemon.publish.policy import step_time_change

    vs = p.steady_versions()
    distinct = [v for i, v in enumerate(vs) if i == 0 or v[2:] != vs[i - 1][2:]]
    steps = [step_time_change(a[3], b[3], mix) for a, b in itertools.pairwise(vs)]
    e2e = 0.0
    if len(distinct) > 1:
        first, last = distinct[0], distinct[-1]
        r1 = serve(with_coefficients(spec, first[2], first[3], rate), serve_s, seed)
        r2 = serve(with_coefficients(spec, last[2], last[3], rate), serve_s, seed)
        keys = sorted(set(r1) & set(r2))
        e2e = latency(r2, keys).mean_e2e / latency(r1, keys).mean_e2e - 1.0
    return VersionChange(len(vs), len(distinct), max(steps, default=0.0), e2e)


def _quality_line(
    name: str, err: dict[str, float], p: Pulled, vc: VersionChange, truth_alpha: Sequence[float]
) -> str:
    est = p.estimated_std
    return (
        f"    {name}: step-time error vs the noiseless truth per regime "
        + ", ".join(
            f"{r} {e * 100:.2f}% (daemon's estimate {est.get(r, math.nan) * 100:.2f}%)"
            for r, e in err.items()
        )
        + "; α vs the truth "
        + ", ".join(f"{(a / t - 1) * 100:+.2f}%" for a, t in zip(p.alpha, truth_alpha, strict=True))
        + f"; steady-state versions {vc.versions} ({vc.distinct} with new numbers): max "
        f"step-time change {vc.max_step_time_change * 100:.3f}%, closed-loop mean E2E "
        f"first→last {vc.e2e_change * 100:+.3f}%; estimate "
        f"{p.snapshot.get('estimate', '')!r}, identification {p.snapshot.get('identification')}"
    )


def _load_line(lr: LoadResult) -> str:
    head = (
        f"    {lr.load:15s} {lr.rate_per_s:6.2f} req/s ({lr.truth.requests} requests; truth "
        f"TTFT mean {lr.truth.mean_ttft / 1e3:.1f} ms p99 {lr.truth.p99_ttft / 1e3:.1f} ms, "
        f"E2E mean {lr.truth.mean_e2e / 1e3:.0f} ms p99 {lr.truth.p99_e2e / 1e3:.0f} ms)"
    )
    rows = [head]
    for name, d in lr.diffs.items():
        rows.append(f"      {name:13s} " + "  ".join(f"{m} {d[m] * 100:+7.2f}%" for m in METRICS))
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench closedloop", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="one seed, 120 simulated seconds")
    ap.add_argument("--scenario", choices=sorted(CONFIGURATIONS), default="dense")
    ap.add_argument("--sync", action="store_true", help="sync scheduling (default async)")
    ap.add_argument("--duration", type=float, default=600.0, help="simulated seconds")
    ap.add_argument("--seeds", default="1,2", help="comma-separated seeds")
    ap.add_argument(
        "--replicas", type=int, default=REPLICAS, help="serving workloads pooled per load"
    )
    args = ap.parse_args(argv)
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(30),
    )
    seeds = [1] if args.quick else [int(s) for s in args.seeds.split(",") if s.strip()]
    duration = 120.0 if args.quick else args.duration
    replicas = 1 if args.quick else max(1, args.replicas)
    print(
        f"== closed loop: {args.scenario}, {'sync' if args.sync else 'async'} scheduling, "
        f"learn {duration:.0f} simulated s at {0.3:.0%} of capacity, serve {duration:.0f} s "
        f"per load ({replicas} workloads pooled), seeds {seeds}"
    )
    t0 = time.perf_counter()
    res = run(
        scenario=args.scenario,
        async_scheduling=not args.sync,
        duration_s=duration,
        seeds=seeds,
        log=print,
        resolution=True,
        replicas=replicas,
    )
    print(f"\n== summary ({time.perf_counter() - t0:.0f} s): worst |difference| over seeds")
    ok = True
    below = ("low", "medium")
    for name in ("dense", "default", "blis_default"):
        for m in ("mean_ttft", "p99_ttft", "mean_e2e", "p99_e2e"):
            w = res.worst(name, m, below)
            sat = res.worst(name, m, ("near_saturation",))
            if name == "dense":
                # what the truth itself 0.1 % off moves this metric by: the resolution
                floor = max(res.worst(resolution_name(f), m, below) for f in RESOLUTION_FACTORS)
                limit = max(TARGET, floor)
                passed = w <= limit
                ok &= passed
                tag = "PASS" if passed else "FAIL"
                target = f"≤ {TARGET:.0%} below saturation"
                if floor > TARGET:
                    target += f"; the truth 0.1 % off moves it {floor * 100:.2f}%: judged at that"
            else:
                tag, target = "INFO", "(info)"
            print(
                f"  [{tag}] {name} {m}: {w * 100:.2f}% below saturation, {sat * 100:.2f}% near "
                f"saturation (target {target})"
            )
    for name in ("dense", "default"):
        err = max((max(s.regime_error[name].values()) for s in res.seeds), default=math.nan)
        step = max(s.versions[name].max_step_time_change for s in res.seeds)
        e2e = max(abs(s.versions[name].e2e_change) for s in res.seeds)
        rows = [
            (f"{name} worst regime step-time error vs the noiseless truth", err, 0.01),
            (f"{name} steady-state versions: max predicted step-time change", step, 0.005),
            (f"{name} steady-state versions: closed-loop mean E2E change", e2e, 0.01),
        ]
        for label, value, target in rows:
            passed = value <= target
            if name == "dense":
                ok &= passed
            tag = ("PASS" if passed else "FAIL") if name == "dense" else "INFO"
            print(f"  [{tag}] {label}: {value * 100:.3f}% (target ≤ {target:.1%})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
