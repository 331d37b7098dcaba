"""Warm-up tells a broken setup from a flaky model, stop means stop, user code that exits or
leaves threads behind cannot wedge a soak, and soakd says when the load or the harness, not
the model, shapes the figures. Every case is a real ``soakd run`` subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from soakd.run.session import OVERHEAD_WARN_RATIO
from tests.conftest import free_port, metric_value, scrape, soakd_cmd, wait_for

MODELS = '''
import pathlib, sys, threading, time
import torch

class Wrong(torch.nn.Module):
    """Expects 16 features; anything else fails inside the model, every call."""
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)
    def forward(self, x):
        return self.fc(x)

class Flaky(torch.nn.Module):
    """Fails one call in ten, warm-up included."""
    def __init__(self):
        super().__init__()
        self.n = 0
    def forward(self, x):
        self.n += 1
        if self.n % 10 == 3:
            raise RuntimeError("flaky call")
        return x * 2

class Exits(torch.nn.Module):
    """sys.exit() from forward once warmed up: user code, counted as an error."""
    def __init__(self):
        super().__init__()
        self.n = 0
    def forward(self, x):
        self.n += 1
        if self.n > 20 and self.n % 5 == 0:
            sys.exit(0)
        return x

class Slow(torch.nn.Module):
    def forward(self, x):
        pathlib.Path(__file__).with_name("slow-called").touch()  # the test waits on it: warm-up began
        time.sleep(0.05)
        return x

def wrong():
    return Wrong()

def flaky():
    return Flaky()

def exits():
    return Exits()

def exits_always():
    return lambda x: sys.exit(0)

def slow():
    return Slow()

def with_thread():
    threading.Thread(target=lambda: time.sleep(3600), name="user-poller").start()  # not a daemon
    return lambda x: x
'''


def _models(tmp_path: Path) -> Path:
    path = tmp_path / "hostile_models.py"
    path.write_text(MODELS)
    return path


def _run(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        soakd_cmd("run", "--metrics-addr", f"127.0.0.1:{free_port()}", "--state-dir", str(tmp_path / "state"), *args),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_model_that_rejects_the_input_shape_is_a_setup_error(tmp_path: Path) -> None:
    """Every warm-up call fails: exit 2 with the model's own message and the shape it was given."""
    models = _models(tmp_path)
    res = _run(tmp_path, "--model", f"python:{models}:wrong", "--input-shapes", "3x8x8", "--duration", "5s")
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("soakd: error:") and "warm-up" in last and "input shape 3x8x8" in last
    assert "mat1 and mat2" in last  # torch's own words
    assert "Traceback" not in res.stderr


def test_sys_exit_in_every_warmup_call_is_a_setup_error_not_a_silent_exit_0(tmp_path: Path) -> None:
    """A model whose forward calls sys.exit(0) never passes warm-up: exit 2, said in one line."""
    models = _models(tmp_path)
    res = _run(tmp_path, "--model", f"python:{models}:exits_always", "--input-shapes", "4", "--duration", "5s")
    assert res.returncode == 2, res.stderr
    assert "SystemExit" in res.stderr and "Traceback" not in res.stderr


def test_a_flaky_model_is_warmed_up_anyway_and_its_failures_counted(tmp_path: Path) -> None:
    """One call in ten fails: warm-up goes on (failures logged and in cold_start), the soak runs,
    and the soak's failures are counted as outcome=error."""
    models = _models(tmp_path)
    out = tmp_path / "summary.json"
    res = _run(
        tmp_path,
        "--model",
        f"python:{models}:flaky",
        "--input-shapes",
        "4",
        "--warmup",
        "20",
        "--duration",
        "3s",
        "--summary-json",
        str(out),
    )
    assert res.returncode == 1, res.stderr  # one in ten failed: past the default 1% gate
    assert "SLO FAIL error ratio (default)" in res.stdout
    summary = json.loads(out.read_text())
    assert summary["slo"]["failed"] == ["error ratio (default)"]
    assert summary["cold_start"]["warmup_failures"] >= 1
    assert "warm-up:" in res.stderr and "flaky" in res.stderr
    assert summary["requests"]["error"] > 0 and summary["requests"]["ok"] > summary["requests"]["error"]


def test_sys_exit_in_forward_during_the_soak_is_counted_not_fatal(tmp_path: Path) -> None:
    """SystemExit out of user code during the soak is outcome=error, logged once; the run ends on
    time, every request accounted for, and with no [slo] the default error gate fails it (exit 1);
    `[slo] max_error_ratio = 1.0` lets the same soak exit 0."""
    models = _models(tmp_path)
    out = tmp_path / "summary.json"
    lenient = tmp_path / "lenient.toml"
    lenient.write_text("[slo]\nmax_error_ratio = 1.0\n")
    t0 = time.monotonic()
    res = _run(
        tmp_path,
        "--model",
        f"python:{models}:exits",
        "--input-shapes",
        "4",
        "--warmup",
        "5",
        "--duration",
        "3s",
        "--summary-json",
        str(out),
    )
    assert res.returncode == 1, res.stderr
    assert time.monotonic() - t0 < 40
    summary = json.loads(out.read_text())
    assert summary["requests"]["error"] > 0 and summary["requests"]["ok"] > 0
    assert res.stderr.count("model raised SystemExit") == 1
    (gate,) = summary["slo"]["checks"]
    assert gate["name"] == "error ratio (default)" and gate["limit"] == 0.01 and gate["status"] == "FAIL"
    assert gate["observed"] == pytest.approx(summary["requests"]["error"] / sum(summary["requests"].values()))
    assert "SLO verdict: MISSED (error ratio (default))" in res.stdout
    again = _run(
        tmp_path,
        "--config",
        str(lenient),
        "--model",
        f"python:{models}:exits",
        "--input-shapes",
        "4",
        "--warmup",
        "5",
        "--duration",
        "2s",
    )
    assert again.returncode == 0, again.stderr


def test_sigterm_during_warmup_stops_promptly_without_ready(tmp_path: Path) -> None:
    """SIGTERM while a long warm-up runs: out within seconds, exit 0, no READY, no summary."""
    models = _models(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        soakd_cmd(
            "run",
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path / "state"),
            "--model",
            f"python:{models}:slow",
            "--input-shapes",
            "4",
            "--warmup",
            "100000",
            "--summary-json",
            str(tmp_path / "s.json"),
        ),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Inside warm-up (100000 calls of 50 ms) once the model's forward has run.
        wait_for(lambda: (models.parent / "slow-called").exists(), 60, what="the first warm-up call")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.monotonic() - t0 < 15, err  # between two 50 ms calls, then a plain exit
    assert proc.returncode == 0, err
    assert "during warm-up" in err and "soakd.daemon: ready" not in err
    assert not (tmp_path / "s.json").exists()


def test_threads_left_by_user_code_do_not_keep_soakd_alive(tmp_path: Path) -> None:
    """A factory that starts a non-daemon thread: soakd still exits when the run ends."""
    models = _models(tmp_path)
    t0 = time.monotonic()
    res = _run(
        tmp_path, "--model", f"python:{models}:with_thread", "--input-shapes", "4", "--duration", "2s", timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "user-poller" in res.stderr
    assert time.monotonic() - t0 < 45


def test_overload_is_said_during_the_run_and_the_run_keeps_to_its_duration(tmp_path: Path) -> None:
    """Open loop well past capacity: a warning names offered vs completed while it runs, the drain
    is bounded and stated, the leftover queue is counted as dropped, offered vs achieved reported."""
    out = tmp_path / "summary.json"
    cfg = tmp_path / "soak.toml"
    cfg.write_text('[model.options]\nbatch_ms = 20\n[metrics]\nstatus_interval = "1s"\n[load]\ndrain_timeout = "2s"\n')
    t0 = time.monotonic()
    res = _run(
        tmp_path,
        "--config",
        str(cfg),
        "--model",
        "builtin:sleep",
        "--input-shapes",
        "4",
        "--max-batch-size",
        "1",
        "--rate",
        "400",
        "--duration",
        "8s",
        "--summary-json",
        str(out),
    )
    wall = time.monotonic() - t0
    assert res.returncode == 1, res.stderr  # the drops fail the default error gate
    assert "SLO FAIL error ratio (default)" in res.stdout
    assert "overloaded:" in res.stderr and "offered" in res.stderr
    assert "draining" in res.stderr and "up to 2s" in res.stderr
    summary = json.loads(out.read_text())
    assert summary["offered_rps"] > 5 * summary["throughput_rps"]
    assert summary["requests"]["dropped"] > 0
    assert summary["duration_seconds"] < 8 + 2 + 1.5  # the duration, then at most the stated drain
    assert wall < 90  # start-up, warm-up and the report on a loaded 2-core machine come on top
    assert "offered" in res.stdout and "achieved" in res.stdout


def test_the_offline_figure_and_the_harness_warning(tmp_path: Path) -> None:
    """The model alone is timed after warm-up (gauge and summary, achieved/offline on the status
    line); when soakd's own per-batch work dwarfs the model's (a no-op model on large inputs),
    a warning says the harness sets the throughput."""
    out = tmp_path / "summary.json"
    cfg = tmp_path / "soak.toml"
    cfg.write_text('[metrics]\nstatus_interval = "1s"\n')
    res = _run(
        tmp_path,
        "--config",
        str(cfg),
        "--model",
        "builtin:noop",
        "--input-shapes",
        "3x128x128",
        "--concurrency",
        "16",
        "--max-batch-size",
        "8",
        "--duration",
        "4s",
        "--summary-json",
        str(out),
    )
    assert res.returncode == 0, res.stderr
    off = json.loads(out.read_text())["model_offline"]
    assert off["rps"] > 0 and off["batch_size"] == 8 and off["achieved_ratio"] > 0
    assert "of offline" in res.stdout
    assert "soakd's own per-batch work is" in res.stderr
    # The whole run's share, in the summary and its printout, tells the same as the warning.
    assert off["harness_overhead_ratio"] > OVERHEAD_WARN_RATIO
    assert f"soakd's own per-batch work {100 * off['harness_overhead_ratio']:.1f}% of the model's time" in res.stdout


def test_an_unreachable_otlp_collector_does_not_stretch_the_exit(tmp_path: Path) -> None:
    """OTLP pointed at a port nobody listens on: SIGTERM to exit stays well under 15 s (each OTLP
    step at exit has a deadline instead of the exporter's retries)."""
    port = free_port()
    dead = free_port()
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{dead}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "10",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        soakd_cmd(
            "run",
            "--metrics-addr",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path / "state"),
            "--model",
            "builtin:noop",
            "--warmup",
            "2",
        ),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        wait_for(
            lambda: metric_value(scrape(port), "soakd_requests_total", 'outcome="ok"'),
            60,
            what="soakd to serve requests",
        )
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert time.monotonic() - t0 < 15, err


def test_a_failed_start_exits_without_the_final_collection(tmp_path: Path) -> None:
    """A gRPC start check that fails (nothing listens): exit 2 with one line, and what numpy, grpc
    and aiohttp leave alive (some 60k objects; 280k with torch) is frozen out of the interpreter's
    final collections, which made such an exit take 1-3 s idle and up to 30 s on a loaded host
    (#15)."""
    probe = tmp_path / "probe.py"  # soakd's entry point, saying at exit how many objects were frozen
    probe.write_text(
        "import atexit, gc, os\n"
        "atexit.register(lambda: os.write(2, f'frozen at exit: {gc.get_freeze_count()}, "
        "tracked: {len(gc.get_objects())}\\n'.encode()))\n"
        "from soakd.cli import entry\n"
        "entry()\n"
    )
    url = f"grpc://127.0.0.1:{free_port()}"
    res = subprocess.run(
        [sys.executable, str(probe), "run", "--api", "kserve-v2", "--target", url, "--target-model", "tiny",
         "--duration", "2s", "--metrics-addr", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert f"target.url: {url}: cannot connect" in res.stderr and "Traceback" not in res.stderr, res.stderr
    frozen = re.search(r"frozen at exit: (\d+), tracked: (\d+)", res.stderr)
    assert frozen is not None, res.stderr
    # Nearly all of it frozen: what the final collections would still walk is a small remainder.
    held, tracked = int(frozen.group(1)), int(frozen.group(2))
    assert held > 20_000 and tracked < held / 10, res.stderr
