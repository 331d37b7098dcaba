"""``soakd analyze``: judge recorded memory traces (CSV ``timestamp_seconds,bytes``) offline.

Each trace is replayed through the live detector, so the verdict is the one ``soakd run``
would have reached at the end of the trace: "leak", "ok" (with the smallest leak the trace
could have shown: "no leak above 3.1 MiB/h after 6 h") or "not judged" (still in warm-up, or
too short). A CI gate: exit 1 when any trace is judged leaking, 0 when none is, 2 when a file
cannot be read (named with its line; the other files are still judged). No torch here: the
command starts fast and judges hundreds of files in one process.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from soakd.analysis.pages import beyond_horizon
from soakd.analysis.params import DetectorParams, floor_for, in_bytes
from soakd.analysis.replay import Replay, replay
from soakd.config import load_config
from soakd.config.parse import parse_size
from soakd.errors import Exit
from soakd.telemetry.catalogue import LEAK_SERIES

HEADER = ("timestamp_seconds", "bytes")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class TraceData:
    path: Path
    t: np.ndarray
    v: np.ndarray


# The work follows the rows and the span: the detector bins the span (leak.bin, 60 s), so a
# trace in nanoseconds, or with a 1e13 s gap, would ask numpy for terabytes.
MAX_ROWS = 10_000_000
MAX_BINS = 10_000_000  # 19 years of 60 s bins


def check_span(trace: TraceData, bin_seconds: float) -> None:
    """TraceError naming the file when its time span has more bins than MAX_BINS."""
    if trace.t.size < 2:
        return
    span = float(trace.t[-1] - trace.t[0])
    if span / bin_seconds > MAX_BINS:
        raise TraceError(
            f"{trace.path}: timestamps span {span:.3g} s, over the bound of {MAX_BINS} bins of {bin_seconds:g} s "
            f"({MAX_BINS * bin_seconds / 86400 / 365:.0f} years); timestamps must be in seconds"
        )


def read_trace(path: Path) -> TraceData:
    """Read ``timestamp_seconds,bytes`` rows; raises TraceError naming the file and line."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, expected a CSV file") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text CSV file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    if not lines or tuple(c.strip() for c in lines[0].split(",")) != HEADER:
        got = lines[0][:80] if lines else "an empty file"
        raise TraceError(f"{path}:1: expected the header {','.join(HEADER)!r}, got {got!r}")
    if len(lines) - 1 > MAX_ROWS:
        raise TraceError(f"{path}: {len(lines) - 1} rows, over the bound of {MAX_ROWS} (a year of samples every 3 s)")
    t = np.empty(len(lines) - 1)
    v = np.empty(len(lines) - 1)
    n = 0
    prev = -math.inf
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split(",")
        if len(cells) != 2:
            raise TraceError(
                f"{path}:{lineno}: expected 2 columns ({','.join(HEADER)}), got {len(cells)}: {line[:80]!r}"
            )
        try:
            ts, val = float(cells[0]), float(cells[1])
        except ValueError:
            raise TraceError(f"{path}:{lineno}: not a number: {line[:80]!r}") from None
        if not (math.isfinite(ts) and math.isfinite(val)):
            raise TraceError(f"{path}:{lineno}: not a finite number: {line[:80]!r}")
        if ts < prev:
            raise TraceError(f"{path}:{lineno}: timestamp {ts} goes back in time (previous {prev})")
        prev = ts
        t[n], v[n] = ts, val
        n += 1
    return TraceData(path, t[:n], v[:n])


def _num(x: float | None, digits: int | None = None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(x, digits) if digits is not None else float(x)


def judge_trace(
    trace: TraceData,
    params: DetectorParams,
    table: dict[str, float],
    step: float,
    headroom: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """The verdict for one trace as a JSON-ready dict. ``headroom``: (bytes, leak.horizon seconds),
    the live page rule: a rise that would not exhaust the bytes within the horizon is a finding
    ("creep"), not a leak; None: every rise the test is sure of is a leak."""
    series = trace.path.stem if trace.path.stem in LEAK_SERIES else "default"
    page_above = headroom[0] / (headroom[1] / 3600.0) if headroom else 0.0
    floor = floor_for(series, table, params.floor_scale)
    priced = in_bytes(trace.path.stem)  # the file's own series name: "default" would read as bytes
    r: Replay = replay(trace.t, trace.v, params, floor, step=step, page_above=page_above, in_bytes=priced)
    j = r.final
    judged = j.judged
    creep = beyond_horizon(j, *headroom) if headroom and r.suspected and not r.paged else ""
    if r.suspected and not creep:
        state = "leak"
    else:
        state = "ok" if judged and math.isfinite(j.detectable_bytes_per_hour) else "not_judged"
    return {
        "file": str(trace.path),
        "state": state,
        "leak_suspected": r.suspected,
        "detectable_slope_bytes_per_hour": _num(j.detectable_bytes_per_hour, 1) if judged else None,
        "judged_seconds": _num(j.judged_seconds, 1),
        "slope_bytes_per_hour": _num(j.slope_bytes_per_hour, 1),
        "p_value": _num(j.p_value) if judged else None,
        "first_suspected_seconds": _num(r.first_suspected_at, 1),
        "samples": int(trace.t.size),
        "duration_seconds": _num(float(trace.t[-1] - trace.t[0]), 1) if trace.t.size else 0.0,
        "reason": (f"{creep} ({j.reason})" if creep else _reason(r, state)) if trace.t.size else "no data",
        "finding": "creep" if creep else None,
    }


def _reason(r: Replay, state: str) -> str:
    j = r.final
    if state == "leak" and not j.positive:  # flagged earlier; the signs still hold
        at = r.first_suspected_at or 0.0
        rise = j.slope_bytes_per_hour / 2**20
        return f"leak suspected {at / 3600:.2f} h in and still holding: troughs rise {rise:.2f} MiB/h"
    if state == "not_judged":
        return f"not judged: {j.reason}"
    return j.reason


def _leak_config(ns: argparse.Namespace) -> Any:
    """``[leak]`` from --config with --leak-warmup / --leak-window / --cycle on top (no model checks)."""
    keys = ("leak.warmup", "leak.window", "leak.cycle")
    overrides = {k: getattr(ns, k) for k in keys if getattr(ns, k, None) is not None}
    return load_config(getattr(ns, "config", None), overrides).leak


def _table_row(r: dict[str, Any], width: int) -> str:
    slope = r["slope_bytes_per_hour"]
    slope_s = "-" if slope is None else f"{slope / 2**20:+.2f}"
    p = r["p_value"]
    first = r["first_suspected_seconds"]
    verdict = {"leak": "LEAK", "ok": "ok", "not_judged": "not judged"}[r["state"]]
    return (
        f"{r['file']:<{width}}  {verdict:<11}{slope_s:>12}{('-' if p is None else f'{p:.2g}'):>10}"
        f"{('-' if first is None else f'{first / 3600:.2f} h'):>12}  {r['reason']}"
    )


def analyze_command(ns: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    leak = _leak_config(ns)
    params = DetectorParams.from_config(leak)
    headroom = None
    if getattr(ns, "headroom", None) is not None:
        try:
            headroom = (parse_size(ns.headroom), leak.horizon)
        except ValueError as exc:
            print(f"soakd analyze: error: --headroom: {exc}", file=err)
            return Exit.USAGE
    # Live evaluation runs every evaluate_interval; replaying every 5 min (or 1/30 of a short
    # window) finds the same verdicts at a fraction of the looks.
    step = max(leak.evaluate_interval, params.bin, min(300.0, params.window / 30))
    table = dict(leak.min_slope_bytes_per_hour)
    width = min(60, max((len(f) for f in ns.files), default=4))
    failed = leaking = 0
    if not ns.json:
        print(f"{'file':<{width}}  {'verdict':<11}{'MiB/h':>12}{'p':>10}{'suspected':>12}  reason", file=out)
    for name in ns.files:
        try:
            trace = read_trace(Path(name))
            check_span(trace, params.bin)
        except TraceError as exc:
            print(f"soakd analyze: error: {exc}", file=err)
            failed += 1
            continue
        result = judge_trace(trace, params, table, step, headroom)
        leaking += result["state"] == "leak"
        if ns.json:
            print(json.dumps(result), file=out)
        else:
            print(_table_row(result, width), file=out)
    # Bad input outranks a leak: the gate cannot vouch for a file it could not read.
    return Exit.USAGE if failed else Exit.FAIL if leaking else Exit.OK
