"""The HTML (and Markdown) report: self-contained, plotted, fingerprinted, escaped, and
rendered by a real headless browser."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from soakd.record.read import read_record
from soakd.report.document import ReportDoc
from soakd.report.html import render_html
from soakd.report.markdown import render_markdown
from tests.conftest import REPO, wait_for
from tests.report_runs import Run, runs, soakd

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
# Anything a browser would fetch: src/href/xlink:href/url() to a network or protocol-relative
# address, external scripts or stylesheets, @import.
NETWORK_REF = re.compile(
    r"""(?:src|href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//"""
    r"""|url\(\s*["']?\s*(?:https?:)?//"""
    r"""|<script[^>]*\bsrc\b|<link\b[^>]*\bhref\b|@import""",
    re.IGNORECASE,
)


@pytest.fixture(scope="module")
def fast() -> Run:
    run = runs("fast")["fast"]
    assert run.rc == 0, run.describe()
    return run


@pytest.fixture(scope="module")
def html(fast: Run) -> str:
    return fast.report_path.read_text(encoding="utf-8")


class TestSelfContained:
    def test_no_network_references(self, html: str) -> None:
        """Nothing in the file points at the network: it opens the same offline, years later."""
        assert NETWORK_REF.search(html) is None, NETWORK_REF.search(html)
        assert "<script" not in html.lower()

    def test_plots_are_inline_svg(self, html: str) -> None:
        """Throughput, latency over time, distribution, batch sizes and memory are drawn inline."""
        assert html.count("<svg") >= 5
        for caption in (
            "Throughput per window",
            "Latency per stage per window",
            "Latency distribution per stage",
            "Batches per size",
            "host_rss:",
        ):
            assert caption in html

    def test_verdict_comes_first(self, html: str) -> None:
        """The verdict heading is the first thing after the title, with every SLO check in it."""
        body = html[html.index("<body>") :]
        assert body.index("Verdict: SLOs met") < body.index("<svg")
        for check in ("p99 e2e", "p99 inference", "error ratio", "throughput", "no leak host_rss"):
            assert check in body[: body.index("<h2>Overview")]

    def test_fingerprint(self, fast: Run, html: str) -> None:
        """The result is bound to the model bytes, software, hardware and config."""
        run = fast.summary["run"]
        for value in (
            run["model_sha256"],
            run["torch_version"],
            run["model"],
            run["cpu_model"],
            run["host"],
            run["soakd_version"],
            "allocator env",
            "batch_ms",
        ):
            assert str(value) in html, value

    def test_report_command_writes_the_same_report(self, fast: Run, tmp_path: Path) -> None:
        """`soakd report --format html` for the run gives an equivalent file."""
        out = tmp_path / "r.html"
        res = soakd(
            "report",
            "--state-dir",
            str(fast.state_dir),
            "--run-id",
            fast.run_id,
            "--format",
            "html",
            "--output",
            str(out),
        )
        assert res.returncode == 0, res.stderr
        text = out.read_text()
        assert "Verdict: SLOs met" in text and text.count("<svg") >= 5
        assert NETWORK_REF.search(text) is None

    def test_markdown_has_the_same_content_as_tables(self, fast: Run) -> None:
        """--format md: verdict, percentiles, windows, memory, events and fingerprint as tables."""
        res = soakd("report", "--state-dir", str(fast.state_dir), "--format", "md")
        assert res.returncode == 0, res.stderr
        md = res.stdout
        for heading in (
            "## Verdict: SLOs met",
            "## Latency percentiles (ms)",
            "## Throughput and p99 per window",
            "## Memory",
            "## Events",
            "## Fingerprint",
        ):
            assert heading in md
        assert f"| model sha256 | {fast.summary['run']['model_sha256']} |" in md
        assert re.search(r"^\| e2e \| [\d.]+ \|", md, re.MULTILINE)
        assert "Per-token latency" not in md  # an in-process model streams no tokens


def test_text_is_escaped() -> None:
    """Event details, series names and config values cannot inject markup."""
    evil = "<script>alert(1)</script>"
    t = np.arange(10, dtype=np.float64)
    doc = ReportDoc(
        record=read_record(
            {
                "run_id": evil,
                "requests": {"ok": 1},
                "latency_ms": {"e2e": {"p99": 1.0}},
                "events": [{"t": "now", "segment": 1, "kind": "error", "detail": evil}],
                "memory": {evil: {"first": 1.0, "verdict": evil}},
                "run": {"model": evil, "config": {"model": {"spec": evil}}},
            }
        ),
        samples={evil: (t, t * 1000)},
        t0=0.0,
    )
    page = render_html(doc)
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    md = render_markdown(ReportDoc(record=read_record({**doc.data, "events": [{"detail": "a | b\nc"}]})))
    assert "a \\| b c" in md


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium")
def test_renders_in_a_headless_browser(fast: Run, tmp_path: Path) -> None:
    """A real browser opens the file offline: the DOM has the verdict and plots, no load errors."""
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--dump-dom",
        fast.report_path.resolve().as_uri(),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    dom = res.stdout
    assert re.search(r'<h2 id="verdict-heading">Verdict: SLOs met</h2>', dom), dom[:2000]
    assert dom.count("<svg") >= 5
    problems = [line for line in res.stderr.splitlines() if "Uncaught" in line or "ERR_" in line]
    assert problems == []


def test_report_on_a_running_soak(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A soak still running can be reported on: the report covers what is recorded so far."""
    cfg = tmp_path / "live.toml"
    cfg.write_text(
        '[model]\nspec = "builtin:sleep"\nwarmup = 5\n[state]\nflush_interval = "1s"\nwindow = "1s"\n'
        '[metrics]\nstatus_interval = "1s"\n[slo]\np99_ms = 5000\n'
    )
    state = tmp_path / "state"
    d = daemon_factory("--config", str(cfg), "--state-dir", str(state))
    d.wait_ready()

    def windows() -> int:
        conn = sqlite3.connect(f"file:{state / 'soakd.db'}?mode=ro", uri=True)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0])
        finally:
            conn.close()

    wait_for(lambda: windows() >= 3, 60, what="three recorded windows")
    out = tmp_path / "live.html"
    res = soakd("report", "--state-dir", str(state), "--format", "html", "--output", str(out))
    assert res.returncode == 0, res.stderr
    page = out.read_text()
    assert "Verdict: SLOs met" in page
    assert "still running" in page
    assert page.count("<svg") >= 3
    assert d.stop() == 0


@pytest.mark.parametrize("points", [1, 2, 3])
def test_a_memory_series_too_short_to_show_a_course_is_said_not_drawn(points: int) -> None:
    """A series sampled once or twice would plot as a dot or as nothing: the report says so and
    leaves the figures to the table; from three samples on it draws the series."""
    record = read_record(json.loads((REPO / "tests/fixtures/records/summary-0429580-replay.json").read_text()))
    t = 1.7e9 + np.arange(points, dtype=np.float64) * 5.0
    page = render_html(ReportDoc(record=record, samples={"host_rss": (t, np.full(points, 4e8))}))
    memory = page[page.index("<h2>Memory</h2>") :]
    drawn = "<figcaption>host_rss:" in memory
    assert drawn == (points >= 3), memory[:400]
    assert (f"host_rss: {points} point" in memory) == (points < 3)
