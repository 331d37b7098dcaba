"""``soakd sweep`` against a served model: the steps drive a real HTTP server (tests/http_target_server.py)
over one client, and a batch-size axis, which only the server could honour, is refused."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import soakd_cmd
from test_http_target import Server, bodies, server  # noqa: F401 - pytest fixtures


def sweep(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(soakd_cmd("sweep", *args), capture_output=True, text=True, timeout=120)


def test_sweep_over_concurrency_against_a_target(server: Server, bodies: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "sweep.json"
    target = ["--target", server.url("/ok"), "--api", "http", "--samples", str(bodies), "--warmup", "3"]
    res = sweep(*target, "--concurrency", "1,4", "--step-duration", "2s", "--json", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    result = json.loads(out.read_text())
    assert [s["concurrency"] for s in result["steps"]] == [1, 4]
    for step in result["steps"]:
        assert step["requests"]["ok"] > 20 and set(step["requests"]) == {"ok"}, step
        assert step["throughput_rps"] > 0 and step["p99_ms"] > 0
        assert step["mean_batch_size"] == 0  # the server batches, soakd does not
    served = server.stats()["requests"]
    assert served >= 3 + sum(s["requests"]["ok"] for s in result["steps"])  # warm-up + every step hit it
    assert result["run"]["target"]["url"] == server.url("/ok")
    assert result["cold_start"]["warmup_runs"] == 3
    assert "1" in res.stdout and "4" in res.stdout  # the table


def test_sweep_refuses_a_batch_axis_for_a_target(server: Server, bodies: Path) -> None:  # noqa: F811
    target = ["--target", server.url("/ok"), "--api", "http", "--samples", str(bodies)]
    res = sweep(*target, "--max-batch-size", "1,8", "--step-duration", "2s")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--max-batch-size" in res.stderr and "server" in res.stderr
    assert "Traceback" not in res.stderr
