"""SLO gates: the checks themselves, their config, and the exit code of a real ``soakd run``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from soakd.config import ConfigError, SloConfig, load_config
from soakd.record.read import read_record
from soakd.record.write import to_json_object
from soakd.verdicts import slo as gate
from tests.report_runs import runs, soakd

SUMMARY = {
    "throughput_rps": 250.0,
    "duration_seconds": 120.0,
    "requests": {"ok": 990, "error": 6, "timeout": 4},
    "latency_ms": {"e2e": {"p99": 12.0}, "inference": {"p99": 9.0}, "queue": {"p99": 2.5}},
    "memory": {
        "host_rss": {"leak_suspected": True},
        "torch_cuda_allocated": {"leak_suspected": False},
        "host_uss": {"leak_suspected": None},
    },
}


def slo_block(slo: SloConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """The ``slo`` block as the summary writes it, for a summary given as its JSON."""
    return to_json_object(gate.slo_block(slo, read_record(summary)))


def check_slos(slo: SloConfig, summary: dict[str, Any]) -> list[gate.Check]:
    return gate.check_slos(slo, read_record(summary))


def by_name(block: dict[str, object]) -> dict[str, dict[str, object]]:
    return {c["name"]: c for c in block["checks"]}  # type: ignore[attr-defined]


class TestChecks:
    def test_each_check_reports_limit_observed_and_result(self) -> None:
        """Every configured SLO shows up with its limit, what was observed, and pass or fail."""
        slo = SloConfig(
            p99_ms=10.0,
            stage_p99_ms={"inference": 10.0, "queue": 2.0},
            max_error_ratio=0.02,
            min_throughput_rps=200.0,
            min_duration=60.0,
        )
        block = slo_block(slo, SUMMARY)
        checks = by_name(block)
        assert checks["p99 e2e"] == {
            "name": "p99 e2e",
            "limit": 10.0,
            "observed": 12.0,
            "op": "<=",
            "unit": "ms",
            "passed": False,
            "status": "FAIL",
        }
        assert checks["p99 inference"]["passed"] is True
        assert checks["p99 queue"]["passed"] is False
        assert checks["error ratio"]["observed"] == pytest.approx(0.01)
        assert checks["error ratio"]["passed"] is True
        assert checks["throughput"]["passed"] is True
        assert checks["duration"]["passed"] is True
        assert block["passed"] is False
        assert block["failed"] == ["p99 e2e", "p99 queue"]

    def test_no_slos_configured_applies_the_default_error_gate(self) -> None:
        """With no [slo] keys the default error bound (1% not ok) is the gate, named as the default."""
        block = slo_block(SloConfig(), SUMMARY)
        assert [(c["name"], c["limit"], c["passed"]) for c in block["checks"]] == [
            ("error ratio (default)", 0.01, True)
        ]
        failing = {**SUMMARY, "requests": {"ok": 400, "error": 17586}}
        block = slo_block(SloConfig(), failing)
        assert block["passed"] is False
        assert block["failed"] == ["error ratio (default)"]
        assert by_name(block)["error ratio (default)"]["observed"] == pytest.approx(17586 / 17986)

    def test_explicit_bounds_override_the_default_gate(self) -> None:
        """`max_error_ratio = 1.0` lets every failure through; `"none"` removes the error gate on purpose."""
        failing = {**SUMMARY, "requests": {"ok": 1, "error": 99}}
        assert slo_block(SloConfig(max_error_ratio=1.0), failing)["passed"] is True
        assert slo_block(SloConfig(max_error_ratio="none"), failing) == {"passed": True, "failed": [], "checks": []}

    def test_a_served_model_down_for_long_fails_the_same_bound(self) -> None:
        """A target down 30 s of a 60 s soak fails "target down (default)" though few requests failed."""
        served = {**SUMMARY, "duration_seconds": 60.0, "target": {"down_seconds": 30.0}}
        block = slo_block(SloConfig(), served)
        assert block["failed"] == ["target down (default)"]
        assert by_name(block)["target down (default)"]["observed"] == 0.5
        assert slo_block(SloConfig(max_error_ratio=0.6), served)["passed"] is True
        assert slo_block(SloConfig(max_error_ratio="none"), served)["checks"] == []

    def test_a_gate_never_passes_on_nothing_measured(self) -> None:
        """No request measured: the error gate, a latency bound and a throughput floor each fail."""
        empty: dict[str, Any] = {"throughput_rps": None, "requests": {}, "latency_ms": {}}
        block = slo_block(SloConfig(p99_ms=1000.0, min_throughput_rps=1.0), empty)
        assert block["failed"] == ["p99 e2e", "error ratio (default)", "throughput"]

    def test_too_short_a_run_fails_min_duration(self) -> None:
        """A run shorter than slo.min_duration cannot pass, whatever its latency."""
        block = slo_block(SloConfig(min_duration=3600.0), SUMMARY)
        assert block["failed"] == ["duration"]

    def test_leak_verdicts(self) -> None:
        """A suspected leak on a chosen series fails, a clean one passes, no verdict yet is shown only."""
        slo = SloConfig(no_leak=["host_rss", "torch_cuda_allocated", "host_uss"])
        checks = {c.name: c for c in check_slos(slo, SUMMARY)}
        assert checks["no leak host_rss"].passed is False
        assert checks["no leak torch_cuda_allocated"].passed is True
        assert checks["no leak host_uss"].passed is None
        assert checks["no leak host_uss"].status == "n/a"

    def test_per_stage_e2e_limit_overrides_p99_ms(self) -> None:
        """slo.stage_p99_ms.e2e is the more specific limit for the end-to-end stage."""
        checks = check_slos(SloConfig(p99_ms=1.0, stage_p99_ms={"e2e": 20.0}, max_error_ratio="none"), SUMMARY)
        assert [(c.name, c.limit, c.passed) for c in checks] == [("p99 e2e", 20.0, True)]


class TestConfig:
    def write(self, tmp_path: Path, text: str) -> Path:
        p = tmp_path / "c.toml"
        p.write_text(text)
        return p

    @pytest.mark.parametrize(
        ("text", "path"),
        [
            ("[slo.stage_p99_ms]\nbogus = 1.0\n", "slo.stage_p99_ms.bogus"),
            ("[slo.stage_p99_ms]\ninference = -1.0\n", "slo.stage_p99_ms.inference"),
            ('[slo]\nno_leak = "host_rss"\n', "slo.no_leak"),
            ("[slo]\nno_leak = [1]\n", "slo.no_leak[0]"),
            ('[slo]\nmin_duration = "soon"\n', "slo.min_duration"),
            ("[compare]\nconfidence = 2.0\n", "compare.confidence"),
            ("[compare]\nmax_throughput_drop = 1.5\n", "compare.max_throughput_drop"),
            ("[compare]\nbogus = 1\n", "compare.bogus"),
            ("[slo]\nmax_error_ratio = 1.5\n", "slo.max_error_ratio"),
            ('[slo]\nmax_error_ratio = "never"\n', "slo.max_error_ratio"),
        ],
    )
    def test_errors_name_the_key(self, tmp_path: Path, text: str, path: str) -> None:
        """A bad SLO or compare key is a config error that names its key path."""
        with pytest.raises(ConfigError, match=rf"^{re.escape(path)}:"):
            load_config(self.write(tmp_path, text))

    def test_full_section_loads(self, tmp_path: Path) -> None:
        """Every SLO key together, with a duration, loads typed."""
        text = '[slo]\np99_ms = 50\nno_leak = ["host_rss"]\nmin_duration = "2h"\n[slo.stage_p99_ms]\ninference = 20\n'
        cfg = load_config(self.write(tmp_path, text))
        assert cfg.slo == SloConfig(
            p99_ms=50.0, stage_p99_ms={"inference": 20.0}, no_leak=["host_rss"], min_duration=7200.0
        )

    def test_bad_slo_config_exits_2(self, tmp_path: Path) -> None:
        """`soakd run` with an invalid [slo] stops before loading anything, with exit code 2."""
        res = soakd("run", "--config", str(self.write(tmp_path, "[slo]\np99_ms = -3\n")), "--duration", "1s")
        assert res.returncode == 2, res.stderr
        assert "slo.p99_ms" in res.stderr


class TestRunExitCode:
    def test_unmeetable_p99_exits_1(self) -> None:
        """A run with an SLO it cannot meet prints the failed check and exits 1."""
        run = runs("strict")["strict"]
        assert run.rc == 1, run.describe()
        assert "SLO FAIL p99 e2e" in run.stdout
        assert "SLO verdict: MISSED (p99 e2e)" in run.stdout
        slo = run.summary["slo"]
        assert slo["passed"] is False
        check = by_name(slo)["p99 e2e"]
        assert check["limit"] == 0.001 and float(str(check["observed"])) > 0.001 and check["status"] == "FAIL"

    def test_lenient_slos_exit_0(self) -> None:
        """A run meeting every SLO exits 0, prints each pass and where its report is."""
        run = runs("fast")["fast"]
        assert run.rc == 0, run.describe()
        for name in ("p99 e2e", "p99 inference", "error ratio", "throughput"):
            assert f"SLO pass {name}" in run.stdout
        assert "SLO verdict: met" in run.stdout
        assert run.report_path == run.state_dir / run.run_id / "report.html"
        assert run.report_path.is_file()

    def test_report_gate_with_stricter_config(self) -> None:
        """`soakd report --config` re-checks a finished run against other SLOs: exit 1 when missed."""
        fast, strict = runs("fast", "strict").values()
        res = soakd("report", "--state-dir", str(fast.state_dir), "--format", "md", "--config", str(strict.config_path))
        assert res.returncode == 1, res.stderr
        assert "## Verdict: SLOs MISSED (p99 e2e)" in res.stdout
        ok = soakd("report", "--state-dir", str(fast.state_dir), "--format", "md", "--config", str(fast.config_path))
        assert ok.returncode == 0, ok.stderr


def test_summary_json_carries_the_gate() -> None:
    """--summary-json holds the slo block, per-window figures and memory series for CI to read."""
    summary = runs("fast")["fast"].summary
    assert summary["slo"]["passed"] is True
    assert len(summary["windows"]) >= 3
    w = summary["windows"][0]
    assert {"t", "seconds", "throughput_rps", "ok", "errors", "latency_ms"} <= set(w)
    assert w["latency_ms"]["e2e"]["p99"] > 0
    assert "host_rss" in summary["memory"]
    assert summary["batch_size"]["buckets"][-1]["le"] == 8.0


def test_sweep_steps_past_the_error_gate_are_never_recommended() -> None:
    """A sweep step with 5% failures fails the default gate and is skipped by the recommendation;
    when every step fails, there is no recommendation (sweep exits 1)."""
    from soakd.run.sweep import judge_errors, recommend

    def step(i: int, rps: float, requests: dict[str, int]) -> dict[str, Any]:
        total = sum(requests.values())
        ratio = (total - requests.get("ok", 0)) / total if total else None
        return {
            "index": i,
            "concurrency": i + 1,
            "max_batch_size": 1,
            "throughput_rps": rps,
            "p99_ms": 5.0,
            "stable": True,
            "error_ratio": ratio,
        }

    steps = [step(0, 100.0, {"ok": 1000}), step(1, 180.0, {"ok": 950, "error": 50}), step(2, 0.0, {})]
    judge_errors(steps, SloConfig())
    assert [s["error_gate"] for s in steps] == ["pass", "FAIL", "FAIL"]
    rec = recommend(steps, None, None)
    assert rec is not None and rec["index"] == 0
    assert recommend(steps[1:], None, None) is None
    judge_errors(steps, SloConfig(max_error_ratio=0.1))
    assert [s["error_gate"] for s in steps] == ["pass", "pass", "FAIL"]
