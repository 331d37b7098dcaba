"""`soakd sweep`: steps, knee and recommendation, as a user runs it and on the seed article's table."""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from soakd.config import ConfigError, load_config
from soakd.load.engine import EngineStats
from soakd.run.sweep import Mark, bottleneck, find_knee, is_stable, plan, recommend
from soakd.telemetry.histogram import HistSnapshot, LogHistogram
from tests.conftest import soakd_cmd

STEP_KEYS = {
    "concurrency", "max_batch_size", "throughput_rps", "p50_ms", "p90_ms", "p99_ms", "mean_batch_size",
    "peak_host_rss_bytes", "peak_gpu_memory_bytes", "stable", "bottleneck",
}  # fmt: skip
BOTTLENECKS = {"preprocess-bound", "model-bound", "queueing", "postprocess-bound"}

# The seed article's batching table: batch size, QPS, P99 ms.
SEED_TABLE = [(1, 65, 15.2), (4, 180, 22.1), (8, 240, 33.5), (32, 260, 123.0)]


def _steps(rows: Sequence[tuple[int, float, float]]) -> list[dict[str, object]]:
    return [
        {"index": i, "concurrency": 16, "max_batch_size": b, "throughput_rps": q, "p99_ms": p, "stable": True}
        for i, (b, q, p) in enumerate(rows)
    ]


def _sweep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "sleep.toml"
    # A model with a fixed per-batch cost and a small per-item one: batching pays, up to a point.
    cfg.write_text('[model]\nspec = "builtin:sleep"\nwarmup = 2\noptions = { batch_ms = 2.0, item_ms = 0.1 }\n')
    return subprocess.run(soakd_cmd("sweep", "--config", str(cfg), *args), capture_output=True, text=True, timeout=120)


def test_sweep_over_batch_sizes_reports_every_field_and_a_recommendation(tmp_path: Path) -> None:
    """Three steps over max batch size: each step has every figure, the best setting under the SLO
    is recommended, the table is printed, and the exit code is 0."""
    out = tmp_path / "sweep.json"
    proc = _sweep(
        tmp_path,
        "--concurrency",
        "16",
        "--max-batch-size",
        "1,4,16",
        "--step-duration",
        "2s",
        "--slo-p99-ms",
        "500",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    steps = result["steps"]
    assert [s["max_batch_size"] for s in steps] == [1, 4, 16]
    for s in steps:
        assert set(s) >= STEP_KEYS, STEP_KEYS - set(s)
        assert s["concurrency"] == 16 and s["throughput_rps"] > 0
        assert 0 < s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"]
        assert s["peak_host_rss_bytes"] > 0 and s["peak_gpu_memory_bytes"] is None  # CPU
        assert isinstance(s["stable"], bool) and s["bottleneck"] in BOTTLENECKS
    assert steps[0]["mean_batch_size"] == 1.0 and steps[2]["mean_batch_size"] > 4
    # Batching pays on this model: the biggest batch gives the most throughput.
    assert steps[2]["throughput_rps"] > 2 * steps[0]["throughput_rps"]
    rec = result["recommendation"]
    assert rec["p99_ms"] <= 500 and rec["slo_p99_ms"] == 500
    meeting = [s for s in steps if s["p99_ms"] <= 500]
    assert rec["throughput_rps"] == max(s["throughput_rps"] for s in meeting)
    assert "knee" in result and result["run"]["model"] == "builtin:sleep"
    assert "recommendation: step" in proc.stdout and "bottleneck" in proc.stdout


def test_no_step_meeting_the_slo_exits_1(tmp_path: Path) -> None:
    """An SLO nothing can meet: the steps are still reported, no recommendation, exit 1."""
    out = tmp_path / "sweep.json"
    proc = _sweep(tmp_path, "--rate", "200", "--step-duration", "1s", "--slo-p99-ms", "0.001", "--json", str(out))
    assert proc.returncode == 1, proc.stderr
    result = json.loads(out.read_text())
    assert result["mode"] == "rate" and result["steps"][0]["rate"] == 200
    assert result["recommendation"] is None
    assert "no step met p99 <= 0.001 ms" in proc.stdout


class TestKneeAndRecommendation:
    def test_seed_table_knee_is_before_the_p99_blowup(self) -> None:
        """BS8 -> BS32 adds 8% throughput for 267% more p99: the knee is BS8."""
        knee = find_knee(_steps(SEED_TABLE))
        assert knee is not None and knee["max_batch_size"] == 8
        assert knee["next_p99_rise_pct"] == pytest.approx(267.2, abs=0.1)

    def test_no_knee_when_p99_tracks_throughput(self) -> None:
        assert find_knee(_steps([(1, 100, 10.0), (2, 200, 11.0), (4, 400, 12.0)])) is None

    def test_recommendation_is_goodput_under_the_slo(self) -> None:
        """SLO 40 ms: BS8 (240 QPS, 33.5 ms) wins; BS32 is faster but breaks the SLO."""
        rec = recommend(_steps(SEED_TABLE), 40.0, None)
        assert rec is not None and rec["max_batch_size"] == 8 and rec["throughput_rps"] == 240

    def test_stable_steps_are_preferred_and_unstable_ones_marked(self) -> None:
        """A step that never settled loses to a stable one; chosen anyway, it says so."""
        steps = _steps(SEED_TABLE)
        steps[2]["stable"] = False
        rec = recommend(steps, 40.0, None)
        assert rec is not None and rec["max_batch_size"] == 4
        only_unstable = recommend(steps[2:3], 40.0, None)
        assert only_unstable is not None and "unstable" in only_unstable["reason"]

    def test_fixed_duration_sweeps_pick_the_fastest_and_flag_it(self) -> None:
        """With --step-duration, stability is only reported: the fastest step under the SLO wins."""
        steps = _steps(SEED_TABLE)
        steps[2]["stable"] = False
        rec = recommend(steps, 40.0, None, prefer_stable=False)
        assert rec is not None and rec["max_batch_size"] == 8 and rec["stable"] is False
        assert "unstable" in rec["reason"]

    def test_no_step_meets_the_slo(self) -> None:
        assert recommend(_steps(SEED_TABLE), 1.0, None) is None


def _ns(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "sweep_concurrency": None,
        "sweep_rate": None,
        "sweep_max_batch_size": None,
        "step_duration": None,
        "slo_p99_ms": None,
        "json_out": None,
    }
    return argparse.Namespace(**{**base, **kw})


class TestPlan:
    def test_grid_of_load_and_batch_size(self) -> None:
        p = plan(load_config(None), _ns(sweep_concurrency="1,8", sweep_max_batch_size="4,16"))
        assert p.mode == "concurrency"
        grid = [(s["concurrency"], s["max_batch_size"]) for s in p.steps]
        assert grid == [(1, 4), (1, 16), (8, 4), (8, 16)] and not p.one_axis

    def test_concurrency_can_follow_the_batch_size(self) -> None:
        """--concurrency 2x feeds each step twice its max batch size."""
        p = plan(load_config(None), _ns(sweep_concurrency="2x", sweep_max_batch_size="1,4,32"))
        assert [(s["concurrency"], s["max_batch_size"]) for s in p.steps] == [(2, 1), (8, 4), (64, 32)]
        assert p.one_axis  # the knee is looked for in step order

    @pytest.mark.parametrize(
        ("kw", "message"),
        [
            ({"sweep_concurrency": "1,x"}, "--concurrency: cannot parse 'x'"),
            ({"sweep_concurrency": "0x"}, "--concurrency: values must be > 0"),
            ({"sweep_concurrency": "4", "sweep_rate": "10"}, "not both"),
            ({"sweep_max_batch_size": "0"}, "--max-batch-size: values must be > 0"),
            ({"step_duration": "soon"}, "--step-duration"),
        ],
    )
    def test_bad_flags_are_config_errors(self, kw: dict[str, object], message: str) -> None:
        with pytest.raises(ConfigError, match=message):
            plan(load_config(None), _ns(**kw))


def _marks(windows: list[tuple[int, float]]) -> list[Mark]:
    """Cumulative engine reads one second apart; each window has ``n`` requests of ``latency`` s."""
    hist, ok = LogHistogram(), 0
    marks = []
    for t, (n, latency) in enumerate([(0, 0.0), *windows]):
        hist.observe_many([latency] * n)
        ok += n
        stats = EngineStats(float(t), {"ok": ok}, {"e2e": hist.snapshot()}, HistSnapshot.empty(), 0, 0)
        marks.append(Mark(float(t), stats, 0.0, 0.0, 0.0))
    return marks


class TestStability:
    def test_three_close_windows_are_stable(self) -> None:
        """Throughput and p99 within 10% over the last three windows; an early outlier does not count."""
        assert is_stable(_marks([(10, 0.5), (100, 0.010), (104, 0.0102), (98, 0.0099)]), 0.10)

    def test_a_drifting_p99_or_rate_is_unstable(self) -> None:
        assert not is_stable(_marks([(100, 0.010), (100, 0.013), (100, 0.016)]), 0.10)
        assert not is_stable(_marks([(100, 0.010), (130, 0.010), (160, 0.010)]), 0.10)

    def test_a_window_without_completions_is_unstable(self) -> None:
        assert not is_stable(_marks([(100, 0.010), (0, 0.0), (100, 0.010)]), 0.10)
        assert not is_stable(_marks([(100, 0.010), (100, 0.010)]), 0.10)  # too few windows


class TestBottleneck:
    def test_a_busy_preprocess_pool_wins(self) -> None:
        assert bottleneck(0.95, 0.95, {"inference": 9.0}) == "preprocess-bound"

    def test_a_busy_model_is_model_bound(self) -> None:
        assert bottleneck(0.2, 0.9, {"queue": 9.0}) == "model-bound"

    def test_otherwise_the_largest_stage_names_it(self) -> None:
        assert bottleneck(0.2, 0.3, {"queue": 5.0, "inference": 1.0, "preprocess": 2.0}) == "queueing"
        assert bottleneck(0.2, 0.3, {"queue": 0.1, "postprocess": 3.0}) == "postprocess-bound"
