"""bench/limit.py's side-by-side rounds: the offline loop is counted over exactly soakd's window."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench import limit


def test_the_offline_trace_is_counted_over_the_window_only(tmp_path: Path) -> None:
    trace = tmp_path / "off.trace"
    # 100 req/s for 10 s, then 300 req/s: marks every 50 ms, as child_offline_trace writes them,
    # with the process's page faults: 2 a request at first, none later.
    lines, n, faults = [], 0.0, 5000.0
    for k in range(401):
        t = k * 0.05
        lines.append(f"{1000 + t:.6f} {round(n)} {round(faults)}")
        n += (100 if t < 10 else 300) * 0.05
        faults += (2 * 100 if t < 10 else 0) * 0.05
    trace.write_text("\n".join(lines) + "\n")
    assert limit.trace_window(trace, 1002.0, 1008.0, 2) == pytest.approx(2 * 600, rel=1e-3)
    assert limit.trace_window(trace, 1011.0, 1019.0, 2) == pytest.approx(0, abs=1e-6)
    assert limit.trace_rate(trace, 1002.0, 1008.0) == pytest.approx(100, rel=1e-3)
    assert limit.trace_rate(trace, 1005.0, 1015.0) == pytest.approx(200, rel=1e-3)  # half at each rate
    assert limit.trace_rate(trace, 1012.525, 1019.0) == pytest.approx(300, rel=1e-3)  # between marks
    with pytest.raises(RuntimeError, match="does not cover"):
        limit.trace_rate(trace, 999.0, 1005.0)  # began before the loop was timing
    with pytest.raises(RuntimeError, match="does not cover"):
        limit.trace_rate(trace, 1015.0, 1021.0)  # ended after its last mark


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pins to one of two CPUs")
def test_a_row_paced_by_page_faults_says_so() -> None:
    """A row where either side faults in a megabyte a batch is marked as the allocator's; a row
    with a few stray faults is not."""
    quiet = {"soak_faults_per_call": [0.0, 2.0, 1.0], "offline_faults_per_call": [0.0, 0.0, 3.0]}
    assert limit.allocator_note(quiet) == ""
    soak = {"soak_faults_per_call": [2400.0, 2500.0, 2450.0], "offline_faults_per_call": [600.0, 650.0, 700.0]}
    assert "allocator-bound: 2,450 page faults a batch" in limit.allocator_note(soak)
    offline = {"soak_faults_per_call": [0.0], "offline_faults_per_call": [4000.0]}
    assert "4,000" in limit.allocator_note(offline)
    alternating = {"soak_faults_per_call": [1500.0] * 3}  # rounds run one side at a time: no offline faults
    assert "1,500" in limit.allocator_note(alternating)


@pytest.mark.e2e  # soakd and the bench start their own processes (through bench/limit.py)
def test_a_pinned_soakd_run_reports_its_measured_window(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    before = time.time()
    run = limit.soakd_run(
        tmp_path,
        ["--model", "builtin:noop", "--input-shapes", "16", "--warmup", "5", "--concurrency", "8", "--duration", "2s"],
        cpus=frozenset({cpu}),
    )
    after = time.time()
    start, end = run.window()
    assert before < start < end < after
    assert end - start == pytest.approx(float(run.summary["duration_seconds"]))
    assert 1.9 < end - start < 3.0
    assert float(run.summary["throughput_rps"]) > 0
    # Pinned to one CPU, the model threads get one intra-op thread (OMP_NUM_THREADS is the share).
    assert "1 model instance, 1 intra-op thread each" in run.log


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pins to one of two CPUs")
@pytest.mark.e2e  # runs soakd as a process (through bench/limit.py)
def test_more_cpu_instances_than_cores_are_named_in_a_warning(tmp_path: Path) -> None:
    cpu = min(os.sched_getaffinity(0))
    flags = [
        "--model",
        "builtin:noop",
        "--input-shapes",
        "16",
        "--warmup",
        "2",
        "--concurrency",
        "2",
        "--duration",
        "1s",
    ]
    run = limit.soakd_run(tmp_path, flags, "[batcher]\ninstances = 2\n", cpus=frozenset({cpu}))
    assert "2 model instances, 1 intra-op thread each" in run.log
    assert "WARNING soakd: batcher.instances = 2 on 1 CPU thread: the instances time-share" in run.log
    calm = limit.soakd_run(tmp_path, flags, "[batcher]\ninstances = 1\n", cpus=frozenset({cpu}))
    assert "time-share" not in calm.log


def test_side_by_side_keeps_the_instances_per_cpu() -> None:
    batch1 = next(x for x in limit.LOADS if x.name == "batch 1")
    assert batch1.instances == 2  # the row: two instances on the 2-core machine
    assert limit.on_half(batch1, 1, 2).instances == 1  # one CPU of two: one instance, not two time-sharing it
    assert limit.on_half(batch1, 4, 8).instances == 1
    assert limit.on_half(limit.Load("x", 1, 8, 8, 1.0), 4, 8).instances == 4
    assert limit.on_half(batch1, 1, 2).concurrency == batch1.concurrency


def test_the_offline_loop_runs_off_the_main_thread_and_keeps_its_errors() -> None:

    assert limit.on_thread(lambda: threading.current_thread().name) == "offline"

    def fails() -> int:
        raise ValueError("model said no")

    with pytest.raises(ValueError, match="model said no"):
        limit.on_thread(fails)


def test_the_malloc_lottery_bench_runs_each_variant_in_its_own_process() -> None:
    """bench/malloc_lottery.py prints every variant with its rate and faults, under the allocator
    settings it was asked for."""
    cmd = [sys.executable, str(limit.REPO / "bench" / "malloc_lottery.py"), "--model", "builtin:noop"]
    cmd += ["--shape", "16", "--rounds", "1", "--seconds", "0.2", "--steady-malloc"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=limit.env(), timeout=300, check=True).stdout
    lines = out.splitlines()
    assert "MALLOC_ARENA_MAX=1" in lines[0], out
    rows = {line[2:16].strip(): line[16:].split() for line in lines[2:]}
    assert set(rows) == {"offline", "main allocs", "view per call"}, out
    assert all(float(cols[0]) > 1000 for cols in rows.values()), out  # req/s of a no-op model


POINTER_LOG = '''
import os

import torch


class Pointers(torch.nn.Module):
    """Appends "batch-size data_ptr" per call to $POINTER_LOG."""

    def __init__(self) -> None:
        super().__init__()
        self._log = open(os.environ["POINTER_LOG"], "a", buffering=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._log.write(f"{x.shape[0]} {x.data_ptr()}\\n")
        return x.mean(dim=(1, 2, 3))


def make() -> Pointers:
    return Pointers()
'''


def steady_inputs(log: Path, batch: int) -> int:
    """Distinct inputs among the second half of the full-batch calls (after warm-up and probe)."""
    ptrs = [int(p) for size, p in (line.split() for line in log.read_text().splitlines()) if int(size) == batch]
    assert len(ptrs) > 40, f"only {len(ptrs)} full calls recorded"
    return len(set(ptrs[len(ptrs) // 2 :]))


@pytest.mark.parametrize("load", limit.LOADS, ids=lambda load: load.name)
def test_the_offline_loop_cycles_as_many_inputs_as_soakd_hands_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load: limit.Load
) -> None:
    """Each bench row compares like with like: at batch 1 soakd hands the model each pooled input
    in turn (8 by default, 1 with pool = 1), at batch 8 one buffer; its offline loop the same."""
    model = tmp_path / "pointers.py"
    model.write_text(POINTER_LOG)
    spec = f"python:{model}:make"
    soak_log, off_log = tmp_path / "soak.log", tmp_path / "offline.log"
    config = tmp_path / "soak.toml"
    config.write_text(f"[batcher]\ninstances = 1\n[input]\npool = {load.pool}\n")
    flags = ["--model", spec, "--input-shapes", "3x16x16", "--warmup", "3", "--duration", "1.5s"]
    flags += ["--concurrency", str(load.concurrency), "--max-batch-size", str(load.batch)]
    flags += ["--max-queue-delay-ms", str(load.delay_ms), "--metrics-addr", "127.0.0.1:0"]
    flags += ["--state-dir", str(tmp_path / "state"), "--config", str(config)]
    res = subprocess.run(
        [sys.executable, "-m", "soakd", "run", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "POINTER_LOG": str(soak_log)},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    monkeypatch.setenv("POINTER_LOG", str(off_log))
    limit.child_offline(spec, "cpu", (3, 16, 16), load.batch, 3, 0.3, load.offline_inputs)
    assert steady_inputs(soak_log, load.batch) == load.offline_inputs
    assert steady_inputs(off_log, load.batch) == load.offline_inputs
