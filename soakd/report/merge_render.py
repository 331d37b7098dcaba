"""The merged report (:mod:`soakd.report.merge`) as HTML or Markdown: the one-run report's
renderers over the merged figures, with a table of the shards after the overview."""

from __future__ import annotations

from typing import Any

import msgspec

from soakd.record.types import RunRecord
from soakd.report import units
from soakd.report.document import ReportDoc
from soakd.telemetry.histogram import HistSnapshot

SHARD_HEADER = (
    "part",
    "share",
    "requests",
    "error ratio",
    "p99 e2e ms",
    "started",
    "ended",
    "restarts",
    "lag p99 ms",
    "clock skew s",
    "health",
)


def merge_line(data: dict[str, Any]) -> str:
    m = data["merge"]
    parts = f"{m['parts']} parts" + (f" of {m['shards_expected']} shards" if m["shards_expected"] else "")
    gaps = m["missing_shards"] + m["failed_shards"]
    state = "every part present and healthy" if not gaps else "INCOMPLETE: " + "; ".join(gaps)
    spread = m.get("start_spread_seconds")
    when = f", from {m['started_at']} to {m['ended_at']}" if m.get("started_at") else ""
    starts = f" (starts {spread:.0f} s apart)" if spread else ""
    exact = "; " + "; ".join(m["notes"]) if m["notes"] else ""
    return f"Merged from {parts}{when}{starts}: {state}{exact}"


def shard_rows(data: dict[str, Any]) -> list[list[str]]:
    def num(v: Any, digits: int = 3) -> str:
        return "-" if v is None else f"{float(v):.{digits}f}"

    rows = []
    for e in data["shards"]:
        shard = e["shard"]
        name = f"{shard['index']}/{shard['count']} {e['name']}" if shard else e["name"]
        if len(e.get("shards") or ()) > 1:
            name = f"{','.join(map(str, e['shards']))} {e['name']}"
        rows.append(
            [
                name,
                "-" if e["share"] is None else f"{100 * e['share']:.1f}%",
                str(sum(e["requests"].values())),
                num(e["error_ratio"], 4),
                units.ms(e["p99_e2e_ms"]),
                str(e["started_at"] or "-"),
                str(e["ended_at"] or "-"),
                str(e["restarts"]),
                units.ms(e["schedule_lag_p99_ms"]),
                num(e["clock_skew_seconds"]),
                e["failed"] or "ok",
            ]
        )
    return rows


def render(data: dict[str, Any], hists: dict[str, HistSnapshot], fmt: str) -> str:
    doc = ReportDoc(record=msgspec.convert(data, RunRecord), hists=hists)
    if fmt == "md":
        from soakd.report.markdown import cell, render_markdown, table  # Markdown only

        text = render_markdown(doc)
        section = f"## Shards\n\n{cell(merge_line(data))}\n\n{table(SHARD_HEADER, shard_rows(data))}\n\n"
        return text.replace("## Latency percentiles", section + "## Latency percentiles", 1)
    from soakd.report import html  # matplotlib loads only for HTML

    text = html.render_html(doc)
    section = f'<h2 id="shards">Shards</h2><p>{html.esc(merge_line(data))}</p>'
    section += html.table(SHARD_HEADER, shard_rows(data))
    anchor = "<h2>Throughput and latency over time</h2>"
    return text.replace(anchor, section + anchor, 1)
