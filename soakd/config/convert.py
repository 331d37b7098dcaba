"""TOML values (and ``--flag`` overrides, as strings) into :class:`Config` with
:func:`msgspec.convert`, which checks each key's type and the bounds declared on it
(:mod:`soakd.config.schema`). Every error is one ConfigError naming the key path and the value:
msgspec's ``Expected `int` >= 1 - at `$.load.concurrency``` becomes
``load.concurrency: must be >= 1, got 0``.

Around the conversion: unknown keys are refused first (with the closest known key); duration
keys are parsed from ``90s``/``1h30m`` (msgspec has no duration type); and afterwards every
number is checked to fit the 64-bit integers and finite floats the database and reports hold."""

from __future__ import annotations

import difflib
import functools
import math
import re
import typing
from typing import Any

import msgspec

from soakd.config.bounds import MAX_INT, MIN_TIMER
from soakd.config.keys import KeyInfo, section_keys, show_value
from soakd.config.parse import parse_duration
from soakd.config.schema import Config
from soakd.errors import ConfigError


@functools.cache
def config_keys() -> dict[str, dict[str, KeyInfo]]:
    """Every section's keys with what they declare: ``config_keys()["load"]["rate"]``."""
    return {name: section_keys(cls, name) for name, cls in typing.get_type_hints(Config).items()}


def build(data: dict[str, Any]) -> Config:
    """The typed config from a TOML-like dict (sections of keys); ConfigError naming the key."""
    _refuse_unknown(data)
    data = {name: _read_special(name, table) if isinstance(table, dict) else table for name, table in data.items()}
    try:
        cfg = msgspec.convert(data, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(_explain(str(exc), data)) from None
    for section, keys in config_keys().items():
        for name, key in keys.items():
            if not key.free_form:  # model.options: the factory's own keywords, checked by the factory
                _check_numbers(getattr(getattr(cfg, section), name), key.path)
    return cfg


def _suggest(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f"did you mean {close[0]}? " if close else ""


def _refuse_unknown(data: dict[str, Any]) -> None:
    keys = config_keys()
    for name, table in data.items():
        if name not in keys:
            known = sorted(keys)
            raise ConfigError(f"{name}: unknown section ({_suggest(name, known)}known: {', '.join(known)})")
        for key in table if isinstance(table, dict) else ():
            if key not in keys[name]:
                known = sorted(keys[name])
                raise ConfigError(f"{name}.{key}: unknown key ({_suggest(key, known)}known: {', '.join(known)})")


def _read_special(section: str, table: dict[str, Any]) -> dict[str, Any]:
    """Durations to seconds, and a TOML integer for a text key to text."""
    out = dict(table)
    for name, value in table.items():
        key = config_keys()[section][name]
        if key.duration is not None and value is not None:
            out[name] = _seconds(key, value)
        elif key.int_as_text and isinstance(value, int) and not isinstance(value, bool):
            out[name] = str(value)
    return out


def _seconds(key: KeyInfo, value: Any) -> float:
    assert key.duration is not None
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{key.path}: {exc}") from None
    if seconds < 0 or (seconds == 0 and not key.duration.zero):
        raise ConfigError(f"{key.path}: duration must be {'>= 0' if key.duration.zero else '> 0'}, got {value!r}")
    if 0 < seconds < MIN_TIMER:
        raise ConfigError(
            f"{key.path}: must be 0 or >= {MIN_TIMER * 1000:g}ms (finer than a thread's wake-up), got {seconds:g}s"
        )
    return seconds


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "true or false",
    "object": "a table",
    "array": "a list",
}
_ERROR = re.compile(r"(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


def _explain(message: str, data: dict[str, Any]) -> str:
    """msgspec's error as ``key.path: what is wrong, got VALUE``."""
    m = _ERROR.match(message)
    assert m is not None
    what, where = m["what"], (m["path"] or "").lstrip(".")
    value = _lookup(data, where)
    where = where.replace("[...]", "")
    section, _, name = where.partition(".")
    key = config_keys().get(section, {}).get(name.split("[")[0])
    expected = re.match(r"Expected `([^`|]+)[^`]*`, got `", what)
    if expected:
        return f"{where}: expected {_TYPE_WORDS.get(expected[1].strip(), expected[1])}, got {value!r}"
    if key is not None and key.choices and what.startswith("Invalid enum value"):
        numeric = key.meta is not None and (key.meta.ge, key.meta.gt, key.meta.le, key.meta.lt) != (None,) * 4
        words = [*key.choices, *(["a number"] if numeric else [])]  # slo.max_error_ratio: 0.01 or "none"
        listed = ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]
        return f"{where}: expected {listed}, got {value!r}"
    if isinstance(value, (int, float, str)) and not isinstance(value, bool) and _not_finite(value):
        return f"{where}: must be a finite number, got {value!r}"
    broken = re.match(r"Expected `\w+` (>=|>|<=|<) (\S+)$", what)
    if key is not None and key.meta is not None and broken and "[" not in where:
        return f"{where}: {_bound(key, broken[1], broken[2])}, got {_shown(value, key)}"
    if broken:  # an item of a list
        return f"{where}: must be {broken[1]} {float(broken[2]):g}, got {value!r}"
    return f"{where}: {what[0].lower()}{what[1:]}, got {value!r}"


def _lookup(data: dict[str, Any], path: str) -> Any:
    """The value at ``load.rate`` or ``target.watch_pid[1]``; for a table's ``[...]``, its first
    value that is not a number (what msgspec refuses there)."""
    value: Any = data
    for part in re.findall(r"[^.\[\]]+|\[[^\]]*\]", path):
        if part == "[...]" and isinstance(value, dict):
            value = next((v for v in value.values() if not isinstance(v, (int, float))), value)
        elif part.startswith("[") and isinstance(value, list):
            value = value[int(part[1:-1])]
        elif isinstance(value, dict):
            value = value.get(part)
    return value


def _not_finite(value: int | float | str) -> bool:
    try:
        return not math.isfinite(float(value))
    except (ValueError, OverflowError):
        return False


def _bound(key: KeyInfo, op: str, bound: str) -> str:
    """``must be >= 1``, ``must be <= 1e+06 requests/s (why)``: the bound msgspec found broken, and
    why it holds (a key's ``why`` is about its upper bound, when it has two)."""
    meta = key.meta
    assert meta is not None
    unit = "s" if key.duration is not None else f" {key.unit}" if key.unit else ""
    upper = op.startswith("<")
    has_upper = meta.le is not None or meta.lt is not None
    why = f" ({key.why})" if key.why and (upper or not has_upper) else ""
    return f"must be {op} {float(bound):g}{unit}{why}"


def _shown(value: Any, key: KeyInfo) -> str:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return repr(value)
    return show_value(value, key)


def _check_numbers(value: Any, path: str) -> None:
    """Every integer within 64 bits (the database and numpy hold no more), every float finite
    (no setting means anything at inf or nan, and reports cannot hold them)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not -MAX_INT <= value <= MAX_INT:
        raise ConfigError(f"{path}: {value} is outside the 64-bit integer range [-{MAX_INT}, {MAX_INT}]")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{path}: must be a finite number, got {value!r}")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_numbers(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_numbers(v, f"{path}[{i}]")
