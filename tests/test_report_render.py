"""How the HTML report reads, checked on a real run: in the DOM (one number format per unit, no
empty header rows, shapes as a line) and as pixels in a headless Chromium screenshot (the page
is drawn, and the e2e and inference lines show as distinct colours even where they coincide)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from soakd.report.plots import STAGE_COLOURS
from tests.report_runs import Run, runs, soakd

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium")


@pytest.fixture(scope="module")
def fast() -> Run:
    run = runs("fast")["fast"]
    assert run.rc == 0, run.describe()
    return run


@pytest.fixture(scope="module")
def page(fast: Run) -> str:
    return fast.report_path.read_text(encoding="utf-8")


def _svg_after(page: str, caption: str) -> str:
    """The inline SVG of the figure with this caption."""
    end = page.index(caption)
    return page[page.rindex("<svg", 0, end) : page.index("</svg>", page.rindex("<svg", 0, end)) + 6]


def _legend(svg: str) -> str:
    """The legend group of a matplotlib SVG (up to the clip-path definitions that follow it)."""
    start = svg.index('id="legend_1"')
    end = svg.find("<defs>", start)
    return svg[start : end if end > 0 else len(svg)]


def _xs(fragment: str) -> list[float]:
    return [float(x) for x in re.findall(r'(?:\bx="|M |L )(-?[\d.]+)', fragment)]


def screenshot(tmp_path: Path, url: str, size: str, name: str) -> np.ndarray:
    assert CHROMIUM is not None
    out = tmp_path / name
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={out}",
        f"--window-size={size}",
        url,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and out.is_file(), res.stderr[-3000:]
    return np.asarray(Image.open(out).convert("RGB"), dtype=np.int16)


def _near(img: np.ndarray, hex_colour: str, alpha: float = 1.0, tol: int = 40) -> int:
    """Pixels within ``tol`` of the colour (drawn at ``alpha`` over white)."""
    rgb = np.asarray([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)], dtype=np.float64)
    target = alpha * rgb + (1 - alpha) * 255.0
    return int((np.abs(img - target).max(axis=2) <= tol).sum())


class TestDom:
    def test_key_value_tables_have_no_empty_header_row(self, page: str) -> None:
        """Overview and Fingerprint are key-value tables: no header row of empty cells."""
        assert "<th></th>" not in page
        for heading in ("<h2>Overview</h2>", "<h2>Fingerprint</h2>"):
            after = page[page.index(heading) + len(heading) :].lstrip()
            assert after.startswith('<table class="kv"><tbody><tr><th scope="row">'), after[:200]

    def test_input_shapes_are_a_line_of_text(self, page: str) -> None:
        """'Input shapes seen' is a sentence, not a one-row table."""
        m = re.search(r'<p id="input-shapes">Input shapes seen: ([^<]+)</p>', page)
        assert m and "1 distinct" in m.group(1), m
        assert "<h3>Input shapes seen" not in page

    def test_one_number_format_per_unit(self, fast: Run, page: str) -> None:
        """Latencies with three decimals, slopes signed with two and 'MiB/h', never an exponent."""
        text = re.sub(r"<svg.*?</svg>", "", page, flags=re.DOTALL)
        assert not re.search(r"\d[eE][+-]\d", text)
        e2e = fast.summary["latency_ms"]["e2e"]
        assert f'<td>e2e</td><td class="num">{e2e["p50"]:.3f}</td>' in page
        memory = re.search(r"<h2>Memory</h2>.*?</table>", page, re.DOTALL)
        assert memory
        slopes = re.findall(
            r'<td class="num">([^<]*)</td><td class="num">([^<]*)</td><td class="num">[^<]*</td>'
            r"</tr>",
            memory.group(0),
        )
        assert slopes and all(re.fullmatch(r"[+-]\d+\.\d\d|-", v) for pair in slopes for v in pair), slopes
        legends = re.findall(r">trend ([^<]*)</text>", page)
        assert legends and all(re.fullmatch(r"[+-]\d+\.\d\d MiB/h", x) for x in legends), legends

    def test_legends_sit_outside_the_plot_area(self, page: str) -> None:
        """In every line plot the legend lies right of the axes, so it covers no line."""
        for caption in (
            "Throughput per window",
            "Latency per stage per window",
            "Latency distribution per stage",
            "host_rss:",
        ):
            svg = _svg_after(page, caption)
            axes = svg[svg.index('id="patch_2"') :]
            right_edge = max(_xs(axes[: axes.index("</g>")]))
            assert min(_xs(_legend(svg))) > right_edge, caption

    def test_e2e_and_inference_lines_differ_in_more_than_colour(self, page: str) -> None:
        """Where e2e equals inference (no queue), the e2e p99 is a wider translucent stroke with
        its own marker under the inference line."""
        svg = _svg_after(page, "Latency per stage per window")
        styles = dict(
            re.findall(
                r'style="fill: none; stroke: (#[0-9a-f]{6}); stroke-opacity: [\d.]+; '
                r"stroke-width: ([\d.]+)",
                svg,
            )
        )
        assert STAGE_COLOURS["e2e"] in styles and float(styles[STAGE_COLOURS["e2e"]]) >= 4
        widths = dict(re.findall(r"stroke: (#[0-9a-f]{6}); stroke-width: ([\d.]+)", svg))
        assert float(widths[STAGE_COLOURS["inference"]]) < float(styles[STAGE_COLOURS["e2e"]])


@needs_chromium
class TestScreenshot:
    def test_the_page_is_drawn(self, fast: Run, tmp_path: Path) -> None:
        """The whole report as Chromium paints it: not blank, text and plots in many colours."""
        img = screenshot(tmp_path, fast.report_path.resolve().as_uri(), "1280,2400", "page.png")
        assert img.shape[0] >= 2000 and img.shape[1] == 1280
        inked = (img.min(axis=2) < 200).mean()
        assert inked > 0.02, inked
        assert len(np.unique(img.reshape(-1, 3), axis=0)) > 200
        for stage in ("e2e", "inference", "queue"):
            assert _near(img, STAGE_COLOURS[stage], tol=30) > 20, stage

    def test_e2e_shows_beside_inference_in_the_plot_area(self, page: str, tmp_path: Path) -> None:
        """The latency-over-time plot alone, cropped to the left of its legend (the axes): the
        inference green and the e2e band's translucent blue both cover many pixels, though the
        two lines carry nearly the same values."""
        svg = _svg_after(page, "Latency per stage per window")
        html = tmp_path / "plot.html"
        html.write_text(f"<!DOCTYPE html><html><body style='margin:0;background:#fff'>{svg}</body></html>")
        img = screenshot(tmp_path, html.resolve().as_uri(), "1000,500", "plot.png")
        legend_left = min(_xs(_legend(svg))) * 96 / 72  # pt -> CSS px
        axes = img[:, : int(legend_left) - 4]
        green = _near(axes, STAGE_COLOURS["inference"], tol=35)
        blue_band = _near(axes, STAGE_COLOURS["e2e"], alpha=0.5, tol=35)
        assert green > 300 and blue_band > 300, (green, blue_band)


def test_markdown_tables_have_named_headers(fast: Run) -> None:
    """Markdown needs a header row: the key-value tables name theirs instead of leaving it empty."""
    res = soakd("report", "--state-dir", str(fast.state_dir), "--format", "md")
    assert res.returncode == 0, res.stderr
    assert "| figure | value |" in res.stdout and "| fingerprint | value |" in res.stdout
    assert "|  |  |" not in res.stdout
    assert re.search(r"^Input shapes seen: 1 distinct$", res.stdout, re.MULTILINE)
