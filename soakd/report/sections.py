"""What a report says, as plain rows: shared by the HTML and Markdown renderers so both show
the same content (the HTML adds the plots)."""

from __future__ import annotations

import json
from typing import Any

from soakd.config import redact_secrets
from soakd.names import TARGET_METRIC_PREFIX
from soakd.record.write import LLM_TIMINGS
from soakd.report import units
from soakd.verdicts.slo import format_limit, format_observed

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


def verdict_title(data: dict[str, Any]) -> str:
    slo = data.get("slo") or {}
    if not slo.get("checks"):
        return "Verdict: no SLOs configured"
    if slo.get("passed"):
        return "Verdict: SLOs met"
    return "Verdict: SLOs MISSED (" + ", ".join(slo["failed"]) + ")"


def leak_line(data: dict[str, Any]) -> str:
    memory: dict[str, dict[str, Any]] = data.get("memory") or {}
    suspected = [s for s, m in memory.items() if m.get("leak_suspected")]
    judged = [s for s, m in memory.items() if m.get("leak_suspected") is not None]
    if suspected:
        return "Leak suspected: " + ", ".join(suspected)
    if judged:
        return f"No leak suspected ({len(judged)} of {len(memory)} memory series judged)"
    return "No leak verdict yet (no memory series could be judged: run too short or still warming up)"


def leak_rows(data: dict[str, Any]) -> list[list[str]]:
    """Per memory series: its leak verdict (and who gave it)."""
    return [
        [name, str(m.get("verdict", "-")), str(m.get("verdict_source", ""))]
        for name, m in (data.get("memory") or {}).items()
    ]


def slo_rows(data: dict[str, Any]) -> list[list[str]]:
    return [
        [c["status"], c["name"], format_observed(c), format_limit(c)] for c in (data.get("slo") or {}).get("checks", [])
    ]


def overview_rows(data: dict[str, Any]) -> list[list[str]]:
    req: dict[str, int] = data.get("requests") or {}
    rows = [
        ["throughput", units.with_unit(data.get("throughput_rps"), "req/s")],
        ["duration", units.with_unit(data.get("duration_seconds"), "s")],
        ["requests", ", ".join(f"{k} {v}" for k, v in req.items() if v) or "none"],
    ]
    if "segments" in data:
        rows.append(
            [
                "segments",
                f"{len(data['segments'])} ({data.get('restarts', 0)} restarts, "
                f"{data.get('unclean_exits', 0)} unclean exits)",
            ]
        )
        rows.append(["finished", _num(data.get("finished"))])
    if "offered_rps" in data:
        rows.append(["offered load", units.with_unit(data["offered_rps"], "req/s")])
    lag = data.get("schedule_lag_ms")
    if lag:
        rows.append(
            [
                "schedule lag",
                f"p50 {units.with_unit(lag.get('p50'), 'ms')}, "
                f"p99 {units.with_unit(lag.get('p99'), 'ms')}, "
                f"max {units.with_unit(lag.get('max'), 'ms')}",
            ]
        )
    cold = data.get("cold_start")
    if cold:
        rows.append(["cold start", ", ".join(f"{k} {v}" for k, v in cold.items())])
    return rows


def stages(data: dict[str, Any]) -> list[str]:
    lat: dict[str, Any] = data.get("latency_ms") or {}
    return [s for s in STAGE_ORDER if s in lat] + sorted(s for s in lat if s not in STAGE_ORDER)


def _quantile_cells(summary: dict[str, Any]) -> list[str]:
    """One stage_summary() as the cells of QUANTILE_COLUMNS."""
    return [str(summary.get(k, "-")) if k == "count" else units.ms(summary.get(k)) for k in QUANTILE_COLUMNS]


def latency_rows(data: dict[str, Any]) -> list[list[str]]:
    lat: dict[str, dict[str, Any]] = data.get("latency_ms") or {}
    return [[s, *_quantile_cells(lat[s])] for s in stages(data)]


def llm_rows(data: dict[str, Any]) -> list[list[str]]:
    """Per-token timings of an LLM soak (``--api openai``), in the latency table's columns."""
    llm: dict[str, Any] = data.get("llm") or {}
    return [[name, *_quantile_cells(llm[key])] for name, key in LLM_TIMINGS if isinstance(llm.get(key), dict)]


def llm_line(data: dict[str, Any]) -> str | None:
    """Tokens and goodput of an LLM soak, as one line; None for other runs."""
    llm = data.get("llm")
    if not llm:
        return None
    return (
        f"tokens in {llm.get('input_tokens', 0)}, out {llm.get('output_tokens', 0)} "
        f"({_num(llm.get('output_tokens_per_second'), 1)} output tokens/s); goodput "
        f"{_num(llm.get('goodput_rps'))} req/s ({llm.get('goodput_requests', 0)} requests within the TTFT/TPOT SLOs)"
    )


def batch_rows(data: dict[str, Any]) -> list[list[str]]:
    b: dict[str, Any] = data.get("batch_size") or {}
    return [[k, _num(b[k])] for k in ("batches", "mean", "p50", "p99", "max") if k in b]


def shapes_line(data: dict[str, Any]) -> str | None:
    """The input shapes a run saw, as one line of text (a count, or shapes with their requests)."""
    seen = data.get("input_shapes_seen")
    if isinstance(seen, bool) or seen is None:
        return None
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


def memory_rows(data: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, m in (data.get("memory") or {}).items():
        # A scraped server gauge is in its own unit (a ratio, a count): shown as it is, not in MiB.
        own = name.startswith(TARGET_METRIC_PREFIX)
        level, slope = (units.number, units.number_per_hour) if own else (units.mib, units.mib_per_hour)
        rows.append(
            [
                f"{name} (own unit)" if own else name,
                level(m.get("first")),
                level(m.get("last")),
                level(m.get("min")),
                level(m.get("max")),
                slope(m.get("trend_bytes_per_hour")),
                slope(m.get("slope_bytes_per_hour")),
                slope(m.get("detectable_slope_bytes_per_hour"), signed=False),
                str(m.get("verdict", "-")),
            ]
        )
    return rows


def event_rows(data: dict[str, Any]) -> list[list[str]]:
    return [
        [str(e.get("t")), str(e.get("segment")), str(e.get("kind")), str(e.get("detail"))]
        for e in data.get("events") or []
    ]


def segment_rows(data: dict[str, Any]) -> list[list[str]]:
    return [
        [
            str(s["id"]),
            str(s.get("started_at")),
            str(s.get("ended_at") or "-"),
            units.seconds(s.get("duration_seconds")),
            str(s.get("end")),
            ", ".join(f"{k} {v}" for k, v in (s.get("requests") or {}).items() if v),
        ]
        for s in data.get("segments") or []
    ]


def fingerprint_rows(data: dict[str, Any]) -> list[list[str]]:
    run: dict[str, Any] = data.get("run") or {}
    rows = [[label, _num(run.get(key))] for label, key in FINGERPRINT_ROWS]
    env: dict[str, str] = run.get("allocator_env") or {}
    rows.append(["allocator env", ", ".join(f"{k}={v}" for k, v in env.items()) or "(none set)"])
    return rows


def config_text(data: dict[str, Any]) -> str:
    # Redacted again here: a state file written before redaction must not leak through a report.
    return json.dumps(redact_secrets((data.get("run") or {}).get("config") or {}), indent=2, default=str)
