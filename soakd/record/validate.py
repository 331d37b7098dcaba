"""What ``soakd compare`` and ``soakd report --fleet`` read from a summary, report or fleet JSON,
checked before anything reads it: a file that is not one (a string where a figure goes,
``requests`` that are not counts, JSON nested past the parser's depth) is one ValueError naming
the key and what is wrong, which the commands turn into exit 2 naming the file.

Only the keys the offline commands read are checked, each where it may be absent or null as a
run writes it; every other key is passed through untouched.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from soakd.record.write import LLM_TIMINGS

NUMBER_KEYS = ("throughput_rps", "offered_rps", "duration_seconds", "run_duration_seconds")
LLM_NUMBERS = ("goodput_rps", "goodput_requests", "input_tokens", "output_tokens", "output_tokens_per_second")
WINDOW_NUMBERS = ("t", "seconds", "throughput_rps", "ok", "errors")
MEMORY_NUMBERS = ("slope_bytes_per_hour", "trend_bytes_per_hour")
MAX_COUNT = 2**63 - 1  # counts are int64 in the state database


class Malformed(ValueError):
    """A key of a soakd JSON that is not what a run writes there."""


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)[:60] if not isinstance(value, dict | list) else type(value).__name__
    return text


def _fail(key: str, value: Any, want: str) -> Malformed:
    return Malformed(f"{key}: expected {want}, got {_short(value)}")


def _is_number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _number(doc: dict[str, Any], key: str, where: str) -> None:
    v = doc.get(key)
    if v is not None and not _is_number(v):
        raise _fail(f"{where}{key}", v, "a number or null")


def _dict(v: Any, key: str, *, nullable: bool = False) -> dict[str, Any]:
    if v is None and nullable:
        return {}
    if not isinstance(v, dict):
        raise _fail(key, v, "an object" + (" or null" if nullable else ""))
    return v


def _obj(doc: dict[str, Any], name: str, where: str, *, nullable: bool = False) -> dict[str, Any]:
    """``doc[name]``: absent is empty; null only where the readers take it as empty."""
    if name not in doc:
        return {}
    return _dict(doc[name], f"{where}{name}", nullable=nullable)


def _stats(v: Any, key: str, *, nullable: bool = False) -> None:
    """A percentile block ``{p50, p90, p99, p999, max, mean, count}``: numbers or null."""
    for q, x in _dict(v, key, nullable=nullable).items():
        if x is not None and not _is_number(x):
            raise _fail(f"{key}.{q}", x, "a number or null")


def _stages(v: Any, key: str) -> None:
    for stage, stats in _dict(v, key).items():
        _stats(stats, f"{key}.{stage}")


def check_result(doc: Any, where: str = "") -> dict[str, Any]:
    """``doc`` when it is a summary or report whose keys hold what a run writes there; Malformed
    naming the first key that does not. ``where``: a prefix for nested documents (a fleet's GPUs)."""
    if not isinstance(doc, dict):
        raise Malformed(f"{where or 'the file: '}not a JSON object")
    if "latency_ms" not in doc:
        raise Malformed(f"{where}latency_ms: missing (not a soakd summary or report)")
    for key in NUMBER_KEYS:
        _number(doc, key, where)
    for name, n in _obj(doc, "requests", where).items():
        if type(n) is not int or not 0 <= n <= MAX_COUNT:
            raise _fail(f"{where}requests.{name}", n, "a count (an integer >= 0)")
    _stages(doc["latency_ms"], f"{where}latency_ms")
    _number(_obj(doc, "batch_size", where, nullable=True), "mean", f"{where}batch_size.")
    llm = _obj(doc, "llm", where, nullable=True)
    for _, key in LLM_TIMINGS:
        _stats(llm.get(key), f"{where}llm.{key}", nullable=True)
    for key in LLM_NUMBERS:
        _number(llm, key, f"{where}llm.")
    windows = doc.get("windows")
    if windows is not None and not isinstance(windows, list):
        raise _fail(f"{where}windows", windows, "a list of window rows")
    for i, row in enumerate(windows or []):
        key = f"{where}windows[{i}]"
        row = _dict(row, key)
        for name in WINDOW_NUMBERS:
            _number(row, name, f"{key}.")
        if "latency_ms" in row:
            _stages(row["latency_ms"], f"{key}.latency_ms")
    for name, series in _obj(doc, "memory", where).items():
        key = f"{where}memory.{name}"
        series = _dict(series, key)
        for figure in MEMORY_NUMBERS:
            _number(series, figure, f"{key}.")
        leak = series.get("leak_suspected")
        if leak is not None and not isinstance(leak, bool):
            raise _fail(f"{key}.leak_suspected", leak, "true, false or null")
    run = _obj(doc, "run", where, nullable=True)
    _obj(run, "config", f"{where}run.", nullable=True)
    slo = _obj(doc, "slo", where, nullable=True)
    failed = slo.get("failed")
    if failed is not None and not (isinstance(failed, list) and all(isinstance(f, str) for f in failed)):
        raise _fail(f"{where}slo.failed", failed, "a list of check names")
    return doc


def check_fleet(doc: dict[str, Any]) -> dict[str, Any]:
    """A fleet JSON: its merged figures and each GPU's entry (``name``, ``report``) checked."""
    check_result({**doc, "latency_ms": doc.get("latency_ms") or {}})
    gpus = doc.get("gpus")
    if not isinstance(gpus, list):
        raise _fail("gpus", gpus, "a list of GPU entries")
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise _fail(f"gpus[{i}]", gpu, "a GPU entry (an object with name and report)")
        if not isinstance(gpu.get("name"), str):
            raise _fail(f"gpus[{i}].name", gpu.get("name"), "a string")
        check_result(gpu.get("report"), f"gpus[{i}].report.")
    return doc


def is_fleet_doc(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("fleet"), dict) and "gpus" in doc


def load_json(path: str | Path) -> Any:
    """A JSON file; ValueError (never RecursionError) when it is not one or nests too deeply."""
    with Path(path).open("rb") as fh:
        data = fh.read()
    try:
        return json.loads(data)
    except RecursionError:
        raise Malformed("JSON nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise Malformed(f"not JSON ({exc})") from None


def load_checked(path: str | Path) -> dict[str, Any]:
    """A summary, report or fleet JSON, checked (Malformed naming the key)."""
    doc = load_json(path)
    if is_fleet_doc(doc):
        return check_fleet(doc)
    return check_result(doc)
