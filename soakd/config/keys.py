"""What a config key declares beside its type and default, and how to read it back.

A key is one declaration in :mod:`soakd.config.schema`::

    rate: Annotated[float, doc("open loop: arrivals", unit="requests/s", gt=0, le=MAX_RATE)] | None = None

``doc`` is a :class:`msgspec.Meta`: msgspec enforces its bounds while it converts the TOML
(:mod:`soakd.config.convert`), and its description and unit are what ``--help`` says
(:func:`soakd.config.keys.flag_help`) and what an error names. A duration key adds
:data:`SECONDS` (or :data:`SECONDS_OR_OFF`): the TOML and the flags then take ``90s``, ``1h30m``.

Why msgspec and not pydantic: the schema stays plain dataclasses (attribute access, no model
base class, ``dataclasses.replace`` and ``asdict`` as before); :func:`msgspec.convert` validates
dataclasses against ``Annotated[..., Meta(...)]`` constraints and reports the failing path
(``$.load.rate``); it is one small C extension that imports in milliseconds (``check-config``
and ``analyze`` start without torch) with no dependencies of its own; it writes a JSON Schema
from the same declarations (:func:`msgspec.json.schema`); and the typed run record uses it too.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any

from msgspec import Meta


@dataclass(frozen=True)
class Duration:
    """Marks a float key as seconds, written ``90s``, ``1h30m``, ``250ms`` or a number."""

    zero: bool = False  # 0 is allowed (and means "off" or "none")


SECONDS = Duration()  # > 0, and >= 1 ms (config/convert.py)
SECONDS_OR_OFF = Duration(zero=True)


@dataclass(frozen=True)
class IntAsText:
    """Marks a text key that also takes a TOML integer (``output_tokens = 128``), read as text."""


INT_AS_TEXT = IntAsText()


def doc(
    what: str,
    *,
    unit: str = "",
    why: str = "",
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Meta:
    """A key's meaning (``--help``), its unit, its bounds and why they hold (the error says it;
    with two bounds, ``why`` is about the upper one)."""
    extra = {name: text for name, text in (("unit", unit), ("why", why)) if text}
    make: Any = Meta  # its overloads allow one lower and one upper bound; msgspec checks that at import
    meta: Meta = make(description=what, extra=extra, ge=ge, gt=gt, le=le, lt=lt)
    return meta


@dataclass(frozen=True)
class KeyInfo:
    """Everything one key declares, gathered from its annotation."""

    path: str  # "load.rate"
    description: str
    unit: str
    why: str
    meta: Meta | None
    duration: Duration | None
    int_as_text: bool
    choices: tuple[str, ...]  # a Literal key's words
    free_form: bool  # a table of anything (model.options): its values are not the config's to check
    default: Any


def _annotations(tp: Any) -> list[Any]:
    """The Annotated extras of ``tp``, looking inside ``X | None`` and ``Literal`` unions."""
    found: list[Any] = []
    if typing.get_origin(tp) is typing.Annotated:
        found.extend(tp.__metadata__)
        found.extend(_annotations(typing.get_args(tp)[0]))
    elif typing.get_origin(tp) in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            found.extend(_annotations(arg))
    return found


def _choices(tp: Any) -> tuple[str, ...]:
    if typing.get_origin(tp) is typing.Literal:
        return tuple(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Annotated, typing.Union, types.UnionType):
        return tuple(c for arg in typing.get_args(tp) for c in _choices(arg))
    return ()


def _free_form(tp: Any) -> bool:
    """``dict[str, Any]`` (under its Annotated): values of any kind, none of them a config key."""
    bare = typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp
    return typing.get_origin(bare) is dict and Any in typing.get_args(bare)


def section_keys(cls: type[Any], prefix: str) -> dict[str, KeyInfo]:
    """Each field of the section dataclass ``cls`` by name, with what it declares."""
    hints = typing.get_type_hints(cls, include_extras=True)
    defaults = cls()
    keys: dict[str, KeyInfo] = {}
    for f in dataclasses.fields(cls):
        extras = _annotations(hints[f.name])
        meta = next((m for m in extras if isinstance(m, Meta)), None)
        extra: dict[str, Any] = dict(meta.extra or {}) if meta is not None else {}
        keys[f.name] = KeyInfo(
            path=f"{prefix}.{f.name}",
            description=(meta.description or "") if meta is not None else "",
            unit=str(extra.get("unit", "")),
            why=str(extra.get("why", "")),
            meta=meta,
            duration=next((m for m in extras if isinstance(m, Duration)), None),
            int_as_text=any(isinstance(m, IntAsText) for m in extras),
            choices=_choices(hints[f.name]),
            free_form=_free_form(hints[f.name]),
            default=getattr(defaults, f.name),
        )
    return keys


def format_seconds(seconds: float) -> str:
    """A duration as a user writes it: ``6h``, ``1h30m``, ``90ms`` (:func:`parse_duration` reads it)."""
    if seconds == 0 or seconds < 1:
        return f"{seconds * 1000:g}ms" if seconds else "0s"
    parts, rest = [], seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size and (rest % size == 0 or unit != "d"):
            whole = int(rest // size)
            parts.append(f"{whole}{unit}")
            rest -= whole * size
    if rest or not parts:
        parts.append(f"{rest:g}s")
    return "".join(parts)


def show_value(value: Any, key: KeyInfo) -> str:
    """A value as a user writes it: durations with their unit, none for unset."""
    if value is None or value == "" or value == [] or value == {}:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"  # as TOML and the flags write it
    if key.duration is not None and isinstance(value, (int, float)):
        return format_seconds(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def bounds_text(key: KeyInfo, unit: str = "") -> str:
    """``>= 1``, ``within [0, 1)``: the key's declared bounds ("" when it has none)."""
    meta = key.meta
    if meta is None:
        return ""
    low, opening = (meta.ge, "[") if meta.ge is not None else (meta.gt, "(")
    high, closing = (meta.le, "]") if meta.le is not None else (meta.lt, ")")
    if low is not None and high is not None:
        return f"within {opening}{low:g}, {high:g}{closing}{unit}"
    if low is not None:
        return f"{'>=' if opening == '[' else '>'} {low:g}{unit}"
    if high is not None:
        return f"{'<=' if closing == ']' else '<'} {high:g}{unit}"
    return ""


def flag_help(key: KeyInfo) -> str:
    """A ``--flag``'s help, all from its key: what it does, its unit and bounds, the key it
    overrides and the key's default."""
    unit = "a duration such as 90s or 1h30m" if key.duration is not None else key.unit
    bounds = bounds_text(key, "s" if key.duration is not None else "")
    default = show_value(key.default, key)
    notes = [f"unit: {unit}" if unit else "", bounds, f"overrides {key.path}", f"default: {default}"]
    return f"{key.description} ({'; '.join(n for n in notes if n)})"
