"""``coeffd pull``: fetch learned coefficients from a running coeffd for a BLIS run.

    coeffd pull --server http://coeffd:8080 [--config ID] --format flags|yaml|json
    coeffd pull --server http://coeffd:8080 --defaults path/to/defaults.yaml

Without ``--config`` the server must have exactly one configuration (a sidecar); with
several, they are listed and the command fails, because silently picking one would feed
BLIS another model's coefficients. ``--defaults`` rewrites only the coefficient block of
a BLIS ``defaults.yaml`` in place, atomically, and refuses (file untouched) anything BLIS
would not load. Only the standard library's urllib is used.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import msgspec
import orjson

from daemon.publish.blis import DefaultsYamlError, rewrite_defaults
from daemon.publish.snapshot import InvalidCoefficientsError, decode_snapshot

NAME = "pull"


class PullError(RuntimeError):
    """A failure with a message fit for the user; exit status 1."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``pull`` on an ``argparse`` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="fetch learned coefficients from a coeffd server (flags, YAML block, JSON)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", required=True, help="coeffd base URL, e.g. http://host:8080")
    parser.add_argument("--config", default=None, help="configuration id (default: the only one)")
    parser.add_argument(
        "--version", type=int, default=None, help="snapshot version (default latest)"
    )
    parser.add_argument("--format", choices=("flags", "yaml", "json"), default="flags")
    parser.add_argument(
        "--defaults",
        default=None,
        metavar="PATH",
        help="rewrite the trained_physics_coefficients block of this BLIS defaults.yaml",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout, seconds")


def _get(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body: bytes = resp.read()
            return body
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")
        with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError):
            detail = orjson.loads(detail)["error"]["message"]
        raise PullError(f"{url}: HTTP {exc.code}: {detail}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PullError(f"cannot reach coeffd at {url}: {reason}") from exc


def _choose_config(server: str, timeout: float) -> str:
    body = _get(f"{server}/v1/configurations", timeout)
    try:
        configs = orjson.loads(body)["configurations"]
        ids = [c["id"] for c in configs]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise PullError(f"{server}: unexpected /v1/configurations response") from exc
    if not ids:
        raise PullError(f"{server}: no configuration has published coefficients yet")
    if len(ids) > 1:
        listing = "\n".join(f"  {c['id']}  (version {c.get('latest_version')})" for c in configs)
        raise PullError(
            f"{server} has {len(ids)} configurations; pick one with --config:\n{listing}"
        )
    return str(ids[0])


def pull(args: argparse.Namespace) -> str:
    """Do the work; return what to print on stdout. Raises ``PullError``."""
    server = str(args.server).rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise PullError(f"--server must be an http(s) URL, got {args.server!r}")
    config = args.config or _choose_config(server, args.timeout)
    params: dict[str, str] = {"format": "json" if args.defaults else args.format}
    if args.version is not None:
        params["version"] = str(args.version)
    url = (
        f"{server}/v1/coefficients/{urllib.parse.quote(config, safe='')}?"
        f"{urllib.parse.urlencode(params)}"
    )
    body = _get(url, args.timeout)
    if not args.defaults:
        return body.decode("utf-8").rstrip("\n")
    try:
        snap = decode_snapshot(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PullError(f"{url}: not a coefficient snapshot: {exc}") from exc
    try:
        rewrite_defaults(args.defaults, snap.alpha, snap.beta)
    except (InvalidCoefficientsError, DefaultsYamlError) as exc:
        raise PullError(f"refusing to rewrite {args.defaults}: {exc}") from exc
    except OSError as exc:
        raise PullError(f"cannot rewrite {args.defaults}: {exc}") from exc
    return (
        f"updated {args.defaults}: configuration {snap.config_id} version {snap.version} "
        f"(coeffd {snap.coeffd_version})"
    )


def run(args: argparse.Namespace) -> int:
    """Entry point used by ``daemon.cli``; returns the exit status."""
    try:
        out = pull(args)
    except PullError as exc:
        print(f"coeffd pull: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m daemon.commands.pull``)."""
    parser = argparse.ArgumentParser(prog="coeffd pull", description=__doc__)
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
