"""``python -m bench dos``: what a 32 MB amplification body costs the OTLP receivers.

Issue 17.3: protobuf costs per *message*, not per byte, so 32 MB of 2-byte empty
messages made the receivers parse and walk 16 M of them (~34 s of CPU and 2 GB for
empty ``ResourceSpans``). Each attack body is handled in a fresh child process, twice:

* **before**: what the receivers did: ``FastExportRequest.FromString`` → ``Decoder.decode``;
* **after**: what they do now: ``receivers.otlp.limits.check_request`` with the default
  ``receivers.limits`` first, and the same parse and decode only if it passes.

``--part http`` (also in the default run): issue 32's attacks on a real TLS daemon's HTTP
listeners with peak RSS and ``/healthz`` p99, see :mod:`bench.httpattacks`. ``--part cap
[--cap N]``: a silent flood on a plain server at a connection cap
(:func:`bench.httpattacks.cap_flood`).

Reported per body: CPU seconds of the handling and the child's peak RSS (its idle RSS,
with the body built, shown apart), and the before/after ratios from the same run. A
last line gives the check's cost on legitimate requests as a share of their decode
(the price paid by real traffic), so the fix is judged on both sides.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["attack_body", "field", "main"]

ATTACKS = ("empty_resource_spans", "empty_spans", "empty_events")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (number, wire type 2, payload)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def attack_body(kind: str, n: int) -> bytes:
    """``n`` empty ResourceSpans / spans (one scope) / events (one span): 2 bytes each."""
    empty = b""
    if kind == "empty_resource_spans":
        return field(1, empty) * n
    if kind == "empty_spans":
        return field(1, field(2, field(2, empty) * n))
    if kind == "empty_events":
        return field(1, field(2, field(2, field(11, empty) * n)))
    raise ValueError(kind)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _child(kind: str, n: int, variant: str) -> dict[str, Any]:
    """Runs in the child process: build the body, handle it once, report."""
    from coeffd.receivers.otlp.decode import Decoder
    from coeffd.receivers.otlp.fastproto import FastExportRequest
    from coeffd.receivers.otlp.limits import RequestLimits, check_request

    body = attack_body(kind, n)
    decoder = Decoder()
    idle = _rss_mb()
    t0 = time.process_time()
    refused = None
    if variant == "after":
        over = check_request(body, RequestLimits())
        refused = None if over is None else over.limit
    records = -1
    if refused is None:
        records = len(decoder.decode(FastExportRequest.FromString(body)).records)
    cpu = time.process_time() - t0
    return {
        "cpu_s": cpu,
        "idle_rss_mb": idle,
        "peak_rss_mb": _rss_mb(),
        "refused": refused,
        "records": records,
        "bytes": len(body),
    }


def _run(kind: str, n: int, variant: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.dos", "--child", kind, str(n), variant],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _legit_share() -> str:
    """The check's CPU on vLLM-shaped requests as a share of their parse + decode."""
    from bench.ingest import build_core_request, build_step_request
    from coeffd.receivers.otlp.decode import Decoder
    from coeffd.receivers.otlp.fastproto import FastExportRequest
    from coeffd.receivers.otlp.limits import RequestLimits, check_request

    rng = random.Random(7)
    lines = []
    for name, req in (
        ("llm_core x512 (~0.8 MB)", build_core_request(rng, 512)),
        ("llm_core x4000 (~6.6 MB, walked)", build_core_request(rng, 4000)),
        ("scheduler_steps x100", build_step_request(rng, 100)),
    ):
        data = req.SerializeToString()
        limits = RequestLimits()
        decoder = Decoder()
        best_check = best_decode = float("inf")
        for _ in range(5):
            t0 = time.process_time()
            assert check_request(data, limits) is None
            t1 = time.process_time()
            decoder.decode(FastExportRequest.FromString(data))
            t2 = time.process_time()
            best_check, best_decode = min(best_check, t1 - t0), min(best_decode, t2 - t1)
        lines.append(f"  {name:34s} check {best_check / best_decode:6.1%} of decode")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every attack before/after in child processes; print CPU, RSS and ratios."""
    p = argparse.ArgumentParser(prog="python -m bench dos", description=__doc__.split("\n")[0])
    p.add_argument(
        "--messages",
        type=int,
        default=16_000_000,
        help="empty messages per body (2 bytes each; default: 32 MB bodies)",
    )
    p.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated subset")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    p.add_argument(
        "--part",
        choices=("all", "bodies", "http", "cap"),
        default="all",
        help="bodies: the amplification bodies; http: issue 32's attacks on a TLS daemon's "
        "HTTP listeners (bench/httpattacks.py); cap: a silent flood on a plain server at "
        "--cap connections (not in the default run)",
    )
    p.add_argument("--cap", type=int, default=64, help="--part cap: max_connections")
    p.add_argument("--floods", type=int, default=3, help="--part cap: floods of 3 s")
    args = p.parse_args(argv)
    if args.child:
        kind, n, variant = args.child
        print(json.dumps(_child(kind, int(n), variant)))
        return 0
    if args.part == "cap":
        from bench.httpattacks import cap_flood

        with tempfile.TemporaryDirectory(prefix="coeffd-dos-") as tmp:
            return cap_flood(Path(tmp), args.cap, args.floods)
    http_code = 0
    if args.part in ("all", "http"):
        from bench.httpattacks import run as http_attacks

        with tempfile.TemporaryDirectory(prefix="coeffd-dos-") as tmp:
            http_code = http_attacks(Path(tmp))
        if args.part == "http":
            return http_code
    print(
        f"{'body':22s} {'variant':7s} {'CPU s':>7s} {'peak RSS MB':>12s} {'idle RSS MB':>12s}  outcome"
    )
    worst = 0.0
    for kind in args.attacks.split(","):
        got = {v: _run(kind, args.messages, v) for v in ("before", "after")}
        for variant, r in got.items():
            outcome = (
                f"refused ({r['refused']})" if r["refused"] else f"decoded, {r['records']} records"
            )
            print(
                f"{kind:22s} {variant:7s} {r['cpu_s']:7.2f} {r['peak_rss_mb']:12.0f} "
                f"{r['idle_rss_mb']:12.0f}  {outcome}"
            )
        b, a = got["before"], got["after"]
        cpu_ratio = b["cpu_s"] / max(a["cpu_s"], 1e-6)
        growth_b = b["peak_rss_mb"] - b["idle_rss_mb"]
        growth_a = max(a["peak_rss_mb"] - a["idle_rss_mb"], 1.0)  # ru_maxrss is in KiB pages
        print(
            f"{'':22s} ratio   CPU {cpu_ratio:,.0f}x less; RSS above idle "
            f"{growth_b:,.0f} MB -> {growth_a:,.0f} MB; {b['bytes'] / 1e6:.0f} MB body"
        )
        worst = max(worst, a["cpu_s"])
    print("cost of the check on legitimate requests:")
    print(_legit_share())
    # Target: every attack refused in under a second of CPU.
    print(f"target: each attack handled in < 1 CPU s: {'met' if worst < 1.0 else 'MISSED'}")
    return 0 if worst < 1.0 and http_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
