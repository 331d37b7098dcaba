"""``soakd compare``: regressions beyond noise and threshold, fingerprint warnings, exit codes."""

from __future__ import annotations

import argparse
import copy
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from soakd.config import CompareConfig
from soakd.record.read import read_record
from soakd.report.command import compare_command
from soakd.report.compare import Comparison, block_bootstrap_ci, print_comparison
from tests.report_runs import runs, soakd


def doc(throughputs: list[float], p99s: list[float], **extra: Any) -> dict[str, Any]:
    """A summary with per-window figures (1 s windows) and matching aggregates."""
    windows = [
        {
            "t": i + 1.0,
            "seconds": 1.0,
            "throughput_rps": t,
            "ok": int(t),
            "errors": 0,
            "latency_ms": {"e2e": {"p50": p / 2, "p90": p * 0.8, "p99": p}},
        }
        for i, (t, p) in enumerate(zip(throughputs, p99s, strict=True))
    ]
    return {
        "throughput_rps": float(np.mean(throughputs)),
        "requests": {"ok": int(sum(throughputs))},
        "latency_ms": {"e2e": {"p50": float(np.mean(p99s)) / 2, "p99": float(np.mean(p99s))}},
        "windows": windows,
        "run": {"model_sha256": "abc", "device_name": "cpu", "torch_version": "2.5"},
        **extra,
    }


def judged(a: dict[str, Any], b: dict[str, Any], cfg: CompareConfig | None = None) -> Comparison:
    # Through JSON, as compare reads a summary from its file (numpy figures become plain numbers).
    return Comparison(
        read_record(json.loads(json.dumps(a))), read_record(json.loads(json.dumps(b))), cfg or CompareConfig()
    ).run()


class TestNoise:
    rng = np.random.default_rng(7)

    def noisy(self, mean: float, sd: float, n: int = 30) -> list[float]:
        return list(self.rng.normal(mean, sd, n))

    def test_identical_runs_are_not_a_regression(self) -> None:
        """A summary compared with itself changes nothing."""
        a = doc(self.noisy(1000, 50), self.noisy(10, 1))
        assert judged(a, a).regressions == []

    def test_a_clear_drop_is_a_regression(self) -> None:
        """Throughput 20% lower in every window, with little noise: flagged by name."""
        a, b = doc(self.noisy(1000, 20), self.noisy(10, 0.3)), doc(self.noisy(800, 20), self.noisy(10, 0.3))
        assert judged(a, b).regressions == ["throughput"]

    def test_past_threshold_but_within_noise_is_not(self) -> None:
        """A p99 20% higher on average, but with windows swinging ±50%, is within noise."""
        a = doc([1000.0] * 8, [10, 5, 15, 10, 5, 15, 10, 5])
        b = doc([1000.0] * 8, [12, 6, 18, 12, 6, 18, 12, 6.0])
        cmp = judged(a, b)
        assert cmp.regressions == []
        row = next(r for r in cmp.rows if r.metric == "p99 e2e")
        assert row.note == "past threshold but within noise"

    def test_beyond_noise_but_under_threshold_is_not(self) -> None:
        """A steady 2% throughput drop is real but under the 5% threshold."""
        a, b = doc([1000.0, 1001, 999, 1000, 1000], [10.0] * 5), doc([980.0, 981, 979, 980, 980], [10.0] * 5)
        assert judged(a, b).regressions == []
        assert judged(a, b, CompareConfig(max_throughput_drop=0.01)).regressions == ["throughput"]

    def test_without_any_noise_estimate_it_cannot_tell(self) -> None:
        """Summaries with neither per-window data nor request counts: a change past the
        threshold is 'cannot tell', not a regression, and the output says why."""
        a, b = doc([1000.0] * 3, [10.0] * 3), doc([800.0] * 3, [10.0] * 3)
        del a["windows"], b["windows"], a["requests"], b["requests"]
        cmp = judged(a, b)
        assert cmp.regressions == []
        assert cmp.rows[0].verdict == "cannot tell" and cmp.undecided == ["throughput"]
        assert "no noise estimate" in cmp.rows[0].note
        out = io.StringIO()
        print_comparison(cmp, "A", "B", out)
        assert "no regression found; cannot tell for throughput" in out.getvalue()

    def test_without_windows_the_counts_decide(self) -> None:
        """The same 20% drop, with 3000 and 2400 ok requests: their Poisson error (2%) is far
        smaller, so it is a regression, judged on the counts."""
        a, b = doc([1000.0] * 3, [10.0] * 3), doc([800.0] * 3, [10.0] * 3)
        del a["windows"], b["windows"]
        cmp = judged(a, b)
        assert cmp.regressions == ["throughput"]
        assert "Poisson error of the ok counts" in cmp.rows[0].interval

    def test_block_bootstrap_interval_covers_the_difference(self) -> None:
        """The interval of the mean difference brackets the true shift and excludes zero when it is large."""
        rng = np.random.default_rng(1)
        xa, xb = rng.normal(100, 5, 40), rng.normal(110, 5, 40)
        lo, hi = block_bootstrap_ci(xa, xb, 0.95, 2000, rng)
        assert 0 < lo < 10 < hi

    def test_errors_and_leaks(self) -> None:
        """More failed requests (significantly) and a new leak verdict are regressions."""
        a = doc([1000.0] * 5, [10.0] * 5, memory={"host_rss": {"leak_suspected": False, "slope_bytes_per_hour": 1.0}})
        b = copy.deepcopy(a)
        b["requests"] = {"ok": 4900, "error": 100}
        b["memory"]["host_rss"] = {"leak_suspected": True, "slope_bytes_per_hour": 5e8}
        assert judged(a, b).regressions == ["error ratio", "memory slope host_rss"]
        assert judged(a, b, CompareConfig(leak=False, max_error_ratio_increase=0.05)).regressions == []


def test_fingerprint_differences_warn(tmp_path: Path) -> None:
    """Different model bytes or torch versions are named in a warning; the comparison still runs."""
    a = doc([1000.0] * 5, [10.0] * 5)
    b = copy.deepcopy(a)
    b["run"].update(model_sha256="def", torch_version="2.6")
    out = io.StringIO()
    print_comparison(judged(a, b), "A", "B", out)
    text = out.getvalue()
    assert "warning: fingerprints differ in model_sha256: 'abc' vs 'def'" in text
    assert "warning: fingerprints differ in torch_version" in text
    assert "no regression" in text


def test_the_driver_cuda_build_of_served_runs_is_not_a_difference() -> None:
    """A served model's driver runs no model: an old served run that recorded the driver's CUDA
    build (12.8) against a new one that records none is like for like; two runs of a model in
    process that differ in CUDA are not."""
    a = doc([1000.0] * 5, [10.0] * 5)
    a["run"].update(device="remote", cuda_version="12.8", cudnn_version=91002)
    b = copy.deepcopy(a)
    b["run"].update(cuda_version=None, cudnn_version=None)
    assert not [w for w in judged(a, b).warnings if "fingerprints differ" in w]
    a["run"]["device"] = b["run"]["device"] = "cuda:0"
    assert [w for w in judged(a, b).warnings if "fingerprints differ" in w] == [
        "fingerprints differ in cuda_version: '12.8' vs None",
        "fingerprints differ in cudnn_version: 91002 vs None",
    ]


def test_unreadable_input_exits_2(tmp_path: Path) -> None:
    """A missing file or a JSON that is not a summary is a usage error."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    for path in (tmp_path / "missing.json", bad):
        ns = argparse.Namespace(a=str(path), b=str(path), config=None)
        assert compare_command(ns, io.StringIO()) == 2


class TestRealRuns:
    def test_same_run_compared_with_itself_exits_0(self) -> None:
        """A summary compared with itself: exit 0, no regression."""
        fast = runs("fast")["fast"]
        res = soakd("compare", str(fast.summary_path), str(fast.summary_path))
        assert res.returncode == 0, res.stdout + res.stderr
        assert "no regression" in res.stdout

    def test_slower_model_is_a_regression(self) -> None:
        """The same model four times slower per batch: exit 1, throughput named as the regression."""
        fast, slow = runs("fast", "slow").values()
        assert slow.rc == 0, slow.describe()
        res = soakd("compare", str(fast.summary_path), str(slow.summary_path))
        assert res.returncode == 1, res.stdout + res.stderr
        line = next(x for x in res.stdout.splitlines() if x.startswith("regression:"))
        assert "throughput" in line
        assert "model.options" in res.stdout  # the config difference is pointed out

    def test_faster_model_is_not_a_regression(self) -> None:
        """The other way round everything improves: exit 0."""
        fast, slow = runs("fast", "slow").values()
        res = soakd("compare", str(slow.summary_path), str(fast.summary_path))
        assert res.returncode == 0, res.stdout + res.stderr

    def test_report_json_compares_too(self, tmp_path: Path) -> None:
        """`report --format json` output is accepted as well as --summary-json output."""
        fast = runs("fast")["fast"]
        out = tmp_path / "report.json"
        res = soakd("report", "--state-dir", str(fast.state_dir), "--format", "json", "--output", str(out))
        assert res.returncode == 0, res.stderr
        res = soakd("compare", str(out), str(out))
        assert res.returncode == 0, res.stdout + res.stderr
        assert "no regression" in res.stdout
