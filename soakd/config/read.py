"""The way in: a TOML file and ``{"load.concurrency": 4}``-style overrides to a validated
:class:`Config` (:func:`load_config`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


from soakd.config.convert import build
from soakd.config.schema import Config
from soakd.config.validate import validate
from soakd.errors import ConfigError


def _table(data: dict[str, Any], section: str) -> dict[str, Any]:
    """The file's ``[section]``, made when absent; a flag cannot go into ``load = 3``."""
    table = data.setdefault(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{section}: expected a table, got {table!r}")
    return table


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    section, key = path.split(".", 1)
    _table(data, section)[key] = value


MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config is a page of keys; a larger file is the wrong file


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The file's TOML as a dict; ConfigError (one line, naming the file) for anything else:
    missing, unreadable, larger than 4 MiB, not UTF-8, not TOML, or nested too deeply."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config file: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB: not a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a text file (not UTF-8 at byte {exc.start}); expected TOML") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid TOML: arrays or tables nested too deeply") from None


def load_config(path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Read TOML (when given), apply ``{"load.concurrency": 4}``-style overrides, validate."""
    data: dict[str, Any] = read_toml(path) if path is not None else {}
    overrides = overrides or {}
    # A load mode given on the command line replaces the other mode from the file.
    if "load.concurrency" in overrides and "load.rate" not in overrides:
        _table(data, "load").pop("rate", None)
    if "load.rate" in overrides and "load.concurrency" not in overrides:
        _table(data, "load").pop("concurrency", None)
    if "load.replay" in overrides:  # the trace sets the arrivals: the file's rate or concurrency yields
        for key in ("rate", "concurrency"):
            if f"load.{key}" not in overrides:
                _table(data, "load").pop(key, None)
    for key, value in overrides.items():
        _set_path(data, key, value)
    cfg = build(data)
    settle(cfg)
    validate(cfg)
    return cfg


def settle(cfg: Config) -> None:
    """Defaults that depend on other keys, filled in before validation (which changes nothing)."""
    if cfg.load.concurrency is None and cfg.load.rate is None and cfg.load.replay is None:
        cfg.load.concurrency = 8  # closed loop, 8 in flight: neither mode given
    lk = cfg.leak
    # A window shorter than 30 evaluations (an accelerated run) is judged that often instead.
    lk.evaluate_interval = min(lk.evaluate_interval, max(1.0, lk.window / 30))
