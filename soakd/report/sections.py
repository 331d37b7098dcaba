"""What a report says, as plain rows: shared by the HTML and Markdown renderers so both show
the same content (the HTML adds the plots)."""

from __future__ import annotations

import json
from typing import Any

from soakd.config import redact_secrets
from soakd.names import TARGET_METRIC_PREFIX
from soakd.record.types import BatchSize, Percentiles, ReplayArrivals, RunRecord, ScheduleLag
from soakd.record.write import LLM_TIMINGS
from soakd.report import units
from soakd.report.gate import format_limit, format_observed

STAGE_ORDER = ("e2e", "queue", "inference", "preprocess", "postprocess")
QUANTILE_COLUMNS = ("p50", "p90", "p99", "p999", "max", "mean", "count")
FINGERPRINT_ROWS = (
    ("run id", "run_id"),
    ("started", "started_at"),
    ("model", "model"),
    ("model sha256", "model_sha256"),
    ("sha256 of", "model_identity"),
    ("input", "input"),
    ("device", "device"),
    ("device name", "device_name"),
    ("CPU", "cpu_model"),
    ("host", "host"),
    ("soakd", "soakd_version"),
    ("torch", "torch_version"),
    ("CUDA", "cuda_version"),
    ("cuDNN", "cudnn_version"),
    ("NVIDIA driver", "driver_version"),
    ("Python", "python_version"),
)


def _num(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def run_id(data: RunRecord) -> str:
    return data.run_id if isinstance(data.run_id, str) else str(data.fingerprint.get("run_id", ""))


def verdict_class(data: RunRecord) -> str:
    slo = data.slo_block
    return "none" if slo is None or not slo.checks else ("pass" if slo.passed else "fail")


def verdict_title(data: RunRecord) -> str:
    slo = data.slo_block
    if slo is None or not slo.checks:
        return "Verdict: no SLOs configured"
    if slo.passed:
        return "Verdict: SLOs met"
    return "Verdict: SLOs MISSED (" + ", ".join(slo.failed) + ")"


def leak_line(data: RunRecord) -> str:
    memory = data.series
    suspected = data.leaks
    judged = [s for s, m in memory.items() if m.leak is not None]
    if suspected:
        return "Leak suspected: " + ", ".join(s for s in memory if s in suspected)
    if judged:
        return f"No leak suspected ({len(judged)} of {len(memory)} memory series judged)"
    return "No leak verdict yet (no memory series could be judged: run too short or still warming up)"


def _text(v: str | Any, default: str) -> str:
    return v if isinstance(v, str) else default


def leak_rows(data: RunRecord) -> list[list[str]]:
    """Per memory series: its leak verdict (and who gave it)."""
    return [[name, _text(m.verdict, "-"), _text(m.verdict_source, "")] for name, m in data.series.items()]


def slo_rows(data: RunRecord) -> list[list[str]]:
    slo = data.slo_block
    return [[c.status, c.name, format_observed(c), format_limit(c)] for c in (slo.checks if slo is not None else [])]


def overview_rows(data: RunRecord) -> list[list[str]]:
    rows = [
        ["throughput", units.with_unit(data.throughput_rps, "req/s")],
        ["duration", units.with_unit(data.duration_seconds, "s")],
        ["requests", ", ".join(f"{k} {v}" for k, v in data.requests.items() if v) or "none"],
    ]
    if isinstance(data.segments, list):
        restarts = data.restarts if isinstance(data.restarts, int) else 0
        unclean = data.unclean_exits if isinstance(data.unclean_exits, int) else 0
        rows.append(["segments", f"{len(data.segments)} ({restarts} restarts, {unclean} unclean exits)"])
        rows.append(["finished", _num(data.finished if isinstance(data.finished, bool) else None)])
    if isinstance(data.offered_rps, int | float) or data.offered_rps is None:
        rows.append(["offered load", units.with_unit(data.offered_rps, "req/s")])
    lag = data.schedule_lag_ms
    if isinstance(lag, ScheduleLag):
        rows.append(
            [
                "schedule lag",
                f"p50 {units.with_unit(lag.p50, 'ms')}, "
                f"p99 {units.with_unit(lag.p99, 'ms')}, "
                f"max {units.with_unit(lag.max, 'ms')}",
            ]
        )
    cold = data.cold_start
    if isinstance(cold, dict) and cold:
        rows.append(["cold start", ", ".join(f"{k} {v}" for k, v in cold.items())])
    return rows


def replay_rows(data: RunRecord) -> list[list[str]]:
    """A replayed trace's figures (docs/replay.md); none without ``--replay``."""
    rep = data.replay_block
    if rep is None:
        return []

    def num(v: object) -> str:
        return "-" if not isinstance(v, int | float) or isinstance(v, bool) else f"{v:g}"

    rows = [
        ["trace", f"{rep.path or '-'} ({rep.format or '?'}, {num(rep.rows)} rows over {num(rep.span_seconds)} s)"],
        ["speed", f"{num(rep.speed)}x{', looped' if rep.loop is True else ''}, {num(rep.passes)} pass(es)"],
        [
            "rows",
            f"sent {num(rep.rows_sent)}, dropped {num(rep.rows_dropped)}, skipped {num(rep.rows_skipped)}, "
            f"bad {num(rep.rows_bad)} a pass ({num(rep.rows_bad_met)} met, counted as bad_input)",
        ],
        [
            "intended / offered",
            f"{units.with_unit(_number(rep.intended_rps), 'req/s')} / "
            f"{units.with_unit(_number(rep.offered_rps), 'req/s')}",
        ],
        ["sent within 1 ms", "-" if not isinstance(rep.on_time_ratio, int | float) else f"{rep.on_time_ratio:.1%}"],
    ]
    if isinstance(rep.bad_lines, list) and rep.bad_lines:
        rows.append(["first bad rows", "; ".join(rep.bad_lines)])
    return rows


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def replay_arrivals(data: RunRecord) -> ReplayArrivals | None:
    """The per-minute arrivals of a replayed trace, when the record holds any."""
    rep = data.replay_block
    if rep is None or not isinstance(rep.arrivals, ReplayArrivals):
        return None
    return rep.arrivals if rep.arrivals.intended or rep.arrivals.sent else None


def stages(data: RunRecord) -> list[str]:
    lat = data.latency_ms
    return [s for s in STAGE_ORDER if s in lat] + sorted(s for s in lat if s not in STAGE_ORDER)


def _quantile_cells(s: Percentiles) -> list[str]:
    """One stage's figures as the cells of QUANTILE_COLUMNS."""
    count = str(s.count) if isinstance(s.count, int) else "-"
    return [*(units.ms(v) for v in (s.p50, s.p90, s.p99, s.p999, s.max, s.mean)), count]


def latency_rows(data: RunRecord) -> list[list[str]]:
    return [[s, *_quantile_cells(data.latency_ms[s])] for s in stages(data)]


def llm_rows(data: RunRecord) -> list[list[str]]:
    """Per-token timings of an LLM soak (``--api openai``), in the latency table's columns."""
    llm = data.llm_block
    if llm is None:
        return []
    timings = {"ttft_ms": llm.ttft_ms, "itl_ms": llm.itl_ms, "tpot_ms": llm.tpot_ms}
    return [[name, *_quantile_cells(t)] for name, key in LLM_TIMINGS if (t := timings[key]) is not None]


def llm_line(data: RunRecord) -> str | None:
    """Tokens and goodput of an LLM soak, as one line; None for other runs."""
    llm = data.llm_block
    if llm is None:
        return None
    return (
        f"tokens in {llm.input_tokens or 0}, out {llm.output_tokens or 0} "
        f"({_num(llm.output_tokens_per_second, 1)} output tokens/s); goodput "
        f"{_num(llm.goodput_rps)} req/s ({llm.goodput_requests or 0} requests within the TTFT/TPOT SLOs)"
    )


def batch_rows(data: RunRecord) -> list[list[str]]:
    b = data.batch_size
    if not isinstance(b, BatchSize):
        return []
    return [
        [k, _num(v)]
        for k, v in (("batches", b.batches), ("mean", b.mean), ("p50", b.p50), ("p99", b.p99), ("max", b.max))
    ]


def shapes_line(data: RunRecord) -> str | None:
    """The input shapes a run saw, as one line of text (a count, or shapes with their requests)."""
    seen = data.input_shapes_seen
    if isinstance(seen, int):
        return f"Input shapes seen: {seen} distinct"
    if isinstance(seen, dict):
        return "Input shapes seen: " + ", ".join(f"{k} ({v} requests)" for k, v in seen.items())
    if isinstance(seen, list):
        return "Input shapes seen: " + ", ".join(str(x) for x in seen)
    return None


# The columns of memory_rows, for every renderer.
MEMORY_HEADER = [
    "series",
    "first MiB",
    "last MiB",
    "min MiB",
    "max MiB",
    "trend MiB/h",
    "leak slope MiB/h",
    "detectable MiB/h",
    "verdict",
]


def _figure(v: float | Any | None) -> float | None:
    return float(v) if isinstance(v, int | float) else None


def memory_rows(data: RunRecord) -> list[list[str]]:
    rows = []
    for name, m in data.series.items():
        # A scraped server gauge is in its own unit (a ratio, a count): shown as it is, not in MiB.
        own = name.startswith(TARGET_METRIC_PREFIX)
        level, slope = (units.number, units.number_per_hour) if own else (units.mib, units.mib_per_hour)
        rows.append(
            [
                f"{name} (own unit)" if own else name,
                *(level(_figure(v)) for v in (m.first, m.last, m.min, m.max)),
                slope(_figure(m.trend_bytes_per_hour)),
                slope(_figure(m.slope_bytes_per_hour)),
                slope(_figure(m.detectable_slope_bytes_per_hour), signed=False),
                _text(m.verdict, "-"),
            ]
        )
    return rows


def event_rows(data: RunRecord) -> list[list[str]]:
    events = data.events if isinstance(data.events, list) else []
    return [[str(e.t), str(e.segment), str(e.kind), str(e.detail)] for e in events]


def segment_rows(data: RunRecord) -> list[list[str]]:
    segments = data.segments if isinstance(data.segments, list) else []
    return [
        [
            str(s.id),
            str(s.started_at),
            str(s.ended_at or "-"),
            units.seconds(s.duration_seconds),
            str(s.end),
            ", ".join(f"{k} {v}" for k, v in s.requests.items() if v),
        ]
        for s in segments
    ]


def fingerprint_rows(data: RunRecord) -> list[list[str]]:
    run = data.fingerprint
    rows = [[label, _num(run.get(key))] for label, key in FINGERPRINT_ROWS]
    env: dict[str, str] = run.get("allocator_env") or {}
    rows.append(["allocator env", ", ".join(f"{k}={v}" for k, v in env.items()) or "(none set)"])
    return rows


def config_text(data: RunRecord) -> str:
    # Redacted again here: a state file written before redaction must not leak through a report.
    return json.dumps(redact_secrets(data.config), indent=2, default=str)
