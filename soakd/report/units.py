"""One number format per unit, shared by ``soakd compare`` and the HTML and Markdown reports
(and the plots' labels), so a figure reads the same wherever it is printed: fixed decimals,
never an exponent, never a unit suffix glued to the number.

Inputs are in the JSON's units (milliseconds, requests/s, bytes, bytes per hour, seconds, a
ratio); each function returns the text without the unit; :func:`with_unit` adds it.
"""

from __future__ import annotations

import math
from typing import TypeGuard

MIB = float(1 << 20)


def _finite(v: float | None) -> TypeGuard[float]:
    return v is not None and not isinstance(v, bool) and math.isfinite(v)


def ms(v: float | None) -> str:
    """Latency in milliseconds: three decimals (a microsecond), ``0.110``, ``11387.830``."""
    return f"{v:.3f}" if _finite(v) else "-"


def rps(v: float | None) -> str:
    """Throughput in requests per second: ``1000.00``."""
    return f"{v:.2f}" if _finite(v) else "-"


def mib(v_bytes: float | None) -> str:
    """A memory level in MiB from bytes: ``512.0``."""
    return f"{v_bytes / MIB:.1f}" if _finite(v_bytes) else "-"


def mib_per_hour(v_bytes_per_hour: float | None, *, signed: bool = True) -> str:
    """A memory slope in MiB/h from bytes per hour, signed: ``+5.06``, ``+5059.46`` (a bound,
    such as the smallest leak the data would have caught, unsigned: ``3.10``)."""
    if not _finite(v_bytes_per_hour):
        return "-"
    return f"{v_bytes_per_hour / MIB:+.2f}" if signed else f"{v_bytes_per_hour / MIB:.2f}"


def number(v: float | None) -> str:
    """A level in a unit of its own (a scraped server gauge): four significant digits, ``0.2``."""
    return f"{v:.4g}" if _finite(v) else "-"


def number_per_hour(v: float | None, *, signed: bool = True) -> str:
    """A slope in a unit of its own per hour: ``+0.0144`` (a bound unsigned)."""
    return (f"{v:+.4g}" if signed else f"{v:.4g}") if _finite(v) else "-"


def seconds(v: float | None) -> str:
    """A duration in seconds: ``90.0``."""
    return f"{v:.1f}" if _finite(v) else "-"


def ratio(v: float | None) -> str:
    """A share such as the error ratio: five decimals (one request in 100 000), ``0.00100``."""
    return f"{v:.5f}" if _finite(v) else "-"


FORMATS = {"ms": ms, "req/s": rps, "MiB": mib, "MiB/h": mib_per_hour, "s": seconds, "ratio": ratio, "": ratio}


def fmt(v: float | None, unit: str) -> str:
    """``v`` (in the JSON's unit for ``unit``) in that unit's one format."""
    return FORMATS.get(unit, rps)(v)


def with_unit(v: float | None, unit: str) -> str:
    text = fmt(v, unit)
    return text if text == "-" or unit in ("", "ratio") else f"{text} {unit}"


def change(a: float | None, b: float | None, unit: str) -> str:
    """B against A: a percentage for levels; for slopes and ratios the signed difference in
    the unit (a percentage of a slope near zero means nothing)."""
    if not (_finite(a) and _finite(b)):
        return ""
    if unit in ("MiB/h", "ratio", ""):
        return fmt(b - a, unit) if unit == "MiB/h" else f"{b - a:+.5f}"
    if a == 0:
        return "+0.0%" if b == 0 else "n/a"
    return f"{(b - a) / a * 100:+.1f}%"
