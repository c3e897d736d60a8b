"""simfleet: a synthetic vLLM fleet that emits vLLM's exact telemetry with known truth.

In-process API::

    from coeffd.simfleet import run, SampleRates
    res = run("steady", duration_s=60, seed=1, trace_out=open("t.jsonl", "wb"),
              rates=SampleRates(1.0, 1.0, 0.01, 100))
    res.truth  # ground truth (see ``simfleet.run.truth_document``)

    # embedded in a daemon: live OTLP/ZMQ at real time, stoppable
    th, stop, result = run_in_thread("fleet", 3600, 1, speed=1.0,
                                     otlp_endpoint="127.0.0.1:4317",
                                     kv_endpoint="tcp://127.0.0.1:5557")

CLI: ``coeffd simfleet --scenario steady --duration 60 --seed 1 --out traces.jsonl``.
"""

from coeffd.simfleet.config import (
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
from coeffd.simfleet.kv import KVJsonlWriter, MemoryKVSink, read_kv_jsonl
from coeffd.simfleet.run import (
    RunResult,
    replica,
    resource_attributes,
    run,
    run_in_thread,
    write_truth,
)
from coeffd.simfleet.scenarios import SCENARIOS, build

__all__ = [
    "BLIS_ALPHA",
    "BLIS_BETA",
    "SCENARIOS",
    "CoefficientSchedule",
    "Coefficients",
    "EngineSpec",
    "KVJsonlWriter",
    "MemoryKVSink",
    "Noise",
    "RunResult",
    "SampleRates",
    "ServingSetup",
    "Workload",
    "build",
    "read_kv_jsonl",
    "replica",
    "resource_attributes",
    "run",
    "run_in_thread",
    "write_truth",
]
