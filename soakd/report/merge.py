"""One soak driven by many drivers: ``soakd report --merge SRC...`` makes one report of it.

Each source is one driver's part of the soak (a ``--shard I/N`` pod, a ``--workers`` process or
just another driver): a state dir, or a summary, report or merged JSON. Unlike ``--fleet`` (one
soak per GPU, each judged on its own) the parts are one soak: their latency histograms add
bucket by bucket into the soak's (the percentiles are those of every request, not a mean of
the parts'), their counts and throughputs add, and the SLO gate judges the sum. What stays per
part is what says whether the sum can be trusted: each part's share of the requests, its
health (finished, restarts, error ratio, schedule lag) and its time range. A shard that is
missing from ``0..N-1`` or that failed (did not finish, measured nothing) is named and fails
the gate: a soak must not pass on the shards that happened to survive.

The merged JSON has the keys of a run's report (``requests``, ``latency_ms``,
``throughput_rps``, ``memory``, ``slo``), so ``soakd compare`` and the SLO gate take it as they
take one run's, plus ``merge`` (how complete the merge is) and ``shards``. It keeps the merged
``latency_histograms``, so merged reports merge again exactly.
"""

from __future__ import annotations

import argparse
import calendar
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO

import msgspec

from soakd.config import SloConfig, load_config
from soakd.config.parse import parse_shard
from soakd.errors import ConfigError, Exit, StateError
from soakd.record.types import RunRecord
from soakd.record.write import LLM_TIMINGS, stage_summary, to_json_object, write_text_private
from soakd.report.fleet import (
    FleetSourceError,
    GpuRun,
    Hists,
    hists_from_json,
    hists_to_json,
    load_sources,
    merge_hists,
)
from soakd.report.inputs import saved_summary
from soakd.telemetry.catalogue import STAGES
from soakd.verdicts.slo import error_ratio, slo_block

LLM_HISTS = ("ttft", "itl", "tpot")  # llm.histograms' keys, in LLM_TIMINGS' order
SHARDS_CHECK = "shards complete"  # the SLO check a missing or failed shard fails


@dataclass
class Part:
    """One driver's part: its report, histograms, and the shards of ``--shard I/N`` it holds
    (one, or several for a merged JSON; none where the driver ran unsharded)."""

    run: GpuRun
    shards: tuple[int, ...]
    count: int | None  # N of --shard I/N
    extra: dict[str, Any]  # what only the saved summary holds (clock skew), else empty

    @cached_property
    def data(self) -> dict[str, Any]:
        """The run's record as JSON values (the merge adds and copies keys as they are written)."""
        return to_json_object(self.run.record)

    @property
    def label(self) -> str:
        if self.count is None:
            return self.run.name
        return f"shard{'s' if len(self.shards) > 1 else ''} {','.join(map(str, self.shards))}/{self.count}"


def _shards_of(data: dict[str, Any]) -> tuple[tuple[int, ...], int | None]:
    """The shards a report holds: a merged one's entries, else its run's ``load.shard``."""
    merge, entries = data.get("merge"), data.get("shards")
    if isinstance(merge, dict) and isinstance(entries, list):
        count = merge.get("shards_expected")
        held = [i for e in entries if isinstance(e, dict) for i in e.get("shards") or ()]
        if count is None:
            return (), None
        if type(count) is not int or not all(type(i) is int and 0 <= i < count for i in held):
            raise ValueError(f"merge.shards_expected and shards[].shards: not shards of --shard I/{count}")
        return tuple(sorted(held)), count
    config: dict[str, Any] = (data.get("run") or {}).get("config") or {}
    text = (config.get("load") or {}).get("shard")
    try:
        shard = parse_shard(text) if isinstance(text, str) else None
    except ConfigError:  # not a shard soakd wrote; a run with it never started
        shard = None
    return ((shard[0],), shard[1]) if shard else ((), None)


def load_parts(sources: Sequence[str], slo: SloConfig | None = None) -> list[Part]:
    """Every part of ``sources``; FleetSourceError (exit 2) for a source that is not one, for a
    shard given twice and for shards of soaks split differently (1/4 beside 1/8)."""
    parts = []
    for run in load_sources(sources, slo):
        data = to_json_object(run.record)
        path = Path(run.source)
        extra = {}
        if path.is_dir():
            saved = saved_summary(path, str(data.get("run_id") or ""))
            summary = to_json_object(saved) if saved is not None else {}
            extra = {k: summary[k] for k in ("shard",) if k in summary}
        else:
            extra = {k: data[k] for k in ("shard",) if k in data}
        try:
            shards, count = _shards_of(data)
        except ValueError as exc:
            raise FleetSourceError(f"{run.source}: {exc}") from None
        parts.append(Part(run, shards, count, extra))
    counts = sorted({p.count for p in parts if p.count is not None})
    if len(counts) > 1:
        raise FleetSourceError(f"shards of differently split soaks: --shard .../{counts[0]} and .../{counts[1]}")
    seen: dict[int, str] = {}
    for p in parts:
        for i in p.shards:
            if i in seen:
                raise FleetSourceError(f"shard {i}/{p.count} given twice: {seen[i]} and {p.run.source}")
            seen[i] = p.run.source
    return sorted(parts, key=lambda p: (p.count is None, p.shards, p.run.name))


# --------------------------------------------------------------------------- per part


def _unix(iso: Any) -> float | None:
    if not isinstance(iso, str):
        return None
    try:
        return float(calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _time_range(data: dict[str, Any]) -> tuple[str | None, str | None]:
    """When the part ran: its first segment's start to its end (last heartbeat when unclean)."""
    segments: list[dict[str, Any]] = data.get("segments") or []
    start = segments[0].get("started_at") if segments else (data.get("run") or {}).get("started_at")
    end = data.get("finished_at")
    if end is None and segments:
        end = segments[-1].get("ended_at") or segments[-1].get("last_seen")
    return (start if isinstance(start, str) else None), (end if isinstance(end, str) else None)


def failure(part: Part) -> str | None:
    """Why a part cannot stand for its share of the soak, or None."""
    data = part.data
    segments: list[dict[str, Any]] = data.get("segments") or []
    if segments and segments[-1].get("ended_at") is None:  # no end recorded: no clean stop (SIGTERM is one)
        return "did not finish (killed, crashed or still running)"
    failed = (data.get("merge") or {}).get("failed_shards")
    if failed:  # a merged JSON of parts that already failed
        return "holds failed parts: " + "; ".join(map(str, failed))
    if not sum((data.get("requests") or {}).values()):
        return "measured no requests"
    return None


def _entry(part: Part, total: int) -> dict[str, Any]:
    d = part.data
    requests: dict[str, int] = d.get("requests") or {}
    n = sum(requests.values())
    start, end = _time_range(d)
    lag: dict[str, Any] = d.get("schedule_lag_ms") or {}
    memory: dict[str, dict[str, Any]] = d.get("memory") or {}
    return {
        "name": part.run.name,
        "source": part.run.source,
        "shard": {"index": part.shards[0], "count": part.count} if len(part.shards) == 1 else None,
        "shards": list(part.shards),
        "run_id": d.get("run_id") or (d.get("run") or {}).get("run_id"),
        "host": (d.get("run") or {}).get("host"),
        "started_at": start,
        "ended_at": end,
        "duration_seconds": d.get("duration_seconds"),
        "share": round(n / total, 6) if total else None,
        "requests": requests,
        "throughput_rps": d.get("throughput_rps"),
        "error_ratio": error_ratio(requests),
        "restarts": d.get("restarts", 0),
        "unclean_exits": d.get("unclean_exits", 0),
        "schedule_lag_p99_ms": lag.get("p99"),
        "clock_skew_seconds": (part.extra.get("shard") or {}).get("clock_skew_seconds"),
        "p99_e2e_ms": ((d.get("latency_ms") or {}).get("e2e") or {}).get("p99"),
        "leaks": {s: m.get("leak_suspected") for s, m in sorted(memory.items()) if isinstance(m, dict)},
        "failed": failure(part),
    }


# --------------------------------------------------------------------------- merged


def _memory(parts: Sequence[Part]) -> dict[str, dict[str, Any]]:
    """Per series, one verdict for the soak: suspected when any part suspects it (the series
    of one server watched by one shard is judged once; each driver's own RSS by each)."""
    out: dict[str, dict[str, Any]] = {}
    for p in parts:
        for series, m in (p.data.get("memory") or {}).items():
            if not isinstance(m, dict):
                continue
            row = out.setdefault(series, {"leak_suspected": False, "by_shard": {}})
            row["by_shard"][p.label] = m.get("leak_suspected")
    for row in out.values():
        verdicts = list(row["by_shard"].values())
        row["leak_suspected"] = True if True in verdicts else (None if None in verdicts else False)
        leaking = [name for name, v in row["by_shard"].items() if v is True]
        row["verdict"] = (
            "LEAK SUSPECTED in " + ", ".join(leaking)
            if leaking
            else ("no leak" if row["leak_suspected"] is False else "not judged in every part")
        )
        row["verdict_source"] = "merged shards"
    return out


LLM_COUNTS = ("input_tokens", "output_tokens", "goodput_requests")  # add across parts
LLM_RATES = ("output_tokens_per_second", "goodput_rps")  # add, as throughputs do


def _llm(parts: Sequence[Part]) -> tuple[dict[str, Any] | None, list[str]]:
    """The soak's ``llm`` block (``--api openai``): TTFT, ITL and TPOT from the parts' histograms
    added bucket by bucket (the percentiles of every stream, as ``latency_ms``), token and
    goodput counts and rates summed. A part without the histograms (an older summary) leaves
    the timings unmerged, and says so, rather than a mean of percentiles."""
    blocks = [(p, p.data.get("llm")) for p in parts]
    held = [(p, b) for p, b in blocks if isinstance(b, dict)]
    if not held:
        return None, []
    out: dict[str, Any] = {}
    for key in LLM_COUNTS:
        out[key] = sum(int(b.get(key) or 0) for _, b in held)
    for key in LLM_RATES:
        out[key] = round(sum(float(b.get(key) or 0.0) for _, b in held), 3)
    bare = [p.run.name for p, b in blocks if not isinstance(b, dict) or b.get("histograms") is None]
    if bare:
        for _, key in LLM_TIMINGS:
            out[key] = None
        return out, ["no merged TTFT/ITL/TPOT: no llm histograms in " + ", ".join(bare)]
    hists = merge_hists(hists_from_json(b["histograms"], f"{p.run.source} (llm)") or {} for p, b in held)
    for name, key in zip(LLM_HISTS, (k for _, k in LLM_TIMINGS), strict=True):
        out[key] = stage_summary(hists[name]) if name in hists else None
    out["histograms"] = hists_to_json(hists)
    return out, []


def _run_slo(parts: Sequence[Part]) -> SloConfig:
    """The first part's own ``[slo]`` (every shard of one soak runs one config)."""
    config: dict[str, Any] = (parts[0].data.get("run") or {}).get("config") or {}
    names = {f.name for f in dataclasses.fields(SloConfig)}
    return SloConfig(**{k: v for k, v in (config.get("slo") or {}).items() if k in names})


def _completeness(parts: Sequence[Part], entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    expected = next((p.count for p in parts if p.count is not None), None)
    present = {i for p in parts for i in p.shards}
    missing = [f"shard {i}/{expected}" for i in range(expected or 0) if i not in present]
    failed = [f"{e['name']}: {e['failed']}" for e in entries if e["failed"]]
    starts = [t for t in (_unix(e["started_at"]) for e in entries) if t is not None]
    ends = [t for t in (_unix(e["ended_at"]) for e in entries) if t is not None]
    return {
        "parts": len(parts),
        "shards_expected": expected,
        "missing_shards": missing,
        "failed_shards": failed,
        "complete": not missing and not failed,
        "started_at": min((e["started_at"] for e in entries if e["started_at"]), default=None),
        "ended_at": max((e["ended_at"] for e in entries if e["ended_at"]), default=None),
        "start_spread_seconds": (max(starts) - min(starts)) if starts else None,
        "end_spread_seconds": (max(ends) - min(ends)) if ends else None,
    }


def build_merged(parts: Sequence[Part], slo: SloConfig | None = None) -> tuple[dict[str, Any], Hists]:
    """The merged report (a run report's keys plus ``merge`` and ``shards``) and its histograms."""
    if not parts:
        raise FleetSourceError("--merge needs at least one state dir or JSON")
    requests: dict[str, int] = {}
    for p in parts:
        for k, v in (p.data.get("requests") or {}).items():
            requests[k] = requests.get(k, 0) + int(v)
    total = sum(requests.values())
    entries = [_entry(p, total) for p in parts]
    exact = all(p.run.hists is not None for p in parts)
    hists: Hists = merge_hists(p.run.hists for p in parts if p.run.hists is not None) if exact else {}
    order = [s for s in STAGES if s in hists] + sorted(s for s in hists if s not in STAGES)
    merge = _completeness(parts, entries)
    merge["latency_exact"] = exact
    merge["notes"] = (
        []
        if exact
        else [
            "no merged latency: no histograms in "
            + ", ".join(p.run.name for p in parts if p.run.hists is None)
            + " (a summary JSON; give its state dir or report JSON)"
        ]
    )
    llm, llm_notes = _llm(parts)
    merge["notes"] += llm_notes
    durations = [float(p.data.get("duration_seconds") or 0.0) for p in parts]
    downs = [float((p.data.get("target") or {}).get("down_seconds") or 0.0) for p in parts if p.data.get("target")]
    data: dict[str, Any] = {
        "run_id": "+".join(str(e["run_id"]) for e in entries),
        "merge": merge,
        "duration_seconds": max(durations),
        "run_duration_seconds": max(durations),
        "throughput_rps": round(sum(float(p.data.get("throughput_rps") or 0.0) for p in parts), 3),
        "requests": requests,
        "error_ratio": error_ratio(requests),
        "latency_ms": {s: stage_summary(hists[s]) for s in order},
        "latency_histograms": hists_to_json(hists) if exact else None,
        "memory": _memory(parts),
        "run": parts[0].data.get("run"),
        "shards": entries,
    }
    offered = [p.data.get("offered_rps") for p in parts]
    if all(isinstance(o, int | float) for o in offered):
        data["offered_rps"] = round(sum(float(o) for o in offered if o is not None), 3)
    if llm is not None:
        data["llm"] = llm
    if downs:  # the target was down as long as the part that saw it down longest
        data["target"] = {"down_seconds": max(downs)}
    block = to_json_object(slo_block(slo if slo is not None else _run_slo(parts), msgspec.convert(data, RunRecord)))
    shards_ok = bool(merge["complete"])
    observed = "all present" if shards_ok else "; ".join(merge["missing_shards"] + merge["failed_shards"])
    check = {"name": SHARDS_CHECK, "limit": None, "observed": observed, "op": "every shard", "unit": ""}
    block["checks"].append({**check, "passed": shards_ok, "status": "pass" if shards_ok else "FAIL"})
    if not shards_ok:
        block["passed"], block["failed"] = False, [*block["failed"], SHARDS_CHECK]
    data["slo"] = block
    return data, hists


# --------------------------------------------------------------------------- the command


def merge_command(ns: argparse.Namespace, out: TextIO | None = None) -> int:
    """``soakd report --merge SRC...``: the merged report; exit 1 when its gate fails (an SLO
    missed on the merged figures, a shard missing or failed)."""
    if ns.run_id:
        raise FleetSourceError("--merge: --run-id names one run; a merge takes each state dir's latest run")
    slo = load_config(ns.config).slo if ns.config else None
    data, hists = build_merged(load_parts(ns.merge, slo), slo)
    if ns.format == "json":
        text = json.dumps(data, indent=2, allow_nan=False, default=str) + "\n"
    else:
        from soakd.report.merge_render import render  # the renderers load only for HTML and Markdown

        text = render(data, hists, ns.format)
    if ns.output:
        try:
            write_text_private(Path(ns.output), text)
        except OSError as exc:  # a read-only folder, a full disk: the user's to fix, exit 2
            raise StateError(f"--output {ns.output}: cannot write the report: {exc.strerror}") from None
        print(f"report: {ns.output}", file=sys.stderr)
    else:
        (out or sys.stdout).write(text)
    m = data["merge"]
    why = "" if data["slo"]["passed"] else f" ({', '.join(data['slo']['failed'])})"
    print(
        f"merge: {m['parts']} parts, {sum(data['requests'].values())} requests, "
        f"verdict {'pass' if data['slo']['passed'] else 'FAIL'}{why}",
        file=sys.stderr,
    )
    return Exit.OK if data["slo"]["passed"] else Exit.FAIL
