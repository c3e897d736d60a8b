"""coeffd trace: the requests coeffd saw for one configuration, as a BLIS TraceV2 pair.

BLIS then judges the pulled coefficients on your own traffic::

    coeffd trace --config ID --trace-header t.yaml --trace-data t.csv --since 10m
    blis replay --trace-header t.yaml --trace-data t.csv \\
        $(coeffd pull --config ID --format blis-args) --results-path sim.json
    blis calibrate --trace-header t.yaml --trace-data t.csv --sim-results sim.json \\
        --report calibration.json

The daemon keeps each configuration's newest finished requests (``[trace]`` settings:
``max_requests``, ``max_age_seconds``); aborted requests are written with status
``error`` and ones that never finished with ``incomplete``. A request whose API and
engine spans never joined (refused before it reached the engine, or served on another
host) has no measured times and is not in the trace: ``coeffd_join_outcomes_total
{observation="request", outcome="expired"|"rejected"}`` counts those. The trace carries no prefix
groups (coeffd sees token counts, not tokens): BLIS replays every prompt as unique, so on
prefix-cache workloads its TTFT is too long where the real server hit its cache.
"""

from __future__ import annotations

import argparse
import re
import sys
import urllib.parse
from typing import Any

from coeffd.daemon.commands.pull import (
    PullError,
    UsageError,
    add_server_arguments,
    fetch_json,
    server_url,
    use_server_credentials,
)
from coeffd.daemon.learning.requests import FinishedRequest
from coeffd.daemon.publish.tracev2 import ServerBlock, write_tracev2

__all__ = ["add_parser", "main", "parse_duration", "run"]

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


def parse_duration(raw: str) -> float:
    """``600``, ``90s``, ``10m``, ``2h``, ``1d`` → seconds (> 0).

    >>> parse_duration("10m"), parse_duration("90"), parse_duration("1.5h")
    (600.0, 90.0, 5400.0)
    """
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([smhd]?)\s*", raw)
    if m is None or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a duration > 0 like 600, 90s, 10m, 2h or 1d, got {raw!r}"
        )
    return float(m.group(1)) * _UNITS[m.group(2)]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``trace``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "trace",
        help="write a configuration's recent requests as a BLIS TraceV2 pair "
        "(for blis replay and blis calibrate)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(p)
    p.set_defaults(run=run)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    add_server_arguments(p)
    p.add_argument("--config", required=True, metavar="ID", help="configuration id")
    p.add_argument("--trace-header", required=True, metavar="FILE", help="header YAML to write")
    p.add_argument("--trace-data", required=True, metavar="FILE", help="data CSV to write")
    p.add_argument(
        "--since",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help="only requests that arrived this long before the newest departed "
        "(600, 90s, 10m, 2h; default: every kept request)",
    )
    p.add_argument(
        "--warm-up-requests",
        type=int,
        default=0,
        metavar="N",
        help="header warm_up_requests: the first N requests blis calibrate leaves out",
    )


def fetch_requests(
    server: str, config_id: str, since_s: float | None, timeout: float
) -> tuple[dict[str, Any], list[FinishedRequest]]:
    """``GET /v1/requests/{id}``: the configuration's description and its requests."""
    url = f"{server}/v1/requests/{urllib.parse.quote(config_id, safe='')}"
    if since_s is not None:
        url += f"?since={since_s:g}"
    data = fetch_json(url, timeout)
    try:
        desc = dict(data["configuration"]["description"])
        columns = list(data["columns"])
        rows = [dict(zip(columns, row, strict=True)) for row in data["requests"]]
        requests = [FinishedRequest(**{f: row[f] for f in FinishedRequest._fields}) for row in rows]
    except (KeyError, TypeError, ValueError) as exc:
        raise PullError(f"{url}: unexpected response ({exc})") from exc
    return desc, requests


def run(args: argparse.Namespace) -> int:
    """Write the pair; 0 on success, 1 when the server cannot answer, 2 on usage errors."""
    try:
        if args.warm_up_requests < 0:
            raise UsageError(f"--warm-up-requests must be >= 0, got {args.warm_up_requests}")
        use_server_credentials(args)
        desc, requests = fetch_requests(
            server_url(args.server), args.config, args.since, args.timeout
        )
        if not requests:
            raise PullError(f"configuration {args.config} has no finished requests kept yet")
        n = write_tracev2(
            args.trace_header,
            args.trace_data,
            requests,
            ServerBlock.from_description(desc),
            warm_up_requests=args.warm_up_requests,
        )
    except PullError as exc:
        print(f"coeffd trace: {exc}", file=sys.stderr)
        return exc.code
    except OSError as exc:
        print(f"coeffd trace: cannot write the trace: {exc}", file=sys.stderr)
        return 1
    statuses: dict[str, int] = {}
    for r in requests:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    counts = ", ".join(f"{v} {k}" for k, v in sorted(statuses.items()))
    print(
        f"coeffd trace: wrote {n} requests ({counts}) of configuration {args.config} to "
        f"{args.trace_header} and {args.trace_data}; no prefix groups (every prompt unique)",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``coeffd trace`` alone (tests)."""
    parser = argparse.ArgumentParser(prog="coeffd trace", description=__doc__)
    _add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)
