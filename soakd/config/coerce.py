"""TOML values (and ``--flag`` overrides, as strings) into the typed section dataclasses of
:mod:`soakd.config.schema`; every error is a ConfigError naming the key path."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
import typing
from typing import Any

from soakd.config.bounds import MAX_INT
from soakd.config.parse import parse_duration
from soakd.errors import ConfigError


def _coerce(value: Any, tp: Any, path: str, meta: typing.Mapping[str, Any]) -> Any:
    if meta.get("off_word") is not None and value == meta["off_word"]:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], path, meta)
    if meta.get("duration"):
        try:
            seconds = parse_duration(value)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        if seconds < 0 or (seconds == 0 and not meta.get("zero")):
            raise ConfigError(f"{path}: duration must be {'>= 0' if meta.get('zero') else '> 0'}, got {value!r}")
        return seconds
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        number: int | None = value if isinstance(value, int) else None
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = int(value)
        if number is None:
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        if not -MAX_INT <= number <= MAX_INT:  # the database and numpy hold 64-bit integers
            raise ConfigError(f"{path}: {value} is outside the 64-bit integer range [-{MAX_INT}, {MAX_INT}]")
        return number
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        real: float | None = float(value) if isinstance(value, (int, float)) else None
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                real = float(value)
        if real is None:
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        if not math.isfinite(real):  # no setting means anything at inf or nan; reports cannot hold them
            raise ConfigError(f"{path}: must be a finite number, got {value!r}")
        return real
    if tp is str:
        if isinstance(value, str):
            return value
        if meta.get("int_as_text") and isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{path}: expected a string, got {value!r}")
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a table, got {value!r}")
        _, vtp = typing.get_args(tp)
        if vtp is Any:
            return dict(value)
        return {k: _coerce(v, vtp, f"{path}.{k}", {}) for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        (etp,) = typing.get_args(tp)
        return [_coerce(v, etp, f"{path}[{i}]", {}) for i, v in enumerate(value)]
    raise ConfigError(f"{path}: unsupported type {tp!r}")  # pragma: no cover - programming error


def build(cls: type[Any], data: dict[str, Any], prefix: str) -> Any:
    """``cls`` (a section, or :class:`Config` itself) from its TOML table; an unknown key or
    section is an error that lists the known ones."""
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            where = f"{prefix}.{key}" if prefix else key
            kind = "key" if prefix else "section"
            known = ", ".join(sorted(names))
            raise ConfigError(f"{where}: unknown {kind} (known: {known})")
    kwargs: dict[str, Any] = {}
    for name, f in names.items():
        if name not in data:
            continue
        path = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(data[name], dict):
                raise ConfigError(f"{path}: expected a table [{path}]")
            kwargs[name] = build(typing.cast(type, tp), data[name], path)
        else:
            kwargs[name] = _coerce(data[name], tp, path, f.metadata)
    return cls(**kwargs)
