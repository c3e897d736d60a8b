"""What BLIS reads: CLI flags, the ``defaults.yaml`` coefficient block, and in-place rewrites.

Spec: ``blis-trained-physics.md`` §7 (validation) and §8 (``defaults.yaml`` strict schema,
flags). BLIS decodes ``defaults.yaml`` strictly (yaml.v3 with known-fields checking):
an unknown key at any level, a duplicate key or a value of the wrong type is fatal, so a
rewrite that adds so much as a stray key breaks every BLIS run on that machine.
``rewrite_defaults`` therefore validates the *result* with ``validate_defaults_yaml``
before it atomically replaces the file, and leaves the file untouched on any doubt.

Rewrites splice the two flow lists into the original text at the positions ruamel.yaml
reports, so every other byte (comments, alignment, key order, number spellings) is
preserved; only when the block lacks a list does it fall back to a ruamel round-trip dump.
"""

from __future__ import annotations

import difflib
import io
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from coeffd.daemon.publish.atomic import atomic_write_text
from coeffd.daemon.publish.snapshot import (
    InvalidCoefficientsError,
    Snapshot,
    encode_snapshot,
    validate_for_blis,
)

BLOCK_KEY = "trained_physics_coefficients"
ALPHA_KEY = "alpha_coeffs"
BETA_KEY = "beta_coeffs"


class DefaultsYamlError(ValueError):
    """A ``defaults.yaml`` BLIS would refuse to load (strict schema, §8.1), or one we won't rewrite."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


# ----------------------------------------------------------------------------- formats


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
    """
    validate_for_blis(snapshot.alpha, snapshot.beta)
    ref = snapshot.configuration
    desc = {**ref.labels, **{k: v for k, v in ref.description.items() if v not in (None, "")}}
    notes: list[str] = []
    model, gpu = str(desc.get("model", "")), str(desc.get("gpu", ""))
    tp = int(desc.get("tp", 1) or 1)
    dp = int(desc.get("dp", 1) or 1)
    if not model or not gpu:
        notes.append(f"configuration {ref.id} names no model/GPU: add --model, --hardware, --tp")
    args = ["--latency-model", "trained-physics"]
    if model:
        args += ["--model", model]
    if gpu:
        args += ["--hardware", gpu]
    args += ["--tp", str(tp)]
    if dp > 1:
        args += ["--dp", str(dp)]
    if str(desc.get("ep", "")).lower() in ("true", "1"):
        args.append("--enable-expert-parallel")
    if desc.get("moe_comm_backend"):
        args += ["--moe-comm-backend", str(desc["moe_comm_backend"])]
    folder, sheet = _bundled_sheets(model, gpu)
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
    if defaults_path is not None:
        args += ["--defaults-filepath", str(Path(defaults_path).absolute())]
    else:
        args += to_flag_args(snapshot)
    return args, notes


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


# ------------------------------------------------------------------- strict validation

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_NULL = "tag:yaml.org,2002:null"

# Declared Go types of BLIS's config structs (§8.1). "str"/"int"/"float" scalars.
_DEFAULTS_ENTRY = {"GPU": "str", "tensor_parallelism": "int", "hf_repo": "str"}
_WORKLOAD = dict.fromkeys(
    (
        "prefix_tokens",
        "prompt_tokens",
        "prompt_tokens_stdev",
        "prompt_tokens_min",
        "prompt_tokens_max",
        "output_tokens",
        "output_tokens_stdev",
        "output_tokens_min",
        "output_tokens_max",
    ),
    "int",
)
_LORA = {
    "load_base_latency_us": "float",
    "load_bandwidth_bytes_us": "float",
    "footprint_bytes_per_rank": "float",
    "step_overhead_tiers": "tiers",
}
_TIER = {"k6": "float", "k7": "float"}
_KV_DEVICE = {
    "read_bandwidth": "float",
    "write_bandwidth": "float",
    "base_latency": "float",
    "saturation_queue_depth": "int",
    "single_transfer_fraction": "float",
    "latency_jitter_stddev": "float",
    "buffered_read_bandwidth": "float",
    "buffered_write_bandwidth": "float",
    "buffered_base_latency": "float",
    "buffered_saturation_queue_depth": "int",
    "buffered_single_transfer_fraction": "float",
    "buffered_latency_jitter_stddev": "float",
}
TOP_LEVEL_KEYS = (
    "defaults",
    "version",
    "workloads",
    BLOCK_KEY,
    "lora",
    "kv_offload_devices",
)


def _tag(node: Node) -> str:
    return str(getattr(node.tag, "value", node.tag))


def _where(node: Node) -> str:
    return f"line {node.start_mark.line + 1}"


class _Checker:
    """Walks a composed YAML node tree against BLIS's declared structs."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, node: Node, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message} ({_where(node)})")

    def items(self, node: Node, path: str) -> list[tuple[str, Node, Node]]:
        """Keys of a mapping node; reports non-maps and duplicate keys (yaml.v3 rejects them)."""
        if isinstance(node, ScalarNode) and _tag(node) == _NULL:
            return []  # yaml.v3 decodes null into a zero-valued struct/map
        if not isinstance(node, MappingNode):
            self.fail(node, path, "expected a mapping")
            return []
        seen: set[str] = set()
        out = []
        for knode, vnode in node.value:
            key = str(knode.value) if isinstance(knode, ScalarNode) else "<complex key>"
            if key in seen:
                self.fail(knode, path, f"duplicate key {key!r}")
                continue
            seen.add(key)
            out.append((key, knode, vnode))
        return out

    def scalar(self, node: Node, path: str, kind: str) -> None:
        if not isinstance(node, ScalarNode):
            self.fail(node, path, f"expected a {kind} scalar")
            return
        tag = _tag(node)
        if tag == _NULL:
            return  # yaml.v3 leaves the zero value
        if kind == "str":
            return  # yaml.v3 decodes any scalar into a string field
        if kind == "int":
            if tag == _INT:
                return
            if tag == _FLOAT:  # yaml.v3 accepts a float that fits an int64
                try:
                    value = float(str(node.value).replace("_", ""))
                except ValueError:
                    value = math.nan
                if math.isfinite(value) and abs(value) < 2**63:
                    return
            self.fail(node, path, f"cannot decode {node.value!r} into int")
            return
        if tag not in (_INT, _FLOAT):
            self.fail(node, path, f"cannot decode {node.value!r} into float64")

    def struct(self, node: Node, path: str, fields: dict[str, str]) -> None:
        for key, knode, vnode in self.items(node, path):
            kind = fields.get(key)
            if kind is None:
                self.fail(knode, path, f"field {key} not found in type")
            elif kind == "tiers":
                self.tiers(vnode, f"{path}.{key}")
            else:
                self.scalar(vnode, f"{path}.{key}", kind)

    def tiers(self, node: Node, path: str) -> None:
        for key, knode, vnode in self.items(node, path):
            if _tag(knode) != _INT:
                self.fail(knode, path, f"tier key {key!r} is not an int")
            self.struct(vnode, f"{path}.{key}", _TIER)

    def numbers(self, node: Node, path: str) -> list[float] | None:
        if not isinstance(node, SequenceNode):
            self.fail(node, path, "expected a list of numbers")
            return None
        out: list[float] = []
        for i, item in enumerate(node.value):
            if not isinstance(item, ScalarNode) or _tag(item) not in (_INT, _FLOAT):
                self.fail(item, f"{path}[{i}]", "expected a number")
                return None
            try:
                out.append(float(str(item.value).replace("_", "")))
            except ValueError:
                # YAML 1.2 spellings Python can't parse (.inf, .nan, 0x10, 0o7)
                out.append(_yaml_number(str(item.value)))
        return out

    def document(self, root: Node | None) -> tuple[list[float] | None, list[float] | None]:
        alpha = beta = None
        if root is None:
            return None, None
        for key, knode, vnode in self.items(root, "<root>"):
            if key not in TOP_LEVEL_KEYS:
                self.fail(knode, "<root>", f"field {key} not found in type")
            elif key == "version":
                self.scalar(vnode, key, "str")
            elif key == "defaults":
                for model, _k, entry in self.items(vnode, key):
                    self.struct(entry, f"defaults.{model}", _DEFAULTS_ENTRY)
            elif key == "workloads":
                for name, _k, entry in self.items(vnode, key):
                    self.struct(entry, f"workloads.{name}", _WORKLOAD)
            elif key == "lora":
                self.struct(vnode, key, _LORA)
            elif key == "kv_offload_devices":
                for name, _k, entry in self.items(vnode, key):
                    self.struct(entry, f"kv_offload_devices.{name}", _KV_DEVICE)
            elif key == BLOCK_KEY:
                for sub, sknode, svnode in self.items(vnode, key):
                    if sub == ALPHA_KEY:
                        alpha = self.numbers(svnode, f"{key}.{sub}")
                    elif sub == BETA_KEY:
                        beta = self.numbers(svnode, f"{key}.{sub}")
                    else:
                        self.fail(sknode, key, f"field {sub} not found in type")
        return alpha, beta


def _yaml_number(text: str) -> float:
    t = text.replace("_", "").lower()
    sign = -1.0 if t.startswith("-") else 1.0
    body = t.lstrip("+-")
    if body == ".inf":
        return sign * math.inf
    if body == ".nan":
        return math.nan
    return sign * float(int(body, 0))


def _compose(text: str) -> Node | None:
    try:
        return YAML().compose(text)  # type: ignore[no-any-return]
    except YAMLError as exc:
        raise DefaultsYamlError([f"YAML parse error: {exc}"]) from exc


def check_defaults_text(
    text: str, *, require_coefficients: bool = False
) -> tuple[list[float] | None, list[float] | None]:
    """Validate ``defaults.yaml`` text like BLIS does; return the (α, β) lists if present.

    With ``require_coefficients`` the block must exist with both lists and pass BLIS's
    coefficient rules (α ≥ 3, β ≥ 7, finite, non-negative, β not all zeros).
    Raises ``DefaultsYamlError`` listing every problem found.
    """
    checker = _Checker()
    alpha, beta = checker.document(_compose(text))
    problems = checker.problems
    if not problems and require_coefficients:
        if alpha is None or beta is None:
            problems.append(f"{BLOCK_KEY}: both {ALPHA_KEY} and {BETA_KEY} must be present")
        else:
            try:
                validate_for_blis(alpha, beta, exact_lengths=False)
            except InvalidCoefficientsError as exc:
                problems.append(f"{BLOCK_KEY}: {exc}")
    if problems:
        raise DefaultsYamlError(problems)
    return alpha, beta


def validate_defaults_yaml(
    path: str | os.PathLike[str], *, require_coefficients: bool = True
) -> tuple[list[float], list[float]] | None:
    """Validate a ``defaults.yaml`` file with BLIS's strict decoding rules (§8.1).

    Returns the coefficient lists (or None when the optional block is absent and not
    required); raises ``DefaultsYamlError``.
    """
    alpha, beta = check_defaults_text(
        Path(path).read_text(encoding="utf-8"), require_coefficients=require_coefficients
    )
    if alpha is None or beta is None:
        return None
    return alpha, beta


# ----------------------------------------------------------------------------- rewrite


def _find_block(root: Node | None) -> tuple[bool, dict[str, tuple[Node, Node]]]:
    """Whether the block key exists, and its (key, value) nodes by key."""
    if not isinstance(root, MappingNode):
        return False, {}
    for knode, vnode in root.value:
        if isinstance(knode, ScalarNode) and knode.value == BLOCK_KEY:
            if not isinstance(vnode, MappingNode):
                return True, {}
            return True, {str(k.value): (k, v) for k, v in vnode.value if isinstance(k, ScalarNode)}
    return False, {}


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _line_end(text: str, index: int) -> int:
    """Index just past the newline ending the line at ``index`` (or the text's end)."""
    nl = text.find("\n", index)
    return len(text) if nl < 0 else nl + 1


def _list_edits(
    text: str, key: Node, value: Node, values: Sequence[float]
) -> list[tuple[int, int, str]]:
    """(start, end, replacement) edits that set one coefficient list to ``values``.

    A flow list (``[..]``, BLIS's style) is replaced in place, so a comment after it stays.
    A block list (``- x`` lines) keeps its style: each item's number is replaced where it
    stands (its inline comment stays), extra values get new ``- x`` lines indented like
    the last item, surplus items' lines are removed. Anything else (a null value) becomes
    a flow list after the key's colon.
    """
    if isinstance(value, SequenceNode) and value.flow_style:
        return [(value.start_mark.index, value.end_mark.index, flow_list(values))]
    if isinstance(value, SequenceNode) and value.value:
        items: list[Node] = value.value
        edits = [
            (item.start_mark.index, item.end_mark.index, format_float_yaml(v))
            for item, v in zip(items, values, strict=False)
        ]
        last = items[-1]
        if len(values) > len(items):
            prefix = text[_line_start(text, last.start_mark.index) : last.start_mark.index]
            at = _line_end(text, last.end_mark.index)
            lead = "" if text[:at].endswith("\n") else "\n"
            added = "".join(f"{prefix}{format_float_yaml(v)}\n" for v in values[len(items) :])
            edits.append((at, at, lead + added))
        elif len(values) < len(items):
            start = _line_start(text, items[len(values)].start_mark.index)
            edits.append((start, _line_end(text, last.end_mark.index), ""))
        return edits
    colon = text.index(":", key.end_mark.index)
    return [(colon, value.end_mark.index, ": " + flow_list(values))]


def render_defaults(
    text: str, alpha: Sequence[float], beta: Sequence[float], comment: str | None = None
) -> str:
    r"""Return ``text`` with its coefficient block set to ``alpha``/``beta`` (no I/O).

    ``comment`` (one line, ``# coeffd…``) replaces the ``# coeffd`` comment lines right
    above the block, or is inserted there: it says which vector the block holds.

    Raises ``InvalidCoefficientsError`` or ``DefaultsYamlError`` when the input or the
    result would not load in BLIS.

    A block-style list stays block-style, comments included:

    >>> text = "trained_physics_coefficients:\n  alpha_coeffs:\n    - 1.0  # queueing\n" \
    ...     "    - 2.0\n    - 3.0\n  beta_coeffs: [1, 1, 1, 1, 1, 1, 1]\n"
    >>> print(render_defaults(text, [4.0, 5.0, 6.0], [2.0] * 8), end="")
    trained_physics_coefficients:
      alpha_coeffs:
        - 4.0  # queueing
        - 5.0
        - 6.0
      beta_coeffs: [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    """
    validate_for_blis(alpha, beta, exact_lengths=False)
    # The input must itself be a valid BLIS file: we never "repair" a file we don't understand.
    check_defaults_text(text)
    root = _compose(text)
    present, nodes = _find_block(root)
    a_nodes, b_nodes = nodes.get(ALPHA_KEY), nodes.get(BETA_KEY)
    if a_nodes is not None and b_nodes is not None:
        # Splice from the end so the earlier offsets stay valid.
        edits = sorted(
            _list_edits(text, *a_nodes, alpha) + _list_edits(text, *b_nodes, beta),
            reverse=True,
        )
        out = text
        for start, end, replacement in edits:
            out = out[:start] + replacement + out[end:]
    elif not present:
        # No block: append one; the rest of the file stays byte-for-byte.
        prefix = text if (not text or text.endswith("\n")) else text + "\n"
        out = (
            f"{prefix}{BLOCK_KEY}:\n"
            f"  {ALPHA_KEY}: {flow_list(alpha)}\n"
            f"  {BETA_KEY}: {flow_list(beta)}\n"
        )
    else:
        out = _round_trip(text, alpha, beta)
    if comment is not None:
        out = _block_comment(out, comment)
    got_alpha, got_beta = check_defaults_text(out, require_coefficients=True)
    if got_alpha != [float(v) for v in alpha] or got_beta != [float(v) for v in beta]:
        raise DefaultsYamlError(["rewritten block does not read back to the requested values"])
    return out


#: The comments coeffd writes above the block (``# coeffd[ VERSION]: …``), replaced on rewrite.
_OWN_COMMENT = re.compile(r"^# coeffd(?: \S+)?: ")


def own_comment(text: str) -> str | None:
    r"""coeffd's comment right above the coefficient block, if there is one.

    >>> own_comment("# coeffd 1.0: fleet vector\ntrained_physics_coefficients:\n")
    '# coeffd 1.0: fleet vector'
    >>> own_comment("# coeffd test fixture\ntrained_physics_coefficients:\n") is None
    True
    """
    lines = text.splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.startswith(f"{BLOCK_KEY}:")), None)
    if at is None or at == 0 or not _OWN_COMMENT.match(lines[at - 1]):
        return None
    return lines[at - 1]


def _block_comment(text: str, comment: str) -> str:
    r"""``text`` with ``comment`` as the only ``# coeffd`` line above the block key.

    >>> _block_comment("a: 1\n# coeffd: old\ntrained_physics_coefficients:\n", "# coeffd: new")
    'a: 1\n# coeffd: new\ntrained_physics_coefficients:\n'
    """
    line = "# " + comment.lstrip("# ").replace("\n", " ").replace("\r", " ")
    lines = text.splitlines(keepends=True)
    at = next((i for i, ln in enumerate(lines) if ln.startswith(f"{BLOCK_KEY}:")), None)
    if at is None:
        return text
    start = at
    while start > 0 and _OWN_COMMENT.match(lines[start - 1]):
        start -= 1
    return "".join([*lines[:start], line + "\n", *lines[at:]])


def _round_trip(text: str, alpha: Sequence[float], beta: Sequence[float]) -> str:
    """Fallback for unusual blocks (one list missing, null block): ruamel round-trip dump."""
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 1 << 16  # never fold BLIS's one-line lists
    data: Any = yaml.load(text)
    block = data.get(BLOCK_KEY)
    if not isinstance(block, CommentedMap):
        block = CommentedMap()
        data[BLOCK_KEY] = block
    for key, values in ((ALPHA_KEY, alpha), (BETA_KEY, beta)):
        seq = CommentedSeq([float(v) for v in values])
        seq.fa.set_flow_style()
        block[key] = seq
    buf = io.StringIO()
    yaml.dump(data, buf)
    return buf.getvalue()


@dataclass(frozen=True)
class DefaultsUpdate:
    """A planned rewrite of a ``defaults.yaml``: nothing is written until :meth:`apply`.

    ``target`` is the real file (symlinks resolved): the rewrite replaces that file, so a
    ``defaults.yaml`` that is a link into BLIS's tree stays a link and BLIS sees the change.
    """

    path: Path
    target: Path
    old: str
    new: str

    @property
    def changed(self) -> bool:
        return self.new != self.old

    def diff(self) -> str:
        """A unified diff of the rewrite ("" when nothing changes)."""
        name = str(self.path)
        return "".join(
            difflib.unified_diff(
                self.old.splitlines(keepends=True),
                self.new.splitlines(keepends=True),
                fromfile=name,
                tofile=name + " (rewritten)",
            )
        )

    def apply(self, *, backup: bool = False) -> Path | None:
        """Write the new text atomically; with ``backup`` first copy the file to
        ``<target>.bak`` (returned). Nothing happens when nothing changes."""
        if not self.changed:
            return None
        saved = None
        if backup:
            saved = self.target.with_name(self.target.name + BACKUP_SUFFIX)
            atomic_write_text(saved, self.old, mode=self.target.stat().st_mode & 0o7777)
        atomic_write_text(self.target, self.new)
        return saved


BACKUP_SUFFIX = ".bak"


def plan_defaults_update(
    path: str | os.PathLike[str],
    alpha: Sequence[float],
    beta: Sequence[float],
    comment: str | None = None,
) -> DefaultsUpdate:
    """Read ``path`` (through symlinks) and render its new text; raises like
    :func:`render_defaults`, or ``OSError`` when the file cannot be read."""
    target = Path(path).resolve()
    raw = target.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DefaultsYamlError([f"{path}: not UTF-8: {exc}"]) from exc
    return DefaultsUpdate(Path(path), target, text, render_defaults(text, alpha, beta, comment))


def rewrite_defaults(
    path: str | os.PathLike[str], alpha: Sequence[float], beta: Sequence[float]
) -> Path:
    """Rewrite only the ``trained_physics_coefficients`` block of a BLIS ``defaults.yaml``.

    Atomic (temp file + fsync + rename): BLIS never reads a half-written file. A symlink
    is followed (the file it points to is rewritten). On any error the file is left
    untouched and ``InvalidCoefficientsError`` / ``DefaultsYamlError`` is raised.
    """
    update = plan_defaults_update(path, alpha, beta)
    update.apply()
    return update.target
