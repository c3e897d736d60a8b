"""What BLIS reads, as text: CLI flags, a whole ``blis run`` argument list, the
``defaults.yaml`` coefficient block, and the snapshot as JSON.

Spec: ``blis-trained-physics.md`` §8.2 (flags) and §8.1 (the block). Floats are written
with full float64 precision in spellings both Go and YAML 1.1 read back exactly. Checking
a whole ``defaults.yaml`` the way BLIS decodes it is :mod:`.defaults_schema`; rewriting
the block in place is :mod:`.defaults_rewrite`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from coeffd.daemon.publish.snapshot import Snapshot, encode_snapshot, validate_for_blis

BLOCK_KEY = "trained_physics_coefficients"
ALPHA_KEY = "alpha_coeffs"
BETA_KEY = "beta_coeffs"


def format_float_flag(value: float) -> str:
    """Shortest round-tripping spelling of a float64 (Go's ``ParseFloat`` reads all of them)."""
    return repr(float(value))


def format_float_yaml(value: float) -> str:
    """``repr`` with a guaranteed ``.``: YAML 1.1 parsers read ``1e-05`` as a string.

    >>> format_float_yaml(1e-05), format_float_yaml(2.0), format_float_yaml(1e16)
    ('1.0e-05', '2.0', '1.0e+16')
    """
    text = repr(float(value))
    mantissa, sep, exponent = text.partition("e")
    if sep and "." not in mantissa:
        return f"{mantissa}.0e{exponent}"
    return text


def flow_list(values: Sequence[float]) -> str:
    """A YAML flow list like BLIS's own: ``[1.0, 2.5, 0.0]``."""
    return "[" + ", ".join(format_float_yaml(v) for v in values) + "]"


def to_flag_args(snapshot: Snapshot) -> list[str]:
    """``["--alpha-coeffs", "a0,a1,a2", "--beta-coeffs", "b0,…,b10"]`` (argv form)."""
    validate_for_blis(snapshot.alpha, snapshot.beta)
    return [
        "--alpha-coeffs",
        ",".join(format_float_flag(v) for v in snapshot.alpha),
        "--beta-coeffs",
        ",".join(format_float_flag(v) for v in snapshot.beta),
    ]


def to_flags(snapshot: Snapshot) -> str:
    """BLIS CLI flags: comma-separated, no spaces (§8.2), full float64 precision."""
    return " ".join(to_flag_args(snapshot))


def _bundled_sheets(model: str, gpu: str) -> tuple[Path | None, Path | None]:
    """coeffd's own ``config.json`` folder for ``model`` and hardware sheet holding ``gpu``
    (BLIS's formats, the very inputs the coefficients were learned with), where bundled."""
    from coeffd.learners.features.catalog import canonical_model_name

    data = Path(str(resources.files("coeffd.learners.features").joinpath("data")))
    canon = canonical_model_name(model)
    folder = data / "models" / canon if canon is not None else None
    sheet = data / "hardware.json"
    try:
        gpus = json.loads(sheet.read_text("utf-8"))
    except (OSError, ValueError):
        gpus = {}
    return folder, sheet if gpu in gpus else None


def to_blis_args(
    snapshot: Snapshot, *, defaults_path: str | os.PathLike[str] | None = None
) -> tuple[list[str], list[str]]:
    """A whole ``blis run`` argument list for the snapshot's configuration, and notes on
    what it could not fill in.

    ``--latency-model trained-physics --model M --hardware G --tp N`` (``--dp``, EP and the
    MoE backend when set), ``--model-config-folder`` and ``--hardware-config`` pointing at
    coeffd's bundled sheets (BLIS otherwise looks for them beside ``defaults.yaml``, so a
    ``defaults.yaml`` outside BLIS's tree would leave it without them), then the
    coefficients: as flags, or with ``defaults_path`` as ``--defaults-filepath`` (the
    file ``coeffd pull --defaults`` rewrote).

    What the snapshot does not name is left out, never guessed, and a note names the
    flags to add: the fleet vector (one α/β for every configuration) has no model, GPU
    or TP of its own, and a guessed ``--tp 1`` would simulate a setup nobody chose.
    """
    validate_for_blis(snapshot.alpha, snapshot.beta)
    ref = snapshot.configuration
    desc = {**ref.labels, **{k: v for k, v in ref.description.items() if v not in (None, "")}}
    notes: list[str] = []
    model, gpu = str(desc.get("model", "")), str(desc.get("gpu", ""))
    tp = str(int(desc["tp"])) if desc.get("tp") not in (None, "") else ""
    dp = int(desc.get("dp", 1) or 1)
    args = ["--latency-model", "trained-physics"]
    if model:
        args += ["--model", model]
    if gpu:
        args += ["--hardware", gpu]
    if tp:
        args += ["--tp", tp]
    if dp > 1:
        args += ["--dp", str(dp)]
    if str(desc.get("ep", "")).lower() in ("true", "1"):
        args.append("--enable-expert-parallel")
    if desc.get("moe_comm_backend"):
        args += ["--moe-comm-backend", str(desc["moe_comm_backend"])]
    folder, sheet = _bundled_sheets(model, gpu) if model or gpu else (None, None)
    if folder is not None:
        args += ["--model-config-folder", str(folder)]
    elif model:
        notes.append(
            f"{model} is not bundled with coeffd: add --model-config-folder DIR "
            "(the folder of its config.json)"
        )
    if sheet is not None:
        args += ["--hardware-config", str(sheet)]
    elif gpu:
        notes.append(f"GPU {gpu} is not bundled with coeffd: add --hardware-config FILE")
    unnamed = _unnamed(model, gpu, tp)
    if unnamed:
        notes.append(_unnamed_note(ref.id, desc.get("kind") == "fleet", unnamed))
    if desc.get("kind") != "fleet":  # the fleet vector describes no one engine
        engine, engine_notes = engine_args(desc)
        args += engine
        notes += engine_notes
    if defaults_path is not None:
        args += ["--defaults-filepath", str(Path(defaults_path).absolute())]
    else:
        args += to_flag_args(snapshot)
    return args, notes


#: The engine knobs BLIS has a flag for: description key → (flag, BLIS's default when
#: the flag is absent). BLIS rejects 0 and negatives for all but ``--max-model-len``
#: (0 = unlimited, or derived from the model's ``max_position_embeddings``), so only
#: positive values are ever printed (``cmd/root.go`` of BLIS f90a1e3).
ENGINE_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("max_num_batched_tokens", "--max-num-batched-tokens", "2048"),
    ("max_num_seqs", "--max-num-seqs", "256"),
    ("max_model_len", "--max-model-len", "derived from the model's max_position_embeddings"),
    ("kv_blocks_total_gpu", "--total-kv-blocks", "1000000, no KV pressure"),
    ("block_size", "--block-size-in-tokens", "16"),
)

#: Engine knobs coeffd records that no BLIS flag describes (BLIS simulates its own
#: behaviour for them): named in a note when set, so the difference is visible.
NO_BLIS_FLAG: tuple[str, ...] = ("prefix_caching", "async_scheduling", "kv_cache_dtype")


def engine_args(desc: dict[str, object]) -> tuple[list[str], list[str]]:
    """The ``blis run`` flags that describe the measured engine's scheduler and KV cache,
    and notes naming the knobs left to BLIS's defaults.

    BLIS otherwise simulates its own engine (2048 batched tokens, 256 sequences, a
    million KV blocks): coefficients learned under ``max_num_batched_tokens=512`` would be
    judged on a different schedule than the one measured.

    >>> engine_args({"max_num_batched_tokens": 512, "max_num_seqs": 64, "block_size": 16,
    ...              "max_model_len": 8192, "kv_blocks_total_gpu": 30000})[0]
    ['--max-num-batched-tokens', '512', '--max-num-seqs', '64', '--max-model-len', '8192', '--total-kv-blocks', '30000', '--block-size-in-tokens', '16']
    >>> engine_args({"max_num_seqs": "0", "block_size": 16})[0]  # BLIS rejects 0
    ['--block-size-in-tokens', '16']
    """
    args: list[str] = []
    missing: list[str] = []
    for key, flag, default in ENGINE_FLAGS:
        value = _positive_int(desc.get(key))
        if value is None:
            missing.append(f"{flag} ({default})")
        else:
            args += [flag, str(value)]
    notes: list[str] = []
    if missing:
        notes.append(
            f"left to BLIS's defaults: {', '.join(missing)}: the configuration does not report them"
        )
    unmodelled = [f"{key}={desc[key]}" for key in NO_BLIS_FLAG if desc.get(key) not in (None, "")]
    if unmodelled:
        notes.append(
            f"no BLIS flag describes {', '.join(unmodelled)}: BLIS simulates its own behaviour"
        )
    if str(desc.get("async_scheduling", "")).lower() == "true":
        notes.append(
            "async scheduling: BLIS does not model its one-step output delay, so BLIS's TTFT "
            "comes out about one decode step shorter than the server's (bench calibrate)"
        )
    return args, notes


def _positive_int(value: object) -> int | None:
    """``value`` as an integer > 0 (labels arrive as strings), else None."""
    if isinstance(value, bool) or value in (None, ""):
        return None
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        return None
    return number if number > 0 else None


def _unnamed(model: str, gpu: str, tp: str) -> list[str]:
    """The ``blis run`` flags (with placeholders) that a snapshot leaves unnamed.

    >>> _unnamed("llama-3.1-8b-instruct", "", "")
    ["--hardware G (with --hardware-config FILE outside BLIS's tree)", '--tp N']
    """
    wanted = (
        (model, "--model M (with --model-config-folder DIR outside BLIS's tree)"),
        (gpu, "--hardware G (with --hardware-config FILE outside BLIS's tree)"),
        (tp, "--tp N"),
    )
    return [flags for named, flags in wanted if not named]


def _unnamed_note(config_id: str, fleet: bool, flags: list[str]) -> str:
    add = ", ".join(flags)
    if fleet:
        return (
            "the fleet vector is one alpha/beta for every configuration, so it names no "
            f"model, GPU or TP: add {add} for the setup you simulate (coeffd pull --model M "
            "--hardware G --tp N --format blis-args prints a whole list, with the "
            "coefficients coeffd predicts for that setup)"
        )
    return f"configuration {config_id} does not name its whole setup: add {add}"


def to_yaml_block(snapshot: Snapshot) -> str:
    """The ``trained_physics_coefficients:`` block for ``defaults.yaml``, with a provenance comment."""
    validate_for_blis(snapshot.alpha, snapshot.beta)
    return (
        f"# coeffd {snapshot.coeffd_version}: configuration {snapshot.config_id}, "
        f"version {snapshot.version}, wall_ns {snapshot.wall_ns}\n"
        f"{BLOCK_KEY}:\n"
        f"  {ALPHA_KEY}: {flow_list(snapshot.alpha)}\n"
        f"  {BETA_KEY}: {flow_list(snapshot.beta)}\n"
    )


def to_json(snapshot: Snapshot) -> bytes:
    """The snapshot as JSON (same bytes as on disk)."""
    return encode_snapshot(snapshot)
