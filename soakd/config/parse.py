"""The parsers of the strings a config holds: durations, ``HOST:PORT``, run ids and
``--output-tokens``. Each raises ValueError (durations) or ConfigError naming the key."""

from __future__ import annotations

import datetime
import math
import re

from soakd.errors import ConfigError
from soakd.specs import SEQ_PREFIX, SeqLenSpec, is_seq_spec, parse_seq_spec

_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|us|µs|s|m|h|d)?", re.IGNORECASE)
_UNIT_SECONDS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


# A duration of ten years outlasts any soak and keeps every deadline soakd computes from one
# (the monotonic clock plus the duration) far inside threading.TIMEOUT_MAX (292 years) and
# exact in a float; beyond it, timers overflow (OverflowError) or wait forever.
MAX_DURATION = 10 * 366 * 86400.0


def parse_duration(value: str | float | int) -> float:
    """Parse ``90s``, ``1h30m``, ``250ms`` or a plain number of seconds into seconds.

    ValueError for anything else: text that is no duration, a TOML date or time, inf, nan, or
    more than :data:`MAX_DURATION`."""
    if isinstance(value, (datetime.date, datetime.time)):  # TOML has dates; a duration is not one
        raise ValueError(f"expected a duration such as 90s or 1h30m, got the TOML date/time {value}")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"expected a duration such as 90s or 1h30m, got {value!r}")
    total = float(value) if isinstance(value, (int, float)) else _parse_duration_text(value)
    if not math.isfinite(total):
        raise ValueError(f"duration must be a finite number of seconds, got {value!r}")
    if total > MAX_DURATION:
        raise ValueError(f"duration {value!r} is longer than the bound of 10 years ({MAX_DURATION:.0f}s)")
    return total


_SIZE_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = re.compile(r"\s*([0-9][0-9.eE+-]*)\s*([A-Za-z]*)\s*")


def parse_size(value: str) -> float:
    """Parse ``8GiB``, ``512 MiB`` or a plain number of bytes into bytes (binary units only, the
    ones soakd prints). ValueError for anything else, or a size that is not positive."""
    m = _SIZE.fullmatch(value)
    number = _float_or_none(m.group(1)) if m else None
    if m is None or number is None or m.group(2) not in _SIZE_UNITS:
        raise ValueError(f"expected a size such as 8GiB or 512MiB, got {value!r}")
    size = number * _SIZE_UNITS[m.group(2)]
    if not math.isfinite(size) or size <= 0:
        raise ValueError(f"size must be a positive number of bytes, got {value!r}")
    return size


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _parse_duration_text(value: str) -> float:
    text = value.strip()
    if not text:
        raise ValueError("empty duration")
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_RE.match(text, pos)
        if not m:
            raise ValueError(f"cannot parse duration {value!r} (use e.g. 90s, 5m, 1h30m, 250ms)")
        unit = (m.group(2) or "s").lower()
        if m.group(2) is None and pos > 0:
            raise ValueError(f"cannot parse duration {value!r}: missing unit after a number")
        total += float(m.group(1)) * _UNIT_SECONDS[unit]
        pos = m.end()
        while pos < len(text) and text[pos] == " ":
            pos += 1
    return total


def parse_shard(text: str, key: str = "load.shard") -> tuple[int, int] | None:
    """``"I/N"`` -> (I, N) with 0 <= I < N; None for ""; ConfigError naming ``key`` otherwise."""
    if not text.strip():
        return None
    i, sep, n = text.strip().partition("/")
    if not (sep and i.isdigit() and n.isdigit() and int(i) < int(n)):
        raise ConfigError(f"{key}: expected I/N with 0 <= I < N (shard I of N drivers), got {text!r}")
    return int(i), int(n)


def parse_instant(text: str, key: str = "load.start_at") -> float | None:
    """A wall-clock instant as unix seconds: ISO 8601 with a zone (``2026-12-05T14:00:00Z``) or
    unix seconds; None for ""; ConfigError naming ``key`` otherwise. A time without a zone is
    refused: shards in different zones would read it as different instants."""
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = _iso_instant(text, key)
    if not (math.isfinite(value) and 0 < value < 2**33):
        raise ConfigError(f"{key}: {text!r} is not an instant between 1970 and 2242")
    return value


def _iso_instant(text: str, key: str) -> float:
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{key}: expected an ISO 8601 instant such as 2026-12-05T14:00:00Z or unix seconds, got {text!r}"
        ) from None
    if when.tzinfo is None:
        raise ConfigError(f"{key}: {text!r} has no time zone (add Z or +HH:MM): every shard must read one instant")
    return when.timestamp()


MAX_RUN_ID = 128  # a run id names a folder and files in the state dir (NAME_MAX is 255)
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def parse_host_port(addr: str, key: str = "metrics.addr") -> tuple[str, int]:
    """``HOST:PORT``, ``[IPV6]:PORT`` or ``:PORT`` (loopback) -> (host, port); ConfigError naming
    ``key`` otherwise. An IPv6 address needs its brackets: ``::1:9464`` is ambiguous."""
    text = addr.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep or not host:
            raise ConfigError(f"{key}: expected [IPV6]:PORT, got {addr!r}")
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ConfigError(f"{key}: expected HOST:PORT, got {addr!r}")
        if ":" in host:
            raise ConfigError(f"{key}: {addr!r}: put an IPv6 address in brackets, e.g. [::1]:9464")
    if not (port.isdigit() and 0 <= int(port) <= 65535):
        raise ConfigError(f"{key}: port must be within [0, 65535], got {addr!r}")
    if host and not re.fullmatch(r"[A-Za-z0-9.:%_-]+", host):
        raise ConfigError(f"{key}: {host!r} is not a host name or address")
    return host or "127.0.0.1", int(port)


def check_run_id(run_id: str, key: str = "state.run_id") -> str:
    """A run id names a folder in the state dir: letters, digits and ``-_.``, no path."""
    if not _RUN_ID_RE.fullmatch(run_id) or ".." in run_id or len(run_id) > MAX_RUN_ID:
        raise ConfigError(
            f"{key}: {run_id!r} is not a run name (letters, digits, '-', '_', '.', starting with a "
            f"letter or digit, no '..', at most {MAX_RUN_ID} characters)"
        )
    return run_id


def parse_output_tokens(value: str) -> SeqLenSpec:
    """``--output-tokens``: ``N`` or a ``seq:`` length spec (``seq:uniform(min=16,max=256)``)."""
    text = value.strip()
    if text.isdigit():
        text = f"seq:fixed(n={text})"
    elif not is_seq_spec(text):
        text = SEQ_PREFIX + text  # "uniform(min=16,max=256)" reads the same
    try:
        return parse_seq_spec(text)
    except ValueError as exc:
        raise ConfigError(
            f"target.output_tokens: {value!r}: expected N or a length spec such as seq:uniform(min=16,max=256) "
            f"({str(exc).removeprefix('input.shapes: ')})"
        ) from None
