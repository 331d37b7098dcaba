"""The report as Markdown: the HTML report's content as tables (no plots)."""

from __future__ import annotations

from collections.abc import Sequence

from soakd.record.types import BatchSize, WindowRow
from soakd.report import sections, units
from soakd.report.document import ReportDoc


def cell(text: str) -> str:
    # A pipe ends a cell and a newline ends the row; neither may come from the data.
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def window_series(w: WindowRow, key: str, stages: Sequence[str]) -> list[float | None]:
    """One window's ``key`` (p50/p90/p99) per stage; None where it has none."""
    figures = w.latency_ms if isinstance(w.latency_ms, dict) else {}
    out: list[float | None] = []
    for stage in stages:
        f = figures.get(stage)
        v = None if f is None else {"p50": f.p50, "p90": f.p90, "p99": f.p99}.get(key)
        out.append(None if v is None else float(v))
    return out


def render_markdown(doc: ReportDoc) -> str:
    data = doc.record
    out = [f"# soakd report: run {cell(sections.run_id(data))}", "", f"## {sections.verdict_title(data)}", ""]
    slo = sections.slo_rows(data)
    if slo:
        out += [table(["result", "check", "observed", "limit"], slo), ""]
    out += [sections.leak_line(data), ""]
    leaks = sections.leak_rows(data)
    if leaks:
        out += [table(["memory series", "leak verdict", "from"], leaks), ""]
    out += ["## Overview", "", table(["figure", "value"], sections.overview_rows(data)), ""]
    out += [
        "## Latency percentiles (ms)",
        "",
        table(["stage", *sections.QUANTILE_COLUMNS], sections.latency_rows(data)),
        "",
    ]
    llm = sections.llm_rows(data)
    if llm:
        out += ["## Per-token latency (ms)", "", table(["timing", *sections.QUANTILE_COLUMNS], llm), ""]
        out += [cell(sections.llm_line(data) or ""), ""]
    if data.rows:
        stages = sections.stages(data)
        rows = [
            [
                units.seconds(w.t),
                units.rps(w.throughput_rps),
                str(w.errors),
                *(units.ms(p99) for p99 in window_series(w, "p99", stages)),
            ]
            for w in data.rows
        ]
        out += [
            "## Throughput and p99 per window",
            "",
            table(["t (s)", "req/s", "errors", *(f"p99 {s} ms" for s in stages)], rows),
            "",
        ]
    replay = sections.replay_rows(data)
    if replay:
        out += ["## Replayed trace", "", table(["replay", "value"], replay), ""]
    buckets = data.batch_size.buckets if isinstance(data.batch_size, BatchSize) else None
    out += ["## Batch sizes", ""]
    if isinstance(buckets, list) and buckets:
        rows = [[f"<= {b.le:g}", str(b.count)] for b in buckets]
        out += [table(["requests per batch", "batches"], rows), ""]
    batch = sections.batch_rows(data)
    out += [table(["batch size", "value"], batch) if batch else "No batch data stored.", ""]
    shapes = sections.shapes_line(data)
    if shapes:
        out += [cell(shapes), ""]
    memory = sections.memory_rows(data)
    out += ["## Memory", "", table(sections.MEMORY_HEADER, memory) if memory else "No memory samples recorded.", ""]
    events = sections.event_rows(data)
    out += [
        "## Events",
        "",
        table(["time", "segment", "kind", "detail"], events) if events else "No events recorded.",
        "",
    ]
    if data.segments:
        out += [
            "## Segments",
            "",
            table(["id", "started", "ended", "seconds", "end", "requests"], sections.segment_rows(data)),
            "",
        ]
    out += [
        "## Fingerprint",
        "",
        table(["fingerprint", "value"], sections.fingerprint_rows(data)),
        "",
        "### Config",
        "",
        "```json",
        sections.config_text(data).replace("```", "'''"),
        "```",
        "",
    ]
    return "\n".join(out)
