"""Rewriting the coefficient block of a BLIS ``defaults.yaml`` in place.

Rewrites splice the two flow lists into the original text at the positions ruamel.yaml
reports, so every other byte (comments, alignment, key order, number spellings) is
preserved; only when the block lacks a list does it fall back to a ruamel round-trip
dump. The input must pass :mod:`.defaults_schema` and so must the result, which must also
read back to the requested values; on any doubt the file is left untouched. Writes are
atomic (temp file + fsync + rename), through symlinks.
"""

from __future__ import annotations

import difflib
import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from coeffd.daemon.publish.atomic import atomic_write_text
from coeffd.daemon.publish.blis import (
    ALPHA_KEY,
    BETA_KEY,
    BLOCK_KEY,
    flow_list,
    format_float_yaml,
)
from coeffd.daemon.publish.defaults_schema import DefaultsYamlError, check_defaults_text, compose
from coeffd.daemon.publish.snapshot import validate_for_blis

__all__ = [
    "BACKUP_SUFFIX",
    "DefaultsUpdate",
    "own_comment",
    "plan_defaults_update",
    "render_defaults",
    "rewrite_defaults",
]


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
    root = compose(text)
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
