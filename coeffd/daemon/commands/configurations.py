"""coeffd configurations: what a coeffd has learned, one line per serving configuration.

Names beside ids: model, GPU, TP/DP, the knobs that set it apart, its latest snapshot
version, how many step observations it learned from, and the step-time error of the
learned coefficients next to BLIS's defaults on the same steps (prequential: each step
predicted before it was learned). From a running daemon (--server, default
http://127.0.0.1:9464) or from a snapshot directory (--snapshot-dir, e.g. after
coeffd replay).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import msgspec
import orjson

from coeffd.daemon.commands.pull import (
    PullError,
    add_server_arguments,
    configuration_name,
    fetch_json,
    list_configurations,
    server_url,
)
from coeffd.daemon.publish.snapshot import Snapshot, decode_snapshot
from coeffd.daemon.publish.store import LATEST_NAME
from coeffd.learners.features.config import ServingConfig

__all__ = ["add_parser", "rows", "run", "table"]

#: Labels shown in their own columns, or not worth showing.
_SHOWN = {"config", "model", "gpu", "tp", "dp", "model_config_hash"}
_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(ServingConfig)
    if f.default is not f.default_factory
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``configurations``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "configurations",
        help="list the learned configurations: id, model, GPU, TP, knobs, version, "
        "observations, learned vs BLIS-default error",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_arguments(p)
    p.add_argument(
        "--snapshot-dir",
        default=None,
        metavar="DIR",
        help="read the snapshots on disk instead of asking a server",
    )
    p.add_argument(
        "--json",
        action="store_const",
        const="json",
        dest="format",
        help="one JSON object per configuration (same as --format json)",
    )
    p.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table (default) or json (as coeffd pull --format json)",
    )
    p.set_defaults(run=run)
    return p


def knobs(labels: dict[str, str]) -> dict[str, str]:
    """The labels that set a configuration apart beyond model/GPU/TP/DP (defaults left out).

    >>> knobs({"model": "m", "gpu": "H100", "tp": "1", "block_size": "16", "max_num_seqs": "64"})
    {'max_num_seqs': '64'}
    """
    out = {}
    for k, v in sorted(labels.items()):
        if k in _SHOWN:
            continue
        default = _DEFAULTS.get(k, dataclasses.MISSING)
        if default is not dataclasses.MISSING and (
            str(default).lower() == v.lower()
            or (isinstance(default, float) and _float(v) == default)
        ):
            continue
        out[k] = v
    return out


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def row(snap: Snapshot) -> dict[str, Any]:
    """One configuration's line (as a dict) from its latest snapshot."""
    labels = {**{k: str(v) for k, v in snap.configuration.description.items() if v is not None}}
    labels.update(snap.configuration.labels)
    fleet = labels.get("kind") == "fleet"
    if fleet:  # no model, GPU or knobs of its own
        labels = {"kind": "fleet"}
    step = snap.prequential.get("step_period", {})
    learned, default = step.get("learned"), step.get("blis_default")
    mape = learned.mape if learned is not None else None
    mape_default = default.mape if default is not None else None
    note = ""
    if fleet and snap.loco:
        # its honest error: each configuration's steps predicted by the fleet model
        # fitted without that configuration (leave-one-configuration-out)
        per = {k: v for k, v in snap.loco.items() if k != "mean"}
        mean = snap.loco.get("mean")
        if mean is not None:
            mape = _mape(mean.get("fleet"))
            mape_default = _mape(mean.get("blis_default"))
        else:
            mape = _median([e.get("fleet") for e in per.values()])
            mape_default = _median([e.get("blis_default") for e in per.values()])
        note = f"error: each of {len(per)} configurations held out of the fit"
    return {
        "id": snap.config_id,
        "name": configuration_name(labels),
        "model": labels.get("model", ""),
        "gpu": labels.get("gpu", ""),
        "tp": labels.get("tp", "1"),
        "dp": labels.get("dp", "1"),
        "knobs": {} if fleet else knobs(labels),
        "fleet": fleet,
        "note": note,
        "version": snap.version,
        "coeffd_version": snap.coeffd_version,
        "observations": dict(snap.observations),
        "step_mape_learned": mape,
        "step_mape_blis_default": mape_default,
    }


def _mape(stat: Any) -> float | None:
    return None if stat is None else stat.mape


def _median(stats: list[Any]) -> float | None:
    values = sorted(x.mape for x in stats if x is not None and x.mape is not None)
    return statistics.median(values) if values else None


def _from_server(server: str, timeout: float) -> list[Snapshot]:
    snaps = []
    for c in list_configurations(server, timeout):
        cid = urllib.parse.quote(str(c["id"]), safe="")
        data = fetch_json(f"{server}/v1/coefficients/{cid}?format=json", timeout)
        snaps.append(_decode(orjson.dumps(data), f"{server} ({c['id']})"))
    return snaps


def _from_dir(directory: str) -> list[Snapshot]:
    root = Path(directory)
    if not root.is_dir():
        raise PullError(f"no snapshot directory {directory}")
    return [_decode(p.read_bytes(), str(p)) for p in sorted(root.glob(f"*/{LATEST_NAME}"))]


def _decode(data: bytes, where: str) -> Snapshot:
    try:
        return decode_snapshot(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PullError(f"{where}: not a coefficient snapshot: {exc}") from exc


def rows(snaps: list[Snapshot]) -> list[dict[str, Any]]:
    """Rows sorted by name, the fleet model last."""
    return sorted((row(s) for s in snaps), key=lambda r: (r["fleet"], r["name"], r["id"]))


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def table(rs: list[dict[str, Any]]) -> str:
    """The human-readable listing: knobs every configuration shares are said once, below.

    >>> print(table([
    ...     {"id": "a1", "name": "m/H100/tp1", "version": 3, "observations": {"beta": 90},
    ...      "step_mape_learned": 0.025, "step_mape_blis_default": 0.05,
    ...      "knobs": {"max_num_seqs": "256", "max_num_batched_tokens": "512"}},
    ...     {"id": "b2", "name": "m/A100-80/tp2", "version": 1, "observations": {},
    ...      "step_mape_learned": None, "step_mape_blis_default": None,
    ...      "knobs": {"max_num_seqs": "256"}},
    ... ]))
    id            configuration  version  step obs  step error: learned BLIS default  knobs
    a1            m/H100/tp1           3        90                 2.5%         5.0%  max_num_batched_tokens=512
    b2            m/A100-80/tp2        1         0                    -            -
    all configurations: max_num_seqs=256
    """
    if not rs:
        return "no configuration has published coefficients yet"
    configs = [r for r in rs if not r.get("fleet")]
    shared = dict(configs[0]["knobs"]) if len(configs) > 1 else {}
    for r in configs[1:]:
        shared = {k: v for k, v in shared.items() if r["knobs"].get(k) == v}
    width = max(len("configuration"), *(len(r["name"]) for r in rs))
    lines = [
        f"{'id':<12}  {'configuration':<{width}}  {'version':>7}  {'step obs':>8}  "
        f"{'step error: learned':>19} {'BLIS default':>12}  knobs"
    ]
    for r in rs:
        knob_text = r.get("note") or " ".join(
            f"{k}={v}" for k, v in r["knobs"].items() if k not in shared
        )
        lines.append(
            f"{r['id']:<12}  {r['name']:<{width}}  {r['version']:>7}  "
            f"{r['observations'].get('beta', r['observations'].get('step_period', 0)):>8}  "
            f"{_pct(r['step_mape_learned']):>19} {_pct(r['step_mape_blis_default']):>12}  "
            f"{knob_text}".rstrip()
        )
    if shared:
        lines.append("all configurations: " + " ".join(f"{k}={v}" for k, v in shared.items()))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """List; 0 on success, 1 when the server or directory cannot be read."""
    try:
        if args.snapshot_dir:
            snaps = _from_dir(args.snapshot_dir)
        else:
            snaps = _from_server(server_url(args.server), args.timeout)
    except PullError as exc:
        print(f"coeffd configurations: {exc}", file=sys.stderr)
        return exc.code
    rs = rows(snaps)
    if not rs and args.snapshot_dir is None:
        print("(nothing published yet: a configuration needs ~20 observations)", file=sys.stderr)
    if getattr(args, "format", None) == "json" or getattr(args, "json", False):
        for r in rs:
            print(orjson.dumps(r).decode())
    else:
        print(table(rs))
    return 0
