"""``defaults.yaml`` checked the way BLIS decodes it (``blis-trained-physics.md`` §8.1).

BLIS decodes ``defaults.yaml`` strictly (yaml.v3 with known-fields checking): an unknown
key at any level, a duplicate key or a value of the wrong type is fatal, so a rewrite
that adds so much as a stray key breaks every BLIS run on that machine. The checker walks
the composed node tree against BLIS's declared Go structs and reports every problem with
its line; :mod:`.defaults_rewrite` checks both its input and its result with it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from coeffd.daemon.publish.blis import ALPHA_KEY, BETA_KEY, BLOCK_KEY
from coeffd.daemon.publish.snapshot import InvalidCoefficientsError, validate_for_blis

__all__ = [
    "TOP_LEVEL_KEYS",
    "DefaultsYamlError",
    "check_defaults_text",
    "compose",
    "validate_defaults_yaml",
]


class DefaultsYamlError(ValueError):
    """A ``defaults.yaml`` BLIS would refuse to load (strict schema, §8.1), or one we won't rewrite.

    ``problems``: every one, with its line; ``unknown``: the ``(where, field)`` of each
    field the schema does not declare; :meth:`summary` says it in one short line.
    """

    def __init__(
        self,
        problems: Sequence[str],
        unknown: Sequence[tuple[str, str]] = (),
        root_keys: int | None = None,
    ) -> None:
        self.problems = list(problems)
        self.unknown = list(unknown)
        #: how many top-level keys the document has (None: not known)
        self.root_keys = root_keys
        super().__init__("; ".join(self.problems))

    def summary(self) -> str:
        """What is wrong and what to do, in one line (a file of an older or newer BLIS
        repeats one unknown field per model: said once, with the count).

        >>> print(DefaultsYamlError(["<root>: field foo not found in type (line 1)"],
        ...                         [("<root>", "foo")]).summary())  # doctest: +ELLIPSIS
        this is not a BLIS defaults.yaml: its top-level keys (foo) are none of BLIS's (...
        >>> e = DefaultsYamlError(["x"] * 29, [(f"defaults.m{i}", "vllm_version") for i in range(29)])
        >>> e.summary()  # doctest: +ELLIPSIS
        'this defaults.yaml has fields this coeffd does not know (vllm_version, 29 entries): ...'
        """
        if not self.unknown:
            shown = "; ".join(self.problems[:3])
            more = len(self.problems) - 3
            return shown + (f" (and {more} more)" if more > 0 else "")
        root = [f for where, f in self.unknown if where == "<root>"]
        if root and len(root) == (self.root_keys or len(self.unknown)):
            return (
                f"this is not a BLIS defaults.yaml: its top-level keys ({', '.join(root[:5])}) "
                f"are none of BLIS's ({', '.join(TOP_LEVEL_KEYS)}); pass the defaults.yaml "
                "from your BLIS checkout (or a copy of it)"
            )
        names = list(dict.fromkeys(f for _w, f in self.unknown))
        listed = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
        other = len(self.problems) - len(self.unknown)
        return (
            f"this defaults.yaml has fields this coeffd does not know ({listed}, "
            f"{len(self.unknown)} entries): it comes from a newer or older BLIS than the "
            "schema coeffd checks against, so coeffd will not guess whether that BLIS loads "
            "the rewrite. Use the defaults.yaml of the BLIS you run, or leave the file alone "
            "and pass the coefficients as flags: coeffd pull --config ID --format blis-args"
            + (f" (also {other} other problem(s): {self.problems[0]})" if other > 0 else "")
        )


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
        self.unknown: list[tuple[str, str]] = []
        self.root_keys = 0

    def unknown_field(self, node: Node, path: str, key: str) -> None:
        self.unknown.append((path, key))
        self.fail(node, path, f"field {key} not found in type")

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
                self.unknown_field(knode, path, key)
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
        found = self.items(root, "<root>")
        self.root_keys = len(found)
        for key, knode, vnode in found:
            if key not in TOP_LEVEL_KEYS:
                self.unknown_field(knode, "<root>", key)
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
                        self.unknown_field(sknode, key, sub)
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


def compose(text: str) -> Node | None:
    """The node tree of ``text``; a YAML syntax error is a ``DefaultsYamlError``."""
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
    alpha, beta = checker.document(compose(text))
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
        raise DefaultsYamlError(problems, checker.unknown, checker.root_keys)
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
