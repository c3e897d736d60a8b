"""coeffd pull: fetch learned coefficients from a running coeffd for a BLIS run.

Length: one command with several answer forms (id, description, defaults.yaml, offline)
that share their argument checks and error texts.

  coeffd pull [--server http://127.0.0.1:9464] [--config ID] --format flags|yaml|json|blis-args
  coeffd pull --defaults path/to/defaults.yaml [--dry-run] [--backup] [--format blis-args]

Without --config the server must have exactly one configuration (a sidecar); with
several, they are listed (id, model, GPU, TP) and the command fails, because silently
picking one would feed BLIS another model's coefficients.

--format blis-args prints a whole blis run argument list: the latency model, model,
GPU, TP, coeffd's model and hardware sheets (needed when defaults.yaml is not in BLIS's
own tree) and the coefficients.

  coeffd pull --model NAME|config.json --hardware GPU --tp N [--dp N ...] [--format ...]
  coeffd pull --defaults path/to/defaults.yaml [--config ID | --model ... --hardware ...]

--model/--hardware/--tp describe a configuration (deployed or not): the answer is its own
coefficients if coeffd has learned it, else the fleet model's best prediction for it,
with the source and the expected step-time error (GET /v1/predict). Knobs not given match
any: --model M --hardware H100 --tp 1 answers the learned M/H100/tp1 whatever its
--max-num-batched-tokens; when several learned configurations match, the one with the most
step observations answers and stderr lists the others with the flags that pick them. A
model or GPU name the server does not know is refused with the closest known ones (GPU
names are case-insensitive). A config.json path is read here; only its name and hash are
sent.

--config takes an id or a unique prefix of one (coeffd configurations lists them).
--snapshot-dir DIR answers from the snapshots on disk (e.g. after coeffd replay) instead
of a server, offline. --server defaults to $COEFFD_SERVER, else http://127.0.0.1:9464.

--defaults on a server with several configurations writes the fleet vector (one α/β
fitted over all of them, snapshot "fleet") with a comment giving its leave-one-
configuration-out error, never one configuration's vector, unless --config names one.
It refuses (file untouched) while that error is not below BLIS's shipped defaults' on the
same configurations' steps (early on, a fleet fitted on a few seconds of data is worse
than the vector it would replace), naming both errors; --force writes it anyway.

--defaults rewrites only the coefficient block of a BLIS defaults.yaml, atomically,
through a symlink to the file it points at, keeping every other line, comment and the
lists' style; it refuses (file untouched) anything BLIS would not load. --dry-run prints
the diff instead; --backup keeps the old file as FILE.bak. With --format blis-args it
then prints the blis run arguments that read that file. The fleet vector names no model,
GPU or TP (it stands for all of them), so none is guessed: the arguments carry the latency
model and the file, and a note on stderr names the flags to add (--model, --hardware,
--tp and, outside BLIS's tree, --model-config-folder and --hardware-config).
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
from pathlib import Path
from typing import Any

import msgspec
import orjson

from coeffd.daemon.predict import as_snapshot, error_text, iso_time, render
from coeffd.daemon.predict import comment as prediction_comment
from coeffd.daemon.publish.blis import to_blis_args
from coeffd.daemon.publish.defaults_rewrite import DefaultsUpdate, plan_defaults_update
from coeffd.daemon.publish.defaults_schema import DefaultsYamlError
from coeffd.daemon.publish.snapshot import (
    ALPHA_NAMES,
    InvalidCoefficientsError,
    Snapshot,
    decode_snapshot,
)
from coeffd.learners.features.catalog import resolve_model
from coeffd.learners.features.model import ModelConfigError
from coeffd.learners.fleet.results import FLEET_ID
from coeffd.learners.targets import ALPHA_TARGETS

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
    """A failure with a message fit for the user; exit status 1 (2 for ``UsageError``).

    ``status`` and ``detail``: the HTTP status and the server's message, for an HTTP error.
    """

    code = EXIT_FAILED
    status: int | None = None
    detail = ""


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
        default=os.environ.get("COEFFD_SERVER") or DEFAULT_SERVER,
        metavar="URL",
        help=f"coeffd base URL (default $COEFFD_SERVER, else {DEFAULT_SERVER})",
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
    parser.add_argument(
        "--config",
        default=None,
        help="configuration id or a unique prefix of one (default: the only one)",
    )
    parser.add_argument(
        "--snapshot-dir",
        default=None,
        metavar="DIR",
        help="answer from the snapshots in DIR (offline, e.g. after coeffd replay), not a server",
    )
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
        "--json",
        action="store_const",
        const="json",
        dest="format",
        help="same as --format json (as coeffd configurations --json)",
    )
    parser.add_argument(
        "--defaults",
        default=None,
        metavar="PATH",
        help="rewrite the trained_physics_coefficients block of this BLIS defaults.yaml",
    )
    parser.add_argument(
        "--model",
        default=None,
        metavar="NAME|config.json",
        help="describe a configuration (with --hardware, --tp): its own or predicted coefficients",
    )
    parser.add_argument("--hardware", default=None, metavar="GPU", help="GPU name, e.g. H100")
    parser.add_argument("--tp", type=int, default=None, help="tensor parallel degree")
    parser.add_argument("--dp", type=int, default=None, help="data parallel degree")
    parser.add_argument("--ep", action="store_true", default=None, help="expert parallelism")
    parser.add_argument("--moe-comm-backend", default=None, help="vLLM all2all backend")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--vllm-version", default=None)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other coeffd.* configuration attribute (repeatable)",
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
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --defaults: write the fleet vector even when its leave-one-configuration-"
        "out error is not below BLIS's defaults'",
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
        err = PullError(f"{url}: HTTP {exc.code}: {detail}")
        err.status, err.detail = exc.code, str(detail)
        raise err from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        hint = ""
        if isinstance(reason, ConnectionRefusedError):
            hint = " (is it running? make run / coeffd serve; or give --server URL)"
        raise PullError(f"cannot reach coeffd at {url}: {reason}{hint}") from exc


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
    >>> configuration_name({"config": "fleet", "kind": "fleet"})
    'fleet model (all configurations)'
    """
    if labels.get("kind") == "fleet":
        return "fleet model (all configurations)"
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


def _choose_config(server: str, timeout: float, fleet_ok: bool = False) -> str:
    """The only configuration; with several, the fleet vector if ``fleet_ok`` (``--defaults``:
    BLIS's one block must not get one configuration's vector), else an error listing them."""
    configs = [c for c in list_configurations(server, timeout) if c["id"] != FLEET_ID]
    if len(configs) > 1 and fleet_ok:
        return FLEET_ID
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


def resolve_config(server: str, timeout: float, wanted: str) -> str:
    """The configuration id ``wanted`` names: itself, or the one id it is a prefix of.
    ``PullError`` for no match (pointing at ``coeffd configurations``) or several (listed)."""
    configs = list_configurations(server, timeout)
    ids = [str(c["id"]) for c in configs]
    if wanted in ids:
        return wanted
    found = [c for c in configs if str(c["id"]).startswith(wanted)]
    if len(found) == 1:
        return str(found[0]["id"])
    if found:
        listing = "\n".join(
            f"  {c['id']}  {configuration_name(c.get('labels') or {})}" for c in found
        )
        raise UsageError(f"--config {wanted} matches {len(found)} configurations:\n{listing}")
    raise PullError(
        f"unknown configuration {wanted!r} on {server}; run coeffd configurations "
        f"(with the same --server or --snapshot-dir) to list the learned ones"
    )


def _pull_offline(args: argparse.Namespace) -> str:
    """``--snapshot-dir DIR``: the same answers from the snapshots on disk, through the
    daemon's own API served in-process on a loopback port (nothing else to keep in step)."""
    from coeffd.base.http import HttpServer
    from coeffd.daemon import api
    from coeffd.daemon.publish.store import SnapshotStore

    if not Path(args.snapshot_dir).is_dir():
        raise UsageError(f"--snapshot-dir {args.snapshot_dir}: no such directory")
    server = HttpServer("127.0.0.1", 0, name="pull-offline")
    api.mount(server.router, SnapshotStore(args.snapshot_dir))
    server.start()
    try:
        local = argparse.Namespace(**vars(args))
        local.server, local.snapshot_dir = f"http://127.0.0.1:{server.port}", None
        local.token_file = local.cacert = local.client_cert = None
        return pull(local)
    finally:
        server.stop()


def update_defaults(
    path: str,
    snapshot: Snapshot,
    *,
    dry_run: bool = False,
    backup: bool = False,
    comment: str | None = None,
    what: str | None = None,
) -> str:
    """Rewrite (or with ``dry_run`` diff) ``path``'s coefficient block to ``snapshot``'s
    α/β, ``comment`` above it; returns the message to print. Raises ``PullError``; the file
    is untouched on any error. Through a symlink the file it points at is rewritten."""
    try:
        update: DefaultsUpdate = plan_defaults_update(path, snapshot.alpha, snapshot.beta, comment)
    except DefaultsYamlError as exc:
        raise PullError(f"refusing to rewrite {path}: {exc.summary()}") from exc
    except InvalidCoefficientsError as exc:
        raise PullError(f"refusing to rewrite {path}: {exc}") from exc
    except OSError as exc:
        raise PullError(f"cannot read {path}: {exc}") from exc
    what = what or (
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
    """Do the work; return what to print on stdout. Raises ``PullError``.

    ``args`` may name only some options (library callers such as bench closedloop build
    their own Namespace): the rest take their defaults.
    """
    parser = argparse.ArgumentParser(add_help=False)
    _add_arguments(parser)
    args = argparse.Namespace(**(vars(parser.parse_args([])) | vars(args)))
    if args.snapshot_dir:
        return _pull_offline(args)
    server = server_url(args.server)
    use_server_credentials(args)
    fmt = args.format
    if args.defaults and fmt not in (None, "blis-args"):
        raise UsageError(
            f"--format {fmt} does not go with --defaults (which writes the YAML block); "
            "drop one of them, or use --format blis-args to print the blis run arguments"
        )
    if (args.dry_run or args.backup or args.force) and not args.defaults:
        raise UsageError("--dry-run, --backup and --force go with --defaults PATH")
    described = describe_args(args)
    if described is not None:
        return _pull_prediction(args, server, described)
    config = (
        resolve_config(server, args.timeout, args.config)
        if args.config
        else _choose_config(server, args.timeout, fleet_ok=bool(args.defaults))
    )
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
    # One configuration's vector gets its provenance comment above the block (replacing
    # any of ours: a fleet or prediction comment must not outlive its vector) and a
    # warning naming the terms still at their prior; the file is otherwise left as it
    # was, byte for byte outside the lists.
    comment = config_comment(snap) if args.defaults else None
    what = None
    if snap.config_id == FLEET_ID:
        if not args.force:
            refuse_worse_fleet(snap, args.defaults)
        comment, what = fleet_comment(snap), f"the fleet vector, version {snap.version}"
    out = _write_and_format(args, snap, url, comment, what)
    if args.defaults and snap.config_id != FLEET_ID and (at_prior := prior_terms(snap)):
        print(
            f"coeffd pull: warning: configuration {snap.config_id} "
            f"({configuration_name(snap.configuration.labels)}) has not learned "
            f"{'; '.join(at_prior)} from its data: they keep their prior (BLIS's defaults or "
            "the pooled prior of similar configurations). What would identify each: "
            f"coeffd pull --config {snap.config_id} --format json (identify_with)",
            file=sys.stderr,
        )
    return "\n".join(out)


def _write_and_format(
    args: argparse.Namespace, snap: Snapshot, url: str, comment: str | None, what: str | None
) -> list[str]:
    """``--defaults`` (with ``comment`` above the block) and ``--format blis-args``."""
    out: list[str] = []
    if args.defaults:
        out.append(
            update_defaults(
                args.defaults,
                snap,
                dry_run=args.dry_run,
                backup=args.backup,
                comment=comment,
                what=what,
            )
        )
    if args.format == "blis-args":
        try:
            blis, notes = to_blis_args(snap, defaults_path=args.defaults)
        except InvalidCoefficientsError as exc:
            raise PullError(f"{url}: {exc}") from exc
        for note in notes:
            print(f"coeffd pull: note: {note}", file=sys.stderr)
        if args.defaults:
            print(out.pop(), file=sys.stderr)  # stdout stays one argument list
        out.append(shlex.join(blis))
    return out


def describe_args(args: argparse.Namespace) -> dict[str, str] | None:
    """The ``/v1/predict`` query of ``--model/--hardware/--tp`` and knobs (None without
    ``--model``). A ``config.json`` path is read here: only its name and hash are sent."""
    knobs = {
        "tp": args.tp,
        "dp": args.dp,
        "ep": args.ep,
        "moe_comm_backend": args.moe_comm_backend,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "vllm_version": args.vllm_version,
    }
    if args.model is None:
        if args.hardware is not None or any(v is not None for v in knobs.values()) or args.set:
            raise UsageError("--hardware, --tp and the other knobs go with --model")
        return None
    if args.config is not None:
        raise UsageError("--config and --model do not go together: one names, one describes")
    if args.version is not None:
        raise UsageError("--version goes with --config (a prediction has no versions)")
    if not args.hardware:
        raise UsageError("--model needs --hardware GPU (and usually --tp N)")
    query = {"model": args.model, "gpu": args.hardware}
    if os.path.exists(args.model):
        try:
            spec = resolve_model(args.model)
        except (ModelConfigError, OSError, ValueError) as exc:
            raise UsageError(f"--model {args.model}: {exc}") from exc
        query |= {"model": spec.name, "model_config_hash": spec.config_hash}
    for key, value in knobs.items():
        if value is not None:
            query[key] = str(value).lower() if isinstance(value, bool) else str(value)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        query[key.strip().removeprefix("coeffd.")] = value.strip()
    return query


def _pull_prediction(args: argparse.Namespace, server: str, query: dict[str, str]) -> str:
    """``--model …``: the configuration's own or predicted coefficients."""
    url = f"{server}/v1/predict?{urllib.parse.urlencode(query | {'format': 'json'})}"
    try:
        answer = fetch_json(url, args.timeout)
    except PullError as exc:
        if exc.status == 400:  # the query: say what is wrong with it, not the URL
            raise UsageError(exc.detail) from exc
        raise
    try:
        snap = as_snapshot(answer)
    except (KeyError, TypeError, ValueError) as exc:
        raise PullError(f"{url}: unexpected answer: {exc}") from exc
    named = query | {"tp": query.get("tp", 1)}
    if answer.get("matched_on"):
        named = dict(answer["configuration"].get("labels") or named)
    summary = (
        f"{answer['source']} coefficients for {configuration_name(named)}"
        f" (configuration {snap.config_id}), {error_text(answer)}"
    )
    print(f"coeffd pull: {summary}", file=sys.stderr)
    others = answer.get("other_matches") or []
    if others:
        print(
            f"coeffd pull: {len(others) + 1} learned configurations match the flags given; "
            f"this one has the most step observations. The others:\n"
            + "\n".join(_selecting_flags(o) for o in others),
            file=sys.stderr,
        )
    out = _write_and_format(args, snap, url, prediction_comment(answer), summary)
    if not args.defaults and args.format != "blis-args":
        out.append(render(answer, args.format or "flags").decode().rstrip("\n"))
    return "\n".join(out)


#: pull's own flag for a configuration key (others go through --set KEY=VALUE)
_KNOB_FLAGS = {
    "tp": "--tp",
    "dp": "--dp",
    "moe_comm_backend": "--moe-comm-backend",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "vllm_version": "--vllm-version",
}


def _selecting_flags(other: Mapping[str, Any]) -> str:
    """``  ID  NAME  (N step obs): --config ID, or add --flag V ...`` for one other match.

    >>> _selecting_flags({"id": "a1", "labels": {"model": "m", "gpu": "H100", "tp": "1"},
    ...                   "observations": 90, "differs": {"max_num_seqs": 64, "ep": True}})
    '  a1  m/H100/tp1 (90 step observations): --config a1, or add --ep --set max_num_seqs=64'
    """
    flags = []
    for key, value in sorted((other.get("differs") or {}).items()):
        if key == "ep":
            flags.append("--ep" if value else "--set ep=false")
        elif key in _KNOB_FLAGS:
            flags.append(f"{_KNOB_FLAGS[key]} {value}")
        else:
            flags.append(f"--set {key}={value}")
    pick = f", or add {' '.join(flags)}" if flags else ""
    return (
        f"  {other['id']}  {configuration_name(other.get('labels') or {})} "
        f"({other.get('observations', 0)} step observations): --config {other['id']}{pick}"
    )


def _pct(e: Any) -> str:
    return f"{100 * e.mape:.1f} %" if e is not None and e.mape is not None else "unknown"


def refuse_worse_fleet(snap: Snapshot, path: str) -> None:
    """``PullError`` when the fleet vector's LOCO error is not below BLIS's defaults' on the
    same steps: writing it would make ``path`` worse than the vector it replaces (with
    no LOCO yet there is nothing to compare, and the comment says "unknown")."""
    mean = snap.loco.get("mean", {})
    fleet, default = mean.get("fleet"), mean.get("blis_default")
    if fleet is None or default is None or fleet.mape is None or default.mape is None:
        return
    if fleet.mape < default.mape:
        return
    n = snap.observations.get("configurations", 0)
    raise PullError(
        f"not writing {path}: the fleet vector (version {snap.version}, {n} configurations) "
        f"has a leave-one-configuration-out step-time error of {_pct(fleet)}, no better than "
        f"BLIS's shipped defaults' {_pct(default)} on the same steps, so it would replace a "
        "better vector. Let coeffd learn longer (the fleet improves as configurations gather "
        "steps), pick one configuration with --config ID, or write it anyway with --force"
    )


def fleet_comment(snap: Snapshot) -> str:
    """What a fleet vector is, its LOCO error and when (the ``defaults.yaml`` comment)."""
    mean = snap.loco.get("mean", {})
    n = snap.observations.get("configurations", 0)
    return (
        f"# coeffd {snap.coeffd_version}: fleet vector (one alpha/beta fitted over {n} "
        f"configurations), leave-one-configuration-out step-time error "
        f"{_pct(mean.get('fleet'))} (BLIS defaults {_pct(mean.get('blis_default'))}), "
        f"version {snap.version}, {iso_time(snap.wall_ns)}"
    )


def prior_terms(snap: Snapshot) -> list[str]:
    """The α and β terms of a configuration's snapshot its data did not pin down, in words:
    α targets without a learned vector, β terms ``identification`` calls ``prior`` (and
    those only identified in a combination, ``data+prior``).

    >>> from coeffd.daemon.publish.snapshot import ConfigurationRef
    >>> snap = Snapshot(configuration=ConfigurationRef(id="a1"), version=1, wall_ns=0,
    ...     alpha=(1.0, 2.0, 3.0), beta=(1.0,) * 11,
    ...     observations={"beta": 90, "finished_to_departed": 9, "output_token": 9},
    ...     identification={"L": "prior", "one": "data+prior", "B": "data"})
    >>> prior_terms(snap)
    ['alpha[0] (queueing_time)', 'beta L (1 of 11 at the prior)', 'beta one (its split from others)']
    """
    out = [
        f"alpha[{i}] ({ALPHA_NAMES[i]})"
        for i, target in enumerate(ALPHA_TARGETS)
        if not snap.observations.get(target)
    ]
    prior = [n for n, src in snap.identification.items() if src == "prior"]
    split = [n for n, src in snap.identification.items() if src == "data+prior"]
    if prior:
        out.append(f"beta {', '.join(prior)} ({len(prior)} of {len(snap.beta)} at the prior)")
    if split:
        out.append(f"beta {', '.join(split)} (its split from others)")
    return out


def config_comment(snap: Snapshot) -> str:
    """The ``defaults.yaml`` comment for one configuration's vector: whose it is, how good,
    and how many terms are still at their prior."""
    step = snap.prequential.get("step_period", {})
    alpha0 = not snap.observations.get(ALPHA_TARGETS[0])
    prior = sum(src == "prior" for src in snap.identification.values())
    at_prior = " and ".join(
        (["alpha0"] if alpha0 else []) + ([f"{prior} of {len(snap.beta)} beta"] if prior else [])
    )
    return (
        f"# coeffd {snap.coeffd_version}: configuration {snap.config_id} "
        f"({configuration_name(snap.configuration.labels)}) only, step-time error "
        f"{_pct(step.get('learned'))} (BLIS defaults {_pct(step.get('blis_default'))}), "
        f"version {snap.version}, {iso_time(snap.wall_ns)}"
        + (f"; still at their prior: {at_prior}" if at_prior else "")
    )


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
    """Standalone entry (``python -m coeffd.daemon.commands.pull``)."""
    parser = argparse.ArgumentParser(
        prog="coeffd pull",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
