"""coeffd pull: fetch learned coefficients from a running coeffd for a BLIS run.

  coeffd pull [--server http://127.0.0.1:9464] [--config ID] --format flags|yaml|json|blis-args
  coeffd pull --defaults path/to/defaults.yaml [--dry-run] [--backup] [--format blis-args]

Without --config the server must have exactly one configuration (a sidecar); with
several, they are listed (id, model, GPU, TP) and the command fails, because silently
picking one would feed BLIS another model's coefficients.

--format blis-args prints a whole blis run argument list: the latency model, model,
GPU, TP, coeffd's model and hardware sheets (needed when defaults.yaml is not in BLIS's
own tree) and the coefficients.

--defaults rewrites only the coefficient block of a BLIS defaults.yaml, atomically,
through a symlink to the file it points at, keeping every other line, comment and the
lists' style; it refuses (file untouched) anything BLIS would not load. --dry-run prints
the diff instead; --backup keeps the old file as FILE.bak. With --format blis-args it
then prints the blis run arguments that read that file.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

import msgspec
import orjson

from daemon.publish.blis import (
    DefaultsUpdate,
    DefaultsYamlError,
    plan_defaults_update,
    to_blis_args,
)
from daemon.publish.snapshot import InvalidCoefficientsError, Snapshot, decode_snapshot

__all__ = [
    "DEFAULT_SERVER",
    "PullError",
    "add_parser",
    "configuration_name",
    "fetch_json",
    "list_configurations",
    "run",
    "update_defaults",
    "use_server_credentials",
]

NAME = "pull"
#: Where ``coeffd serve`` / ``make run`` answer by default.
DEFAULT_SERVER = "http://127.0.0.1:9464"
FORMATS = ("flags", "yaml", "json", "blis-args")
EXIT_FAILED, EXIT_USAGE = 1, 2


class PullError(RuntimeError):
    """A failure with a message fit for the user; exit status 1 (2 for ``UsageError``)."""

    code = EXIT_FAILED


class UsageError(PullError):
    """Options that do not go together."""

    code = EXIT_USAGE


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``pull`` on an ``argparse`` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        NAME,
        help="fetch learned coefficients (BLIS flags, blis run args, YAML, JSON) or "
        "rewrite a BLIS defaults.yaml",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(parser)
    parser.set_defaults(run=run)
    return parser


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """``--server`` and ``--timeout`` (shared with ``coeffd configurations``)."""
    parser.add_argument(
        "--server",
        default=DEFAULT_SERVER,
        metavar="URL",
        help=f"coeffd base URL (default {DEFAULT_SERVER})",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout, seconds")
    parser.add_argument(
        "--token-file",
        default=os.environ.get("COEFFD_TOKEN_FILE") or None,
        metavar="PATH",
        help="bearer token for a server with http.auth (default $COEFFD_TOKEN_FILE)",
    )
    parser.add_argument("--cacert", metavar="PATH", help="CA bundle of an https server")
    parser.add_argument(
        "--client-cert",
        metavar="PATH",
        help="client certificate (PEM with its key, or see --client-key) for mutual TLS",
    )
    parser.add_argument("--client-key", metavar="PATH", help="key of --client-cert")


def use_server_credentials(args: argparse.Namespace) -> None:
    """Install ``--token-file`` / ``--cacert`` / ``--client-cert`` as urllib's opener, so
    every request of this (one-server) command carries them."""
    token_file = getattr(args, "token_file", None)
    cacert, cert = getattr(args, "cacert", None), getattr(args, "client_cert", None)
    if not (token_file or cacert or cert):
        return
    try:
        ctx = ssl.create_default_context(cafile=cacert)
        if cert:
            ctx.load_cert_chain(cert, getattr(args, "client_key", None))
        opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
        if token_file:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
            opener.addheaders.append(("Authorization", f"Bearer {token}"))
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot use the server credentials: {exc}") from exc
    urllib.request.install_opener(opener)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser)
    parser.add_argument("--config", default=None, help="configuration id (default: the only one)")
    parser.add_argument(
        "--version", type=int, default=None, help="snapshot version (default latest)"
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="flags (default): --alpha-coeffs/--beta-coeffs; blis-args: a whole blis run "
        "argument list; yaml: the defaults.yaml block; json: the snapshot",
    )
    parser.add_argument(
        "--defaults",
        default=None,
        metavar="PATH",
        help="rewrite the trained_physics_coefficients block of this BLIS defaults.yaml",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="with --defaults: print the diff, write nothing",
    )
    parser.add_argument(
        "--backup",
        action="store_true",
        help="with --defaults: keep the previous file as PATH.bak",
    )


def fetch_json(url: str, timeout: float) -> Any:
    """GET ``url`` and parse JSON; raises ``PullError`` with the server's message."""
    body = _get(url, timeout)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PullError(f"{url}: not JSON: {exc}") from exc


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


def server_url(raw: str) -> str:
    """The base URL without a trailing slash; ``PullError`` unless http(s)."""
    server = str(raw).rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise UsageError(f"--server must be an http(s) URL, got {raw!r}")
    return server


def configuration_name(labels: Mapping[str, Any]) -> str:
    """``model/GPU/tpN[/dpN]`` from a configuration's labels (what people call it).

    >>> configuration_name({"model": "llama-3.1-8b-instruct", "gpu": "H100", "tp": "2"})
    'llama-3.1-8b-instruct/H100/tp2'
    """
    name = f"{labels.get('model', '?')}/{labels.get('gpu', '?')}/tp{labels.get('tp', 1)}"
    dp = str(labels.get("dp", "1"))
    return name + (f"/dp{dp}" if dp not in ("", "1") else "")


def list_configurations(server: str, timeout: float) -> list[dict[str, Any]]:
    """``GET /v1/configurations``: one dict per configuration (id, labels, latest_version)."""
    data = fetch_json(f"{server}/v1/configurations", timeout)
    try:
        configs = list(data["configurations"])
        for c in configs:
            str(c["id"])
    except (KeyError, TypeError) as exc:
        raise PullError(f"{server}: unexpected /v1/configurations response") from exc
    return configs


def _choose_config(server: str, timeout: float) -> str:
    configs = list_configurations(server, timeout)
    if not configs:
        raise PullError(f"{server}: no configuration has published coefficients yet")
    if len(configs) > 1:
        listing = "\n".join(
            f"  {c['id']}  {configuration_name(c.get('labels') or {}):<56} "
            f"version {c.get('latest_version')}"
            for c in sorted(configs, key=lambda c: configuration_name(c.get("labels") or {}))
        )
        raise PullError(
            f"{server} has {len(configs)} configurations; pick one with --config ID "
            f"(coeffd configurations shows more):\n{listing}"
        )
    return str(configs[0]["id"])


def update_defaults(
    path: str, snapshot: Snapshot, *, dry_run: bool = False, backup: bool = False
) -> str:
    """Rewrite (or with ``dry_run`` diff) ``path``'s coefficient block to ``snapshot``'s
    α/β; returns the message to print. Raises ``PullError``; the file is untouched on any
    error. Through a symlink the file it points at is rewritten."""
    try:
        update: DefaultsUpdate = plan_defaults_update(path, snapshot.alpha, snapshot.beta)
    except (InvalidCoefficientsError, DefaultsYamlError) as exc:
        raise PullError(f"refusing to rewrite {path}: {exc}") from exc
    except OSError as exc:
        raise PullError(f"cannot read {path}: {exc}") from exc
    what = (
        f"configuration {snapshot.config_id} "
        f"({configuration_name(snapshot.configuration.labels)}) version {snapshot.version}"
    )
    if dry_run:
        if not update.changed:
            return f"{path} already holds {what}; nothing to change"
        return update.diff() + f"(dry run: {path} not written)"
    try:
        saved = update.apply(backup=backup)
    except OSError as exc:
        raise PullError(f"cannot rewrite {path}: {exc}") from exc
    if not update.changed:
        return f"{path} already holds {what}; not rewritten"
    where = f"{path} (→ {update.target})" if update.target != update.path.absolute() else path
    kept = f"; previous file kept as {saved}" if saved is not None else ""
    return f"updated {where}: {what} (coeffd {snapshot.coeffd_version}){kept}"


def pull(args: argparse.Namespace) -> str:
    """Do the work; return what to print on stdout. Raises ``PullError``."""
    server = server_url(args.server)
    use_server_credentials(args)
    fmt = args.format
    # callers building their own Namespace (bench closedloop) may leave the newer flags out
    dry_run, backup = getattr(args, "dry_run", False), getattr(args, "backup", False)
    if args.defaults and fmt not in (None, "blis-args"):
        raise UsageError(
            f"--format {fmt} does not go with --defaults (which writes the YAML block); "
            "drop one of them, or use --format blis-args to print the blis run arguments"
        )
    if (dry_run or backup) and not args.defaults:
        raise UsageError("--dry-run and --backup go with --defaults PATH")
    config = args.config or _choose_config(server, args.timeout)
    wire = "json" if (args.defaults or fmt == "blis-args") else (fmt or "flags")
    params: dict[str, str] = {"format": wire}
    if args.version is not None:
        params["version"] = str(args.version)
    url = (
        f"{server}/v1/coefficients/{urllib.parse.quote(config, safe='')}?"
        f"{urllib.parse.urlencode(params)}"
    )
    body = _get(url, args.timeout)
    if wire != "json" or fmt == "json":
        return body.decode("utf-8").rstrip("\n")
    try:
        snap = decode_snapshot(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise PullError(f"{url}: not a coefficient snapshot: {exc}") from exc
    out: list[str] = []
    if args.defaults:
        out.append(update_defaults(args.defaults, snap, dry_run=dry_run, backup=backup))
    if fmt == "blis-args":
        try:
            blis, notes = to_blis_args(snap, defaults_path=args.defaults)
        except InvalidCoefficientsError as exc:
            raise PullError(f"{url}: {exc}") from exc
        for note in notes:
            print(f"coeffd pull: note: {note}", file=sys.stderr)
        if args.defaults:
            print(out.pop(), file=sys.stderr)  # stdout stays one argument list
        out.append(shlex.join(blis))
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    """Entry point used by ``daemon.cli``; returns the exit status."""
    try:
        out = pull(args)
    except PullError as exc:
        print(f"coeffd pull: {exc}", file=sys.stderr)
        return exc.code
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m daemon.commands.pull``)."""
    parser = argparse.ArgumentParser(
        prog="coeffd pull",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
