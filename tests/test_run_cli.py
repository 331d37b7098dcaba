"""`soakd run` as a user runs it: a subprocess, /metrics over HTTP, the summary, clean shutdown."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import metric_value, scrape, soakd_cmd, wait_for


def test_run_serves_metrics_and_writes_the_summary(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A short closed-loop run exposes per-stage histograms and counts, then writes every summary key."""
    out = tmp_path / "summary.json"
    d = daemon_factory(
        "--model", "builtin:noop", "--warmup", "5", "--concurrency", "4", "--duration", "4s", "--summary-json", str(out)
    )
    d.wait_ready()
    text = d.metrics()
    buckets = [line for line in text.splitlines() if line.startswith("soakd_request_duration_seconds_bucket")]
    for stage in ("e2e", "queue", "inference"):
        assert any(f'stage="{stage}"' in line and 'le="0.0001"' in line for line in buckets)
    assert 'soakd_build_info{version="' in text
    assert "soakd_run_info{" in text and 'model="builtin:noop"' in text
    assert (metric_value(text, "soakd_model_load_seconds") or 0) > 0
    assert (metric_value(text, "soakd_warmup_seconds") or 0) > 0
    assert d.proc.wait(60) == 0, d.output()
    summary = json.loads(out.read_text())
    assert summary["throughput_rps"] > 0
    assert summary["requests"]["ok"] > 0 and summary["requests"]["error"] == 0
    for stage in ("e2e", "queue", "inference"):
        assert set(summary["latency_ms"][stage]) >= {"p50", "p90", "p99", "p999", "max", "mean"}
    # Warmup runs are kept out: the steady-state histogram holds exactly the counted requests.
    assert summary["latency_ms"]["e2e"]["count"] == summary["requests"]["ok"]
    assert summary["cold_start"]["warmup_runs"] == 5
    assert summary["batch_size"]["mean"] >= 1
    run = summary["run"]
    for key in (
        "model",
        "model_sha256",
        "soakd_version",
        "torch_version",
        "cuda_version",
        "device_name",
        "host",
        "config",
    ):
        assert key in run
    assert run["model"] == "builtin:noop" and len(run["model_sha256"]) == 64
    assert run["config"]["load"]["concurrency"] == 4
    assert "soakd summary:" in d.output()


def test_open_loop_summary_has_schedule_lag(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Open-loop runs report the lag between intended and actual send, in the summary and on /metrics."""
    out = tmp_path / "summary.json"
    d = daemon_factory(
        "--model",
        "builtin:noop",
        "--warmup",
        "2",
        "--rate",
        "300",
        "--arrival",
        "poisson",
        "--duration",
        "3s",
        "--summary-json",
        str(out),
    )
    d.wait_ready()
    assert "soakd_schedule_lag_seconds_bucket" in d.metrics()
    assert d.proc.wait(60) == 0, d.output()
    summary = json.loads(out.read_text())
    assert set(summary["schedule_lag_ms"]) == {"p50", "p99", "max"}
    assert 600 < summary["requests"]["ok"] < 1200


def test_sigterm_drains_and_writes_summary(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With no --duration soakd runs until SIGTERM, then drains in-flight work, writes the summary, exits 0."""
    out = tmp_path / "summary.json"
    d = daemon_factory("--model", "builtin:sleep", "--warmup", "2", "--concurrency", "8", "--summary-json", str(out))
    d.wait_ready()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(30) == 0, d.output()
    summary = json.loads(out.read_text())
    assert summary["requests"]["ok"] > 0
    assert "SIGTERM" in d.output()


def test_status_line_prints_rate_and_percentiles(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The live status line shows requests/s, p50/p99 of the last window, and errors."""
    cfg = tmp_path / "status.toml"
    cfg.write_text("[metrics]\nstatus_interval = '1s'\n")
    d = daemon_factory("--model", "builtin:noop", "--warmup", "1", "--config", str(cfg), "--duration", "3s")
    assert d.proc.wait(60) == 0, d.output()
    lines = [line for line in d.output().splitlines() if "req/s" in line and "p99" in line]
    assert lines, d.output()
    assert "errors 0" in lines[0]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
def test_exposition_passes_promtool(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """`promtool check metrics` accepts soakd's exposition (names, units, help, types)."""
    d = daemon_factory("--model", "builtin:noop", "--warmup", "1", "--duration", "30s")
    d.wait_ready()
    text = scrape(d.port)
    res = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_port_in_use_is_a_clear_error(daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """A second soakd on the same port exits 2 naming the metrics address."""
    first = daemon_factory("--model", "builtin:noop", "--warmup", "1", "--duration", "30s")
    wait_for(lambda: scrape(first.port), what="first soakd")
    res = subprocess.run(
        soakd_cmd("run", "--model", "builtin:noop", "--metrics-addr", f"127.0.0.1:{first.port}"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "metrics.addr" in res.stderr


def test_an_unexpected_failure_exits_3_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in soakd itself exits 3, not 1 (SLO missed) or 2 (config): systemd restarts only it."""
    from soakd import cli
    from soakd.errors import Exit
    from soakd.run import session

    def broken(cfg: object) -> int:
        raise RuntimeError("sampler state corrupted")

    monkeypatch.setattr(session, "run", broken)
    rc = cli.main(["run", "--model", "builtin:noop", "--duration", "1s"])
    assert rc == Exit.CRASH and rc == 3
    assert "soakd crashed" in caplog.text and "RuntimeError: sampler state corrupted" in caplog.text
