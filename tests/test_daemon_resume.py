"""kill -9 mid-run, start again: the run continues as a new segment and loses nothing committed."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from pathlib import Path

from soakd.state import DB_NAME
from tests.conftest import soakd_cmd, wait_for


def _committed_ok(state: Path, segment: int) -> int:
    """Requests with outcome ok that the state database holds for ``segment``, read as a report would."""
    db = state / DB_NAME
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT outcomes FROM windows WHERE segment_id = ?", (segment,)).fetchall()
    finally:
        conn.close()
    return sum(json.loads(r[0]).get("ok", 0) for r in rows)


def test_kill_9_then_restart_resumes_the_run(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Under systemd (INVOCATION_ID set) a restart after SIGKILL picks the run up from current-run; the
    report covers both segments, counts the restart, and keeps every request committed before the kill."""
    state = tmp_path / "state"
    cfg = tmp_path / "soak.toml"
    cfg.write_text('[state]\nflush_interval = "300ms"\nwindow = "1s"\n')
    args = (
        "--config",
        str(cfg),
        "--model",
        "builtin:noop",
        "--warmup",
        "2",
        "--rate",
        "300",
        "--state-dir",
        str(state),
    )
    env = {"INVOCATION_ID": "0123456789abcdef"}  # what systemd sets: resume the unfinished run

    first = daemon_factory(*args, env=env)
    wait_for(lambda: _committed_ok(state, 1) > 300, 60, what="segment 1 to commit requests")
    first.proc.send_signal(signal.SIGKILL)
    assert first.proc.wait(10) == -signal.SIGKILL
    committed = _committed_ok(state, 1)
    assert committed > 300

    second = daemon_factory(*args, env=env)
    wait_for(lambda: _committed_ok(state, 2) > 300, 60, what="segment 2 to commit requests")
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(60) == 0, second.output()
    assert "resuming run" in second.output()

    res = subprocess.run(
        soakd_cmd("report", "--state-dir", str(state), "--format", "json"), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    segs = report["segments"]
    assert [s["id"] for s in segs] == [1, 2] and report["restarts"] == 1
    assert segs[0]["end"].startswith("unclean") and segs[1]["end"] == "SIGTERM"
    assert segs[0]["requests"]["ok"] == committed  # nothing committed before the kill is lost
    assert report["requests"]["ok"] == segs[0]["requests"]["ok"] + segs[1]["requests"]["ok"]
    assert report["latency_ms"]["e2e"]["count"] == report["requests"]["ok"]
    assert set(report["latency_ms"]["e2e"]) >= {"p50", "p90", "p99", "p999", "max", "mean"}
    assert report["run"]["model"] == "builtin:noop" and report["run"]["run_id"] == report["run_id"]
    assert report["duration_seconds"] > 0 and report["throughput_rps"] > 0
    assert any(e["kind"] == "restart" for e in report["events"])
    assert not report["finished"]  # stopped by SIGTERM, not at its end: a restart would resume it


def test_corrupt_state_file_does_not_stop_the_soak(daemon_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A garbage state file: a clear error line, the file moved aside, a fresh one, and the soak runs."""
    state = tmp_path / "state"
    state.mkdir()
    (state / DB_NAME).write_bytes(b"\x00garbage" * 512)
    d = daemon_factory(
        "--model",
        "builtin:noop",
        "--warmup",
        "2",
        "--concurrency",
        "2",
        "--duration",
        "2s",
        "--state-dir",
        str(state),
        "--run-id",
        "fresh",
    )
    assert d.proc.wait(60) == 0, d.output()
    assert "is corrupt" in d.output() and "started a fresh one" in d.output()
    assert list(state.glob(f"{DB_NAME}.corrupt-*"))
    res = subprocess.run(
        soakd_cmd("report", "--state-dir", str(state), "--run-id", "fresh"), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and json.loads(res.stdout)["requests"]["ok"] > 0
