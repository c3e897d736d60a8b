"""Typed reads of OTLP attributes, compiled into one straight-line parser per record kind.

The decoder's cost is protobuf accessor calls (~100–200 ns each, one Python wrapper per
access), so each span/event kind gets a generated function (:func:`compile_parser`) that
reads exactly its keys with the fewest accessor calls, checks types and ranges, and
builds its record positionally. A bad value raises :class:`Reject` with the reason label
the decoder counts (``missing:<key>``, ``type:<key>``, ``nonfinite:<key>``,
``range:<key>``); which kinds exist and their keys are in :mod:`.kinds`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from coeffd.records.events import Record

__all__ = [
    "FLOAT",
    "INT",
    "MAX_COUNT",
    "MAX_NS",
    "NS",
    "SECONDS",
    "STR",
    "Field",
    "Reject",
    "compile_parser",
]

#: Largest integer accepted for counts, steps and token numbers. Real values are far
#: below (steps ~1e9 after years of uptime); anything above is corruption.
MAX_COUNT = 1 << 48
#: Largest accepted nanosecond timestamp (int64 max: what OTLP can carry).
MAX_NS = (1 << 63) - 1


class Reject(Exception):
    """A span or event is bad; ``args[0]`` is the reason label."""


# Type codes of attribute slots.
INT = 0  # non-negative int, accepts an integral double, bounded by MAX_COUNT
NS = 1  # non-negative int nanoseconds, bounded by MAX_NS
FLOAT = 2  # finite float, accepts int
STR = 3  # string
SECONDS = 4  # finite float seconds → int nanoseconds


def _int_slow(v: AnyValue, key: str, required: bool, hi: int) -> int | None:
    """Integer slot whose fast read gave 0: unset, zero, an integral double, or bad."""
    which = v.WhichOneof("value")
    if which == "int_value":
        return 0
    if which is None:
        if required:
            raise Reject("missing:" + key)
        return None
    if which == "double_value":
        d = v.double_value
        if not math.isfinite(d):
            raise Reject("nonfinite:" + key)
        if not d.is_integer():
            raise Reject("type:" + key)
        if d < 0 or d > hi:
            raise Reject("range:" + key)
        return int(d)
    raise Reject("type:" + key)


def _float_slow(v: AnyValue, key: str, required: bool) -> float | None:
    """Float slot whose fast read gave 0.0: unset, zero, an int, or a type error."""
    which = v.WhichOneof("value")
    if which == "double_value":
        return 0.0
    if which == "int_value":
        return float(v.int_value)
    if which is None:
        if required:
            raise Reject("missing:" + key)
        return None
    raise Reject("type:" + key)


def _str_slow(v: AnyValue, key: str, required: bool) -> str | None:
    """String slot whose fast read gave ``""``: unset, empty string, or a type error."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return ""
    if which is None:
        if required:
            raise Reject("missing:" + key)
        return None
    raise Reject("type:" + key)


Field = tuple[str, int, bool]  # (attribute key, type code, required)


def compile_parser(
    name: str,
    fields: tuple[Field, ...],
    ctor: str,
    post: tuple[str, ...] = (),
    env: Mapping[str, Any] | None = None,
    params: str = "obj, info, wall=0",
) -> Callable[..., Record]:
    """Generate ``name(obj, info, wall=0) -> Record`` for one span or event kind
    (``params`` adds parameters that ``ctor`` may use).

    The function reads ``fields`` from ``obj.attributes`` (a protobuf map, see
    ``fastproto``) into ``x0, x1, …``, runs the ``post`` check lines, and returns
    ``ctor`` (an expression using ``info``, ``wall``, ``obj`` and ``{args}`` =
    ``x0, x1, …``). Straight-line generated code, one block per key with constants
    inlined, instead of a loop over a table: no per-attribute tuple unpacking, type
    dispatch or extra call frames, which together cost as much as the protobuf reads.

    Fast paths read the expected oneof arm directly: a non-zero/non-empty result proves
    the arm (unset arms read as their default), so ``WhichOneof`` only runs for zeros
    and empties, and the helper functions only for the rare odd cases (a double where an
    int is expected, wrong types, missing keys). Optional keys are tested with ``in``
    first because ``attrs[key]`` on a message map inserts an empty value for an absent
    key (harmless, but slower than the test).
    """
    lines = [f"def {name}({params}):", "    at = obj.attributes"]
    for i, (key, t, req) in enumerate(fields):
        k, x = repr(key), f"x{i}"
        ind = "    "
        if not req:
            lines += [f"    if {k} not in at:", f"        {x} = None", "    else:"]
            ind = "        "
        lines.append(f"{ind}v = at[{k}]")
        if t in (INT, NS):
            hi = "MAX_COUNT" if t == INT else "MAX_NS"
            lines += [
                f"{ind}{x} = v.int_value",
                f"{ind}if {x}:",
                f"{ind}    if {x} < 0 or {x} > {hi}:",
                f"{ind}    " + f"    raise Reject({'range:' + key!r})",
                f"{ind}elif v.WhichOneof('value') != 'int_value':",
                f"{ind}    {x} = _int_slow(v, {k}, {req}, {hi})",
            ]
        elif t in (FLOAT, SECONDS):
            lines += [
                f"{ind}{x} = v.double_value",
                f"{ind}if {x}:",
                f"{ind}    if {x} - {x} != 0.0:",  # NaN or ±inf; cheaper than isfinite
                f"{ind}        raise Reject({'nonfinite:' + key!r})",
                f"{ind}else:",
                f"{ind}    {x} = _float_slow(v, {k}, {req})",
            ]
            if t == SECONDS:
                lines += [
                    f"{ind}if {x} is not None:",
                    f"{ind}    if {x} < 0.0 or {x} > 9.2e9:",
                    f"{ind}        raise Reject({'range:' + key!r})",
                    f"{ind}    {x} = round({x} * 1e9)",
                ]
        else:
            lines += [
                f"{ind}{x} = v.string_value",
                f"{ind}if not {x} and v.WhichOneof('value') != 'string_value':",
                f"{ind}    {x} = _str_slow(v, {k}, {req})",
            ]
    lines += ["    " + line for line in post]
    args = ", ".join(f"x{i}" for i in range(len(fields)))
    lines.append("    return " + ctor.format(args=args))
    namespace: dict[str, Any] = {
        "Reject": Reject,
        "_int_slow": _int_slow,
        "_float_slow": _float_slow,
        "_str_slow": _str_slow,
        "MAX_COUNT": MAX_COUNT,
        "MAX_NS": MAX_NS,
        **(env or {}),
    }
    exec(compile("\n".join(lines), f"<decode:{name}>", "exec"), namespace)
    fn: Callable[..., Record] = namespace[name]
    return fn
