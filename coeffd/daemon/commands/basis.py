"""``coeffd basis``: print BLIS's eleven trained-physics terms for one batch, as JSON.

    coeffd basis --model-config llama-3.1-8b-instruct --hardware H100 --tp 1 \\
        --batch batch.json [--beta default | --beta 0.15,0,1.36,...]

``batch.json`` is a list of ``{"input_len", "progress_index", "num_new_tokens",
"output_len"}`` objects (BLIS's request fields). With ``--beta`` the unrounded ``S`` and
the integer step time (µs) are printed too. Bad files exit with code 2 and one line on
stderr naming the file and the problem.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from coeffd.learners.features.basis import BLIS_DEFAULT_BETA, TERM_NAMES, BlisBasis, normalize_beta
from coeffd.learners.features.catalog import resolve_model
from coeffd.learners.features.hardware import load_hardware
from coeffd.records.observations import BatchRequest

__all__ = ["add_parser", "load_batch", "parse_beta", "run"]

EXIT_USAGE = 2
_BATCH_KEYS = ("input_len", "progress_index", "num_new_tokens", "output_len")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``basis``."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "basis",
        help="print the BLIS trained-physics basis terms (and step time) for a batch",
        description="Evaluate BLIS's trained-physics basis for one batch and print JSON.",
    )
    p.add_argument(
        "--model-config",
        required=True,
        metavar="PATH|NAME",
        help="config.json path (or its folder) or a bundled model name",
    )
    p.add_argument(
        "--hardware", required=True, metavar="NAME|PATH", help="GPU name or hardware JSON"
    )
    p.add_argument("--gpu", default=None, help="entry to use from a multi-GPU hardware file")
    p.add_argument("--tp", type=int, required=True, help="tensor parallel degree")
    p.add_argument("--dp", type=int, default=1, help="data parallel degree (MoE only)")
    p.add_argument("--moe-comm-backend", default="", help="vLLM all2all backend name")
    p.add_argument(
        "--beta",
        default=None,
        metavar="b0,b1,...",
        help="7-11 comma-separated coefficients, or 'default' for BLIS's bundled 11",
    )
    p.add_argument(
        "--batch",
        required=True,
        metavar="FILE.json",
        help='JSON list of requests, e.g. [{"input_len": 512, "progress_index": 0, '
        '"num_new_tokens": 512, "output_len": 128}]',
    )
    p.set_defaults(run=run)
    return p


def parse_beta(text: str) -> list[float]:
    """BLIS's flag format: comma-separated numbers, no spaces; ``default`` = bundled D11.

    >>> parse_beta("1,0,2.5,0,0,0,0")
    [1.0, 0.0, 2.5, 0.0, 0.0, 0.0, 0.0]
    """
    if text.strip().lower() == "default":
        return list(BLIS_DEFAULT_BETA)
    if any(c.isspace() for c in text):
        raise ValueError(f"--beta: comma-separated numbers without spaces, got {text!r}")
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--beta: not a comma-separated list of numbers: {text!r}") from None
    normalize_beta(values)  # ≥ 7 values, finite, ≥ 0
    return values


def _int_field(obj: dict[str, Any], key: str, where: str) -> int:
    if key not in obj:
        raise ValueError(f"{where}: missing key {key!r}")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{where}: {key!r} must be a number, got {v!r}")
    if v != int(v) or v < 0:
        raise ValueError(f"{where}: {key!r} must be a non-negative integer, got {v!r}")
    return int(v)


def load_batch(path: str | Path) -> list[BatchRequest]:
    """Read a batch file (list of request objects with BLIS's field names)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{p}: cannot read batch file: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ValueError(f"{p}: a batch file must be a JSON list of request objects")
    out: list[BatchRequest] = []
    for i, obj in enumerate(data):
        where = f"{p}[{i}]"
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: must be an object with keys {', '.join(_BATCH_KEYS)}")
        vals = [_int_field(obj, k, where) for k in _BATCH_KEYS]
        out.append(BatchRequest(*vals))
    return out


def run(args: argparse.Namespace) -> int:
    """Evaluate and print; exit 2 with one stderr line on bad input."""
    try:
        model = resolve_model(args.model_config)
        hw = load_hardware(args.hardware, args.gpu)
        basis = BlisBasis(model, hw, args.tp, args.dp, args.moe_comm_backend)
        batch = load_batch(args.batch)
        beta = parse_beta(args.beta) if args.beta is not None else None
    except (ValueError, KeyError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"coeffd basis: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    terms = basis.terms(batch)
    out: dict[str, Any] = {
        "model": model.name,
        "hardware": hw.name,
        "tp": basis.tp,
        "dp": basis.dp,
        "moe_comm_backend": basis.moe_comm_backend,
        "requests": len(batch),
        "unit": "us (L, B, one, chi_L_moe are counts)",
        "names": list(TERM_NAMES),
        "values": [float(v) for v in terms],
        "terms": {n: float(v) for n, v in zip(TERM_NAMES, terms, strict=True)},
    }
    if beta is not None:
        out["beta"] = beta
        out["s"] = basis.step_s(beta, batch)
        out["step_time"] = basis.step_time(beta, batch)
    # repr-exact floats: json.dumps writes the shortest round-tripping form.
    print(json.dumps(out, indent=2))
    return 0
