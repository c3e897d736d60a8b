"""``coeffd simfleet``: run a synthetic vLLM fleet with known true coefficients.

Emits vLLM's exact telemetry (OTLP spans, ZMQ KV events) to live endpoints and/or files,
and writes the ground truth. See ``simfleet`` for the model and the scenarios.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``simfleet``."""
    from coeffd.simfleet.scenarios import SCENARIOS

    p: argparse.ArgumentParser = subparsers.add_parser(
        "simfleet",
        help="run a synthetic vLLM fleet emitting vLLM's telemetry with known true coefficients",
        description="Simulate vLLM engines and emit their OTLP spans and KV events.",
    )
    p.add_argument("--scenario", default="steady", choices=sorted(SCENARIOS))
    p.add_argument("--duration", type=float, default=60.0, metavar="SECONDS", help="simulated s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--drain",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="simulated seconds to let in-flight requests finish after --duration",
    )
    p.add_argument("--otlp-endpoint", metavar="HOST:PORT", help="send spans over OTLP")
    p.add_argument(
        "--otlp-protocol", default="grpc", choices=("grpc", "http/protobuf"), help="as vLLM"
    )
    p.add_argument("--kv-endpoint", metavar="tcp://HOST:PORT", help="publish KV events (ZMQ PUB)")
    p.add_argument(
        "--kv-encoding",
        default="array",
        choices=("array", "map"),
        help="fork positional arrays (default) or upstream maps",
    )
    p.add_argument(
        "--kv-topic",
        default=None,
        help="ZMQ topic (default '' for one engine, else the engine name)",
    )
    p.add_argument("--out", metavar="FILE", help="OTLP/JSON lines (collector file-exporter format)")
    p.add_argument("--kv-out", metavar="FILE", help="KV events as JSON lines")
    p.add_argument("--truth", metavar="FILE", help="ground-truth JSON")
    p.add_argument(
        "--speed",
        type=float,
        default=None,
        metavar="RATIO",
        help="simulated/real time ratio (default: as fast as possible)",
    )
    p.add_argument(
        "--sample-rates",
        default="1.0,0.01,0.001",
        metavar="J,S,R[,K]",
        help="journey,step,rich sample rates [,closure interval] (vLLM defaults)",
    )
    p.add_argument(
        "--max-span-events",
        type=int,
        default=128,
        help="OTEL_SPAN_EVENT_COUNT_LIMIT of the simulated processes",
    )
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the simulation; returns 0, or 2 for bad arguments."""
    from coeffd.simfleet.config import SampleRates
    from coeffd.simfleet.kv import KVEndpointError, require_listener
    from coeffd.simfleet.run import run as sim_run
    from coeffd.simfleet.run import write_truth

    try:
        rates = SampleRates.parse(args.sample_rates)
    except ValueError as exc:
        print(f"coeffd simfleet: --sample-rates: {exc}", file=sys.stderr)
        return 2
    if not (args.otlp_endpoint or args.kv_endpoint or args.out or args.kv_out or args.truth):
        print(
            "coeffd simfleet: nothing to emit (give --out, --otlp-endpoint, --kv-endpoint, "
            "--kv-out or --truth)",
            file=sys.stderr,
        )
        return 2
    if args.kv_endpoint:
        try:
            require_listener(args.kv_endpoint)
        except KVEndpointError as exc:
            print(f"coeffd simfleet: --kv-endpoint: {exc}", file=sys.stderr)
            return 1
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(args.out, "wb")) if args.out else None
        kv_out = stack.enter_context(open(args.kv_out, "w")) if args.kv_out else None
        res = sim_run(
            args.scenario,
            args.duration,
            args.seed,
            rates=rates,
            trace_out=out,
            kv_out=kv_out,
            otlp_endpoint=args.otlp_endpoint,
            otlp_protocol=args.otlp_protocol,
            kv_endpoint=args.kv_endpoint,
            kv_form=args.kv_encoding,
            kv_topic=args.kv_topic,
            speed=args.speed,
            max_events=args.max_span_events,
            drain_s=args.drain,
        )
        if args.truth:
            with open(args.truth, "w") as fh:
                write_truth(res.truth, fh)
    print(
        f"simfleet {args.scenario}: {len(res.engines)} engine(s), {res.sim_seconds:.1f} s simulated "
        f"in {res.wall_seconds:.2f} s, {res.steps} steps, {res.requests_finished} requests finished",
        file=sys.stderr,
    )
    return 0
