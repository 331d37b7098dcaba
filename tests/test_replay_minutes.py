"""Per-minute counts of a replayed trace (soakd/load/minutes.py) and the report's plot of them:
bounded however long the soak, consistent when read, and drawn beside the achieved ones."""

from __future__ import annotations

import json

from soakd.load.minutes import MinuteCounts, aligned, rebin
from soakd.record.read import read_record
from soakd.record.types import ReplayArrivals
from soakd.record.write import to_json_object
from soakd.report.document import ReportDoc
from soakd.report.html import render_html
from soakd.report.markdown import render_markdown
from tests.conftest import REPO


def test_counts_fall_in_their_minute() -> None:
    m = MinuteCounts()
    for t in (0.0, 59.999, 60.0, 61.0, 185.0):
        m.add(t)
    m.add(-0.2)  # an intended time just before the start: the first minute
    m.add(130.0, 5)
    assert m.snapshot() == (60.0, [3, 2, 5, 1])
    assert m.total == 11


def test_a_soak_longer_than_the_cap_doubles_the_width_and_keeps_every_count() -> None:
    """A week at one event per second: never more than the cap's numbers, nothing lost."""
    m = MinuteCounts(cap=1440)
    week = 7 * 86400
    for t in range(0, week, 10):
        m.add(float(t), 10)
    width, counts = m.snapshot()
    assert len(counts) <= 1440 and width == 60.0 * 8  # 10,080 minutes -> 8-minute buckets
    assert sum(counts) == week
    assert counts[0] == counts[-2] == width  # one event a second in every full bucket


def test_series_of_different_widths_are_aligned_on_the_widest() -> None:
    a, b = MinuteCounts(cap=4), MinuteCounts(cap=4)
    for t in range(0, 300, 30):  # five minutes: a's buckets widen to two minutes
        a.add(float(t))
    b.add(10.0, 7)
    block = aligned({"intended": a, "sent": b})
    assert block == {"bucket_seconds": 120.0, "intended": [4, 4, 2], "sent": [7, 0, 0]}
    assert rebin(60.0, [1, 2, 3], 120.0) == [3, 3]


def test_the_report_plots_the_arrivals_beside_the_achieved_and_tables_the_rows() -> None:
    """A replay summary's arrivals per minute become one plot; its rows a table (HTML, Markdown)."""
    old = json.loads((REPO / "tests/fixtures/records/summary-0429580-replay.json").read_text())
    arrivals = {
        "bucket_seconds": 60.0,
        "intended": [600, 600, 300],
        "sent": [600, 540, 280],
        "completed": [590, 500, 300],
    }
    doc = {**old, "replay": {**old["replay"], "rows_bad_met": 2, "arrivals": arrivals}}
    record = read_record(doc)
    assert record.replay_block is not None and record.replay_block.arrivals == ReplayArrivals(
        bucket_seconds=60.0, intended=[600, 600, 300], sent=[600, 540, 280], completed=[590, 500, 300]
    )
    assert to_json_object(record)["replay"] == doc["replay"]  # the new keys read and write back
    page = render_html(ReportDoc(record=record))
    section = page[page.index('<h2 id="replay">') :]
    assert "line 51: not JSON" in section and "2 met, counted as bad_input" in section
    figure = section[: section.index("</figure>")]
    assert figure.count("<svg") == 1 and "trace (intended)" in figure and "completed" in figure
    assert "## Replayed trace" in render_markdown(ReportDoc(record=record))
    without = render_html(ReportDoc(record=read_record(old)))  # an older replay summary: the table, no plot
    assert '<h2 id="replay">' in without and "trace (intended)" not in without
