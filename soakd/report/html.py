"""The report as one self-contained HTML file: inline CSS and SVG plots, no scripts, no fetches.

Every piece of text from the run (names, events, config) goes through :func:`html.escape`;
the only unescaped markup is the SVG that :mod:`soakd.report.plots` made.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from soakd.record.types import BatchSize
from soakd.report import plots, sections
from soakd.report.document import ReportDoc

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1100px;color:#222;
padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;
vertical-align:top}th{background:#f5f5f5}table.kv th{font-weight:normal;white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{padding:.6em 1em;border-radius:6px}.pass{background:#e6f4ea;color:#135c26}
.fail{background:#fde7e7;color:#8a1111}.none{background:#f1f1f1}
.status-FAIL{color:#8a1111;font-weight:bold}.status-pass{color:#135c26}
figure{margin:.6em 0}figure svg{max-width:100%;height:auto}pre{background:#f7f7f7;padding:.6em;overflow:auto;
font-size:.85em}code{font-size:.9em}
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def table(header: Sequence[str] | None, rows: Sequence[Sequence[str]], numeric_from: int = 99) -> str:
    """A table; ``header`` None for a key-value table, whose first column is its own header."""

    def cell(i: int, c: str) -> str:
        if i >= numeric_from:
            return f'<td class="num">{esc(c)}</td>'
        return f'<th scope="row">{esc(c)}</th>' if header is None and i == 0 else f"<td>{esc(c)}</td>"

    body = "".join("<tr>" + "".join(cell(i, c) for i, c in enumerate(row)) + "</tr>" for row in rows)
    head = "" if header is None else "<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr></thead>"
    opening = '<table class="kv">' if header is None else "<table>"
    return f"{opening}{head}<tbody>{body}</tbody></table>"


def figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{esc(caption)}</figcaption></figure>"


# A line over time needs a few points to show a course; with fewer (a short run's one window, a
# memory series sampled twice) the plot is a dot or nothing, and the tables carry the figures.
MIN_POINTS_OVER_TIME = 3


def too_few(what: str, n: int) -> str:
    return (
        f"<p>{esc(what)}: {n} point{'' if n == 1 else 's'}, too few to draw over time (the table has the figures).</p>"
    )


def _verdict(doc: ReportDoc) -> str:
    data = doc.record
    cls = sections.verdict_class(data)
    parts = [
        f'<section id="verdict" class="verdict {cls}"><h2 id="verdict-heading">{esc(sections.verdict_title(data))}</h2>'
    ]
    rows = sections.slo_rows(data)
    if rows:
        body = "".join(
            f'<tr><td class="status-{esc(r[0])}">{esc(r[0])}</td><td>{esc(r[1])}</td>'
            f"<td>{esc(r[2])}</td><td>{esc(r[3])}</td></tr>"
            for r in rows
        )
        parts.append(
            "<table><thead><tr><th>result</th><th>check</th><th>observed</th><th>limit</th></tr></thead>"
            f"<tbody>{body}</tbody></table>"
        )
    parts.append(f"<p>{esc(sections.leak_line(data))}</p>")
    leaks = sections.leak_rows(data)
    if leaks:
        parts.append(table(["memory series", "leak verdict", "from"], leaks))
    parts.append("</section>")
    return "".join(parts)


def _load(doc: ReportDoc) -> str:
    data = doc.record
    rows = data.rows
    out = ["<h2>Throughput and latency over time</h2>"]
    if len(rows) >= MIN_POINTS_OVER_TIME:
        out.append(figure(plots.throughput_plot(rows), "Throughput per window (ok requests/s)"))
        out.append(
            figure(
                plots.latency_over_time_plot(rows, sections.stages(data)),
                "Latency per stage per window: p99 solid, p50 dashed; e2e is the wide band, "
                "each stage has its own marker",
            )
        )
    else:
        out.append(too_few("Windows", len(rows)) if rows else "<p>No windows recorded.</p>")
    out.append("<h2>Latency percentiles (ms)</h2>")
    out.append(table(["stage", *sections.QUANTILE_COLUMNS], sections.latency_rows(data), numeric_from=1))
    if doc.hists:
        hists = {s: doc.hists[s] for s in sections.stages(data) if s in doc.hists}
        out.append(figure(plots.latency_distribution_plot(hists), "Latency distribution per stage"))
    llm = sections.llm_rows(data)
    if llm:
        out.append('<h2 id="llm">Per-token latency (ms)</h2>')
        out.append(table(["timing", *sections.QUANTILE_COLUMNS], llm, numeric_from=1))
        out.append(f"<p>{esc(sections.llm_line(data) or '')}</p>")
    return "".join(out)


def _replay(doc: ReportDoc) -> str:
    """A replayed trace: its figures, and its arrivals per minute beside the achieved ones."""
    rows = sections.replay_rows(doc.record)
    if not rows:
        return ""
    out = ['<h2 id="replay">Replayed trace</h2>', table(None, rows)]
    arrivals = sections.replay_arrivals(doc.record)
    if arrivals is not None:
        out.append(
            figure(
                plots.arrivals_plot(arrivals),
                "The trace's arrivals per minute at their intended times (sent or dropped) beside "
                "the requests sent and completed per minute",
            )
        )
    return "".join(out)


def _batches(doc: ReportDoc) -> str:
    data = doc.record
    out = ["<h2>Batch sizes</h2>"]
    buckets = data.batch_size.buckets if isinstance(data.batch_size, BatchSize) else None
    if isinstance(buckets, list) and buckets:
        out.append(figure(plots.batch_size_plot(buckets), "Batches per size"))
    rows = sections.batch_rows(data)
    out.append(table(["batch size", "value"], rows, numeric_from=1) if rows else "<p>No batch data stored.</p>")
    shapes = sections.shapes_line(data)
    if shapes:
        out.append(f'<p id="input-shapes">{esc(shapes)}</p>')
    return "".join(out)


def _memory(doc: ReportDoc) -> str:
    data = doc.record
    out = ["<h2>Memory</h2>"]
    rows = sections.memory_rows(data)
    if not rows:
        return out[0] + "<p>No memory samples recorded.</p>"
    out.append(
        table(
            sections.MEMORY_HEADER,
            rows,
            numeric_from=1,
        )
    )
    t0 = doc.t0
    for name, (t, v) in doc.samples.items():
        if 0 < t.size < MIN_POINTS_OVER_TIME:
            out.append(too_few(name, int(t.size)))
        elif t.size:
            found = data.series.get(name)
            verdict = found.verdict if found is not None and isinstance(found.verdict, str) else ""
            out.append(
                figure(plots.memory_plot(name, t, v, t0 if t0 is not None else float(t[0])), f"{name}: {verdict}")
            )
    return "".join(out)


def render_html(doc: ReportDoc) -> str:
    data = doc.record
    run_id = sections.run_id(data)
    body = [
        f"<h1>soakd report: run {esc(run_id)}</h1>",
        _verdict(doc),
        "<h2>Overview</h2>",
        table(None, sections.overview_rows(data)),
        _load(doc),
        _replay(doc),
        _batches(doc),
        _memory(doc),
        "<h2>Events</h2>",
        table(["time", "segment", "kind", "detail"], sections.event_rows(data))
        if data.events
        else "<p>No events recorded.</p>",
    ]
    if data.segments:
        body += [
            "<h2>Segments</h2>",
            table(["id", "started", "ended", "seconds", "end", "requests"], sections.segment_rows(data)),
        ]
    body += [
        "<h2>Fingerprint</h2>",
        table(None, sections.fingerprint_rows(data)),
        "<h3>Config</h3>",
        f"<pre>{esc(sections.config_text(data))}</pre>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>soakd report: {esc(run_id)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
