"""`soakd report --format json`: one summary for a whole run, merged across its segments."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from soakd.cli import main
from soakd.state import StateStore, WindowRow
from soakd.telemetry.histogram import LogHistogram


def _hist(values: np.ndarray) -> LogHistogram:
    h = LogHistogram()
    h.observe_many(values)
    return h


@pytest.fixture
def two_segments(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """Run r1: segment 1 killed (no end recorded), segment 2 ended by SIGTERM; fast then slow requests."""
    rng = np.random.default_rng(1)
    fast, slow = rng.uniform(0.001, 0.002, 3000), rng.uniform(0.010, 0.020, 1000)
    store = StateStore(tmp_path)
    seg1 = store.begin_segment("r1", {"model": "builtin:noop", "run_id": "r1"})
    for i, chunk in enumerate(np.split(fast, 3)):
        store.write_window(
            seg1, "r1", WindowRow(60.0 * i, 60.0 * (i + 1), {"ok": 1000, "error": 2}, {"e2e": _hist(chunk).snapshot()})
        )
    store.flush()
    seg2 = store.begin_segment("r1", {"model": "builtin:noop", "run_id": "r1"})
    store.write_window(
        seg2,
        "r1",
        WindowRow(
            500.0, 560.0, {"ok": 1000, "oom": 1}, {"e2e": _hist(slow).snapshot(), "queue": _hist(slow / 10).snapshot()}
        ),
    )
    store.flush()
    store.end_segment(seg2, "SIGTERM")
    store.begin_segment("other", None)  # a later run in the same state dir
    store.close()
    return tmp_path, np.concatenate([fast, slow])


def test_report_merges_segments(two_segments: tuple[Path, np.ndarray], capsys: pytest.CaptureFixture[str]) -> None:
    """Counts add up over segments; percentiles come from the merged histograms (within 1% of exact)."""
    state, values = two_segments
    assert main(["report", "--state-dir", str(state), "--run-id", "r1", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run_id"] == "r1"
    req = report["requests"]
    assert req["ok"] == 4000 and req["error"] == 6 and req["oom"] == 1
    assert [s["requests"]["ok"] for s in report["segments"]] == [3000, 1000]
    assert report["restarts"] == 1
    assert report["segments"][0]["end"].startswith("unclean") and report["segments"][1]["end"] == "SIGTERM"
    e2e = report["latency_ms"]["e2e"]
    assert set(e2e) >= {"p50", "p90", "p99", "p999", "max", "mean"} and e2e["count"] == 4000
    for key, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        exact = float(np.percentile(values, q, method="inverted_cdf")) * 1e3
        assert e2e[key] == pytest.approx(exact, rel=0.011), key
    assert e2e["max"] == pytest.approx(values.max() * 1e3, abs=1e-4)
    assert report["latency_ms"]["queue"]["count"] == 1000
    assert report["run"]["model"] == "builtin:noop"
    assert [e["kind"] for e in report["events"]][:2] == ["start", "restart"]


def test_report_defaults_to_the_latest_run_and_writes_output(
    two_segments: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    """Without --run-id the most recent run is reported; --output writes the JSON to a file."""
    state, _ = two_segments
    out = tmp_path / "r.json"
    assert main(["report", "--state-dir", str(state), "--output", str(out)]) == 0
    assert json.loads(out.read_text())["run_id"] == "other"


def test_unknown_run_or_state_dir_is_a_usage_error(
    two_segments: tuple[Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run id that is not there (or no database at all) exits 2 and says what exists."""
    state, _ = two_segments
    assert main(["report", "--state-dir", str(state), "--run-id", "nope"]) == 2
    err = capsys.readouterr().err
    assert "run 'nope' not found" in err and "r1" in err
    assert main(["report", "--state-dir", str(tmp_path / "empty")]) == 2
    assert "no state database" in capsys.readouterr().err
