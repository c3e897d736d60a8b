"""Run a scenario: engines on one simulated timeline, telemetry to files, memory or wire.

``run()`` is the in-process API (``coeffd demo`` embeds it; tests drive it); the
``coeffd simfleet`` command is a thin CLI over it. Engines advance in global simulated-time
order, so file output is deterministic for a seed; ``speed`` paces simulated time against
the wall clock (``None`` = as fast as possible).
"""

from __future__ import annotations

import heapq
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import structlog
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from coeffd.records.observations import BatchRequest
from coeffd.simfleet.config import EngineSpec, SampleRates
from coeffd.simfleet.emitter import Emitter
from coeffd.simfleet.engine import Engine
from coeffd.simfleet.kv import KVJsonlWriter, KVSink, ZmqPublisher
from coeffd.simfleet.physics import BlisPhysics, make_physics
from coeffd.simfleet.scenarios import build
from coeffd.simfleet.state import INF
from coeffd.simfleet.telemetry import (
    SDK_VERSION,
    JsonLinesSink,
    SimBatchProcessor,
    make_provider,
    otlp_processor,
)

log = structlog.get_logger(__name__)

FIXED_WALL_START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z, for reproducible files
MONO_START_NS = 5_000_000_000_000  # EngineCore mono clock at simulation start (5000 s)

TraceSink = Callable[[ExportTraceServiceRequest], None]


def replica(
    req: ExportTraceServiceRequest, copy: int, shift_ns: int = 0
) -> ExportTraceServiceRequest:
    """``req`` as another engine of the same configuration would send it: ``coeffd.engine``
    suffixed ``~copy``, trace and span ids tagged with ``copy`` (so nothing is a duplicate),
    and every time shifted by ``shift_ns``. Builds fleets of hundreds of engines from one
    run (benchmarks, engine-sampling tests)."""
    tag = copy.to_bytes(4, "big")
    out = ExportTraceServiceRequest()
    out.CopyFrom(req)
    for rs in out.resource_spans:
        for kv in rs.resource.attributes:
            if kv.key == "coeffd.engine":
                kv.value.string_value = f"{kv.value.string_value}~{copy}"
        for ss in rs.scope_spans:
            for s in ss.spans:
                s.trace_id = tag + s.trace_id[4:]
                s.span_id = tag[2:] + s.span_id[2:]
                if s.parent_span_id:
                    s.parent_span_id = tag[2:] + s.parent_span_id[2:]
                if shift_ns:
                    s.start_time_unix_nano += shift_ns
                    s.end_time_unix_nano += shift_ns
                    for ev in s.events:
                        ev.time_unix_nano += shift_ns
    return out


def resource_attributes(spec: EngineSpec, process: str, index: int) -> dict[str, Any]:
    """Resource of one process: the ``coeffd.*`` configuration vocabulary + identity.

    ``service.name`` names the deployment; ``coeffd.engine`` the replica (DP rank);
    ``coeffd.process`` and a fake ``process.pid`` tell the API server from the EngineCore,
    as the process resource detector would (spec §1.4). The KV stream of an engine is
    labelled with its EngineCore's attributes, so both get the same source id.
    """
    sc = spec.serving
    attrs: dict[str, Any] = {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": SDK_VERSION,
        "service.name": f"vllm-{spec.name}",
        "coeffd.model": sc.model,
        "coeffd.gpu": sc.gpu,
        "coeffd.tp": sc.tp,
        "coeffd.dp": sc.dp,
        "coeffd.ep": sc.ep,
        "coeffd.max_num_batched_tokens": sc.max_num_batched_tokens,
        "coeffd.max_num_seqs": sc.max_num_seqs,
        "coeffd.max_model_len": spec.workload.max_model_len,
        "coeffd.chunked_prefill": True,
        "coeffd.prefix_caching": sc.prefix_caching,
        "coeffd.cpu_offload_gib": float(sc.cpu_offload_gib),
        "coeffd.block_size": sc.block_size,
        "coeffd.async_scheduling": sc.async_scheduling,
        "coeffd.engine": spec.name,
        "coeffd.process": process,
        "process.pid": 1000 + 10 * index + (1 if process == "engine_core" else 0),
    }
    if sc.moe_comm_backend:
        attrs["coeffd.moe_comm_backend"] = sc.moe_comm_backend
    return attrs


def term_structure(physics: Any) -> dict[str, Any]:
    """Which basis terms a configuration can identify at all (for scoring learners).

    ``zero``: terms whose basis is 0 for every batch here (e.g. TP comm at tp=1, MoE
    dispatch at dp=1, χ·L_moe for non-interleaved models) — their β never matters.
    ``constant``: terms whose basis is the same non-zero value for every batch (``L``,
    ``1``, ``χ·L_moe``, ``T_weight``): only their weighted sum is identifiable, given as
    ``constant_sum_us`` per coefficient point by ``truth_document``.
    """
    from coeffd.learners.features import TERM_NAMES

    if not isinstance(physics, BlisPhysics):
        return {}
    probes = [
        [BatchRequest(512, 0, 512, 64)],
        [BatchRequest(900, 900 + i * 7, 1, 300) for i in range(8)],
        [BatchRequest(3000, 1024, 1024, 10), BatchRequest(200, 230, 1, 100)],
    ]
    rows = [[float(x) for x in physics.terms(b)] for b in probes]
    zero = [TERM_NAMES[i] for i in range(len(TERM_NAMES)) if all(r[i] == 0 for r in rows)]
    const = [
        TERM_NAMES[i]
        for i in range(len(TERM_NAMES))
        if rows[0][i] != 0 and all(r[i] == rows[0][i] for r in rows)
    ]
    values = {TERM_NAMES[i]: rows[0][i] for i in range(len(TERM_NAMES)) if TERM_NAMES[i] in const}
    return {"names": list(TERM_NAMES), "zero": zero, "constant": const, "constant_values": values}


def config_id(resource: dict[str, Any]) -> str:
    """The project's configuration id for these resource attributes (learners.features)."""
    from coeffd.learners.features.config import ServingConfig
    from coeffd.records.events import Source

    return ServingConfig.from_resource(Source("", tuple(sorted(resource.items())))).id


@dataclass
class RunResult:
    """What a run produced: engines (with optional step records) and the truth document."""

    engines: list[Engine]
    truth: dict[str, Any]
    sim_seconds: float
    wall_seconds: float
    steps: int = 0
    requests_finished: int = 0
    spans_summaries: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def truth_document(
    scenario: str,
    seed: int,
    duration_s: float,
    specs: Sequence[EngineSpec],
    engines: Sequence[Engine],
    rates: SampleRates,
    wall_start_ns: int,
) -> dict[str, Any]:
    """Ground truth: per configuration, true α/β/offload coefficients over time + noise."""
    confs = []
    for i, (spec, eng) in enumerate(zip(specs, engines, strict=True)):
        points = []
        for p in spec.truth.points:
            d = asdict(p)
            d["wall_ns"] = wall_start_ns + int(p.t_s * 1e9)
            d["beta"] = list(p.beta)
            d["alpha"] = list(p.alpha)
            d["kv_base_us"] = list(p.kv_base_us)
            d["kv_bytes_per_us"] = list(p.kv_bytes_per_us)
            points.append(d)
        resource = resource_attributes(spec, "engine_core", i)
        terms = term_structure(eng.physics)
        for d in points:
            if terms:
                cv = terms["constant_values"]
                d["constant_sum_us"] = sum(
                    d["beta"][terms["names"].index(k)] * v for k, v in cv.items()
                )
        confs.append(
            {
                "engine": spec.name,
                "config_id": config_id(resource),
                "resource": resource,
                "serving": asdict(spec.serving),
                "workload": {
                    k: (list(v) if isinstance(v, tuple) else v)
                    for k, v in asdict(spec.workload).items()
                },
                "physics": "blis"
                if isinstance(eng.physics, BlisPhysics)
                else type(eng.physics).__name__,
                "terms": terms,
                "kv_bytes_per_block": eng.kv_block_bytes,
                "coefficients": {
                    "interpolation": "linear" if spec.truth.gradual else "step",
                    "points": points,
                    "change_points_s": [p.t_s for p in spec.truth.points[1:]],
                },
                "noise": asdict(spec.noise),
                **({"structure": spec.structure} if spec.structure else {}),
            }
        )
    return {
        "scenario": scenario,
        "seed": seed,
        "duration_s": duration_s,
        "wall_start_ns": wall_start_ns,
        "mono_start_ns": MONO_START_NS,
        "sample_rates": asdict(rates),
        "semantics": {
            "beta": "busy-loop period of a batch = BLIS S(beta, batch) us × exp(sigma·z), z~N(0,1), "
            "plus with probability stall_rate a stall of stall_us·Pareto(1.5); async scheduling: "
            "S(N+2)-S(N+1) is the period of batch N; sync: S(N+1)-S(N)",
            "alpha0": "api.ARRIVED -> delivered to the EngineCore input queue (QUEUED adds the "
            "loop's quantization wait on top)",
            "alpha1": "journey.FINISHED -> api.DEPARTED",
            "alpha2": "journey.FIRST_TOKEN -> api.FIRST_RESPONSE_FROM_CORE (streaming chat)",
            "alpha_noise": "each delay × exp(alpha_sigma·z)",
            "kv_transfer": "duration_us = (kv_base_us[dir] + block_count·kv_bytes_per_block/"
            "kv_bytes_per_us[dir]) × exp(kv_sigma·z); dir 0 = store GPU->CPU, 1 = load CPU->GPU; "
            "kv_bytes_per_block is the logical block (all KV heads, vLLM layout: "
            "learners.features.observe.kv_bytes_per_block)",
        },
        "configurations": confs,
    }


def run(
    scenario: str | Sequence[EngineSpec],
    duration_s: float,
    seed: int = 0,
    *,
    rates: SampleRates | None = None,
    trace_sinks: Sequence[TraceSink] = (),
    trace_out: IO[bytes] | None = None,
    kv_sinks: Sequence[KVSink] = (),
    kv_out: IO[str] | None = None,
    otlp_endpoint: str | None = None,
    otlp_protocol: str = "grpc",
    kv_endpoint: str | None = None,
    kv_form: str = "array",
    kv_topic: str | None = None,
    speed: float | None = None,
    wall_start_ns: int | None = None,
    telemetry: bool = True,
    max_events: int = 128,
    drain_s: float = 30.0,
    record_steps: bool = False,
    record_latencies: bool = False,
    check_invariants: bool = False,
    stop: threading.Event | None = None,
) -> RunResult:
    """Simulate ``scenario`` for ``duration_s`` simulated seconds.

    Arrivals stop at ``duration_s``; engines then drain for at most ``drain_s`` before the
    step spans are closed (as at engine shutdown) and every exporter is flushed. Requests
    still in flight then are lost, as they would be in vLLM.
    """
    rates = rates or SampleRates()
    name = scenario if isinstance(scenario, str) else "custom"
    specs = build(scenario, duration_s) if isinstance(scenario, str) else list(scenario)
    if wall_start_ns is None:
        wall_start_ns = time.time_ns() if otlp_endpoint else FIXED_WALL_START_NS
    sinks: list[TraceSink] = list(trace_sinks)
    if trace_out is not None:
        sinks.append(JsonLinesSink(trace_out))
    kvs: list[KVSink] = list(kv_sinks)
    if kv_out is not None:
        kvs.append(KVJsonlWriter(kv_out))
    engines: list[Engine] = []
    providers: list[TracerProvider] = []
    sim_procs: list[SimBatchProcessor] = []
    owned_kv: list[KVSink] = []
    end_ns = MONO_START_NS + int(duration_s * 1e9)
    for i, spec in enumerate(specs):
        sc = spec.serving
        physics = make_physics(sc.model, sc.gpu, sc.tp, sc.dp, sc.moe_comm_backend)
        em: Emitter | None = None
        if telemetry:
            tracers = []
            for proc_i, process in enumerate(("api_server", "engine_core")):
                procs: list[SpanProcessor] = []
                if sinks:
                    sp = SimBatchProcessor(sinks)
                    sim_procs.append(sp)
                    procs.append(sp)
                if otlp_endpoint:
                    procs.append(otlp_processor(otlp_endpoint, otlp_protocol, speed))
                prov = make_provider(
                    resource_attributes(spec, process, i),
                    seed=hash((seed, i, proc_i)) & 0xFFFFFFFF,
                    processors=procs,
                    max_events=max_events,
                )
                providers.append(prov)
                tracers.append(prov)
            api_t = tracers[0].get_tracer("vllm.api")
            core_t = tracers[1].get_tracer("vllm.scheduler")
            step_t = tracers[1].get_tracer("vllm.scheduler.step")
            em = Emitter(
                rates,
                api_t,
                core_t,
                step_t,
                wall_offset_ns=wall_start_ns - MONO_START_NS,
                seed=(seed * 7919 + i) & 0xFFFFFFFF,
                model_name=sc.model,
            )
        eng_kv = list(kvs)
        if kv_endpoint and telemetry:
            z = ZmqPublisher(kv_endpoint, port_offset=i)
            owned_kv.append(z)
            eng_kv.append(z)
        topic = kv_topic if kv_topic is not None else ("" if len(specs) == 1 else spec.name)
        eng = Engine(
            spec,
            seed=(seed * 1_000_003 + i * 7_777) & 0xFFFFFFFF,
            physics=physics,
            emitter=em,
            kv_sinks=eng_kv if telemetry else [],
            t0_ns=MONO_START_NS,
            end_ns=end_ns,
            kv_form=kv_form,
            kv_topic=topic.encode(),
            kv_source=resource_attributes(spec, "engine_core", i),
            record_steps=record_steps,
            check_invariants=check_invariants,
            record_latencies=record_latencies,
        )
        engines.append(eng)
    if owned_kv:
        time.sleep(0.3)  # let PUB connections establish (ZMQ slow-joiner)
    heap = [(e.next_time(), i) for i, e in enumerate(engines)]
    heapq.heapify(heap)
    hard_end = end_ns + int(drain_s * 1e9)
    wall0 = time.perf_counter()
    sim_now = MONO_START_NS
    n = 0
    while heap:
        t, i = heapq.heappop(heap)
        if t >= INF:
            continue
        if t > hard_end or (stop is not None and stop.is_set()):
            heapq.heappush(heap, (t, i))
            break
        e = engines[i]
        e.advance()
        sim_now = max(sim_now, t)
        heapq.heappush(heap, (e.next_time(), i))
        n += 1
        if n & 63 == 0:
            for sp in sim_procs:
                sp.pump(sim_now)
            if speed:
                ahead = (sim_now - MONO_START_NS) / 1e9 / speed - (time.perf_counter() - wall0)
                if ahead > 0.002:
                    time.sleep(ahead)
    for e in engines:
        e.shutdown(max(e.t, sim_now))
    for sp in sim_procs:
        sp.force_flush()
    for prov in providers:
        prov.shutdown()
    for k in owned_kv:
        k.close()
    for k in kvs:
        k.close()
    if trace_out is not None:
        trace_out.flush()
    wall = time.perf_counter() - wall0
    truth = truth_document(name, seed, duration_s, specs, engines, rates, wall_start_ns)
    res = RunResult(
        engines=engines,
        truth=truth,
        sim_seconds=(sim_now - MONO_START_NS) / 1e9,
        wall_seconds=wall,
        steps=sum(e.counter for e in engines),
        requests_finished=sum(e.num_finished for e in engines),
        spans_summaries=sum(e.em.summaries for e in engines if e.em is not None),
    )
    log.info(
        "simfleet run done",
        scenario=name,
        engines=len(engines),
        sim_s=round(res.sim_seconds, 1),
        wall_s=round(wall, 2),
        steps=res.steps,
        finished=res.requests_finished,
        preemptions=sum(e.num_preemptions for e in engines),
    )
    return res


def run_in_thread(
    scenario: str | Sequence[EngineSpec], duration_s: float, seed: int = 0, **kw: Any
) -> tuple[threading.Thread, threading.Event, list[RunResult]]:
    """Start ``run`` in a daemon thread (for ``coeffd demo``); returns the thread, the
    event that stops it early, and a list that receives the ``RunResult``."""
    stop = threading.Event()
    out: list[RunResult] = []

    def target() -> None:
        out.append(run(scenario, duration_s, seed, stop=stop, **kw))

    th = threading.Thread(target=target, name="simfleet", daemon=True)
    th.start()
    return th, stop, out


def write_truth(truth: dict[str, Any], fh: IO[str]) -> None:
    """Ground-truth JSON (stable key order, so same seed ⇒ same bytes)."""
    json.dump(truth, fh, indent=2, sort_keys=True)
    fh.write("\n")
