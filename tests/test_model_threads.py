"""Every call into the model, warm-up included, happens on the thread(s) that run it during the
soak, and full batches arrive in reused buffers (issue #13: a model warmed up on one thread and
run on another, or handed a freshly allocated batch each call, ran at half speed on CPU).

A `python:` factory model records, for each call, the calling thread and its input's data_ptr;
a real `soakd run` drives it for a few seconds.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import soakd_cmd

WARMUP = 10
MAX_BATCH = 8
Calls = list[tuple[int, int, int, bool]]  # (thread ident, batch size, input data_ptr, in inference_mode) per call

RECORDER = '''
import collections
import threading

import torch


class Recorder(torch.nn.Module):
    """Appends "thread-ident batch-size data_ptr inference-mode" per call. It holds its last few inputs, so a
    freshly allocated batch cannot land at the address of the one before and pass for reuse."""

    def __init__(self, log: str) -> None:
        super().__init__()
        self._log = open(log, "a", buffering=1)
        self._lock = threading.Lock()
        self._held = collections.deque(maxlen=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inference = int(torch.is_inference_mode_enabled())
        with self._lock:
            self._log.write(f"{threading.get_ident()} {x.shape[0]} {x.data_ptr()} {inference}\\n")
            self._held.append(x)
        return x.float().mean(dim=tuple(range(1, x.dim())))


def make(log: str) -> Recorder:
    return Recorder(log)
'''


def soak_recorded(tmp_path: Path, instances: int) -> Calls:
    """Run soakd for a few seconds on the recorder; its calls as (thread, batch size, data_ptr, inference mode)."""
    model = tmp_path / "recorder.py"
    model.write_text(RECORDER)
    log = tmp_path / f"calls-{instances}.log"
    cfg = tmp_path / f"soak-{instances}.toml"
    cfg.write_text(
        textwrap.dedent(f"""
        [model]
        spec = "python:{model}:make"
        device = "cpu"
        warmup = {WARMUP}
        [model.options]
        log = "{log}"
        [batcher]
        instances = {instances}
        max_batch_size = {MAX_BATCH}
        max_queue_delay_ms = 5
        [input]
        shapes = "3x32x32"
        [load]
        concurrency = {4 * MAX_BATCH}
        duration = "3s"
    """)
    )
    summary = tmp_path / f"summary-{instances}.json"
    res = subprocess.run(
        soakd_cmd("run", "--config", str(cfg), "--metrics-addr", "127.0.0.1:0", "--summary-json", str(summary)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Not assertions: a broken run must error the xfail tests below, not pass them as expected failures.
    if res.returncode != 0:
        raise RuntimeError(f"soakd run exited {res.returncode}: {res.stderr[-2000:]}")
    requests = json.loads(summary.read_text())["requests"]
    if requests.get("ok", 0) == 0 or requests.get("error", 0):
        raise RuntimeError(f"soakd run did not run the recorder cleanly: {requests}\n{res.stderr[-2000:]}")
    calls = []
    for line in log.read_text().splitlines():
        thread, size, ptr, inference = line.split()
        calls.append((int(thread), int(size), int(ptr), inference == "1"))
    return calls


@pytest.fixture(scope="module", params=[1, 2], ids=["instances=1", "instances=2"])
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Calls]:
    instances: int = request.param
    return instances, soak_recorded(tmp_path_factory.mktemp(f"threads{instances}"), instances)


def test_the_recording_sees_warmup_and_full_batches(recorded: tuple[int, Calls]) -> None:
    """The recorder saw the warm-up and many full batches after it: the checks below have data."""
    instances, calls = recorded
    assert len(calls) > WARMUP * instances + 20
    assert sum(1 for _, size, _, _ in calls[WARMUP * instances :] if size == MAX_BATCH) > 20


def test_warmup_and_inference_run_on_the_same_threads(recorded: tuple[int, Calls]) -> None:
    """Each instance has one thread for all its calls: no call, warm-up or probe, comes from elsewhere."""
    instances, calls = recorded
    per_thread: dict[int, int] = defaultdict(int)
    for thread, _, _, _ in calls:
        per_thread[thread] += 1
    assert len(per_thread) == instances, f"calls came from {len(per_thread)} threads: {dict(per_thread)}"


def test_every_call_runs_in_inference_mode(recorded: tuple[int, Calls]) -> None:
    """Warm-up, the offline probe and the soak all call the model inside torch.inference_mode(),
    entered once per worker job rather than around each call (no autograd records, either way)."""
    _, calls = recorded
    outside = [i for i, (_, _, _, inference) in enumerate(calls) if not inference]
    assert not outside, f"{len(outside)} of {len(calls)} calls ran outside inference_mode, first at call {outside[0]}"


def test_full_batches_arrive_in_reused_buffers(recorded: tuple[int, Calls]) -> None:
    """After warm-up, full batches on each model thread come in one buffer, not a new tensor each."""
    _, calls = recorded
    seen: dict[int, int] = defaultdict(int)
    ptrs: dict[int, set[int]] = defaultdict(set)
    for thread, size, ptr, _ in calls:
        seen[thread] += 1
        if seen[thread] > WARMUP and size == MAX_BATCH:  # past this thread's warm-up
            ptrs[thread].add(ptr)
    assert ptrs
    # One staging buffer per thread, plus at most one fixed input an offline probe may use.
    # Fresh batches would show at least 5: the recorder holds the last 4.
    assert all(len(p) <= 2 for p in ptrs.values()), {t: len(p) for t, p in ptrs.items()}


CHURNER = """
import torch

MB = 48  # above glibc's largest mmap threshold (32 MiB): a fresh block is mapped, faulted in and unmapped every call


class Churner(torch.nn.Module):
    def __init__(self, fresh_after: int, hold: int) -> None:
        super().__init__()
        self.fresh_after = fresh_after  # calls before it starts taking a fresh block (-1: never)
        self.hold = hold  # fresh blocks it keeps, then reuses (0: it gives each back)
        self.held: list[torch.Tensor] = []
        self.calls = 0
        self.kept = torch.empty(MB << 18)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        fresh = 0 <= self.fresh_after < self.calls
        if fresh and len(self.held) < self.hold:  # memory that grows to a working set and stays
            self.held.append(torch.empty(MB << 18))
            work = self.held[-1]
        elif fresh and not self.hold:
            work = torch.empty(MB << 18)
        else:
            work = self.held[-1] if self.held else self.kept
        work.fill_(1.0)
        return x.sum(dim=1) + work[:1]


def make(fresh_after: int, hold: int) -> Churner:
    return Churner(fresh_after, hold)
"""

# (fresh_after, hold). Warm-up makes 5 calls and the probe at most 5 more: past 12, only the
# soak's calls fault. The last holds the 12 blocks it takes in the soak (576 MB), as a heap
# growing to its working set does: faults paid once, not every call.
CHURN = {
    "fresh 48 MB a call": (0, 0),
    "one buffer kept": (-1, 0),
    "fresh in the soak only": (12, 0),
    "fresh in the soak, kept": (12, 12),
}


@pytest.mark.parametrize("case", list(CHURN))
def test_a_model_bound_by_page_faults_is_named_in_a_warning(tmp_path: Path, case: str) -> None:
    """A CPU model whose memory comes back from the kernel on every call runs at the allocator's
    pace: the offline probe counts the faults and says so (issue #13: the convnet at batch 1 on
    glibc's defaults); the same model keeping its buffer is not warned about. A model that
    faults only once the soak runs (the convnet's faults depend on its heap's history) is named
    too, with the probe's figure beside the soak's. A model whose fresh blocks are kept (a heap
    growing to its working set on a short run's first calls) pays its faults once: not warned."""
    (tmp_path / "churner.py").write_text(CHURNER)
    cfg = tmp_path / "soak.toml"
    cfg.write_text(
        textwrap.dedent(f"""
        [model]
        spec = "python:{tmp_path / "churner.py"}:make"
        device = "cpu"
        warmup = 5
        [model.options]
        fresh_after = {CHURN[case][0]}
        hold = {CHURN[case][1]}
        [input]
        shapes = "4"
        [load]
        concurrency = 1
        duration = "1s"
    """)
    )
    summary = tmp_path / "summary.json"
    res = subprocess.run(
        soakd_cmd("run", "--config", str(cfg), "--metrics-addr", "127.0.0.1:0", "--summary-json", str(summary)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    off = json.loads(summary.read_text())["model_offline"]
    every_page = 0.9 * (48 << 20) / 4096  # every page of the 48 MB, every call
    if case == "fresh 48 MB a call":
        assert off["page_faults_per_call"] > every_page and off["churn_faults_per_call"] > every_page
        assert off["kernel_time_ratio"] > 0.2
        assert "the model page-faults" in res.stderr and "set by the memory allocator" in res.stderr
        assert res.stderr.count("page-faults") == 1, "said by the probe, not again by the soak"
        (line,) = [x for x in res.stderr.splitlines() if "page-faults" in x]
        assert "docs/model-threads.md" in line and len(line) < 400, "one line, with where to read on"
        assert "set by the memory allocator" in off["allocator_warning"]
    else:
        assert off["page_faults_per_call"] < 100
    if case == "one buffer kept":
        assert off["soak_page_faults_per_call"] < 100
        assert "page-faults" not in res.stderr
    elif case == "fresh in the soak, kept":
        assert off["soak_page_faults_per_call"] * 4096 > (1 << 20), off  # above the warning's bound
        assert off["soak_churn_faults_per_call"] < 100, off  # but every faulted page was kept
        assert "page-faults" not in res.stderr and "allocator_warning" not in off
    else:
        # Soaking from call 12 on, the soak's first calls (those the probe left short of 12) still
        # reuse the buffer: on a loaded host a 1 s soak makes few enough calls that they count
        # (10,402 of 12,288 pages a call, seen). Half of every page still parts it from < 100.
        floor = every_page if case == "fresh 48 MB a call" else 0.5 * every_page
        assert off["soak_page_faults_per_call"] > floor and off["soak_churn_faults_per_call"] > floor
        assert off["soak_kernel_time_ratio"] > 0.2
    if case == "fresh in the soak only":
        warning = next(line for line in res.stderr.splitlines() if "page-faults" in line)
        assert "during the soak (alone, in the offline probe: " in warning, warning
        assert "the model page-faults" in warning and "set by the memory allocator" in warning
        assert off["allocator_warning"] in warning


def test_the_demo_runs_calm_and_says_its_allocator_in_one_line(tmp_path: Path) -> None:
    """`make demo`'s command, shortened: the builtin ConvNet runs with glibc keeping large blocks,
    said in one line, and no page-fault warning follows; the run passes its default gate."""
    summary = tmp_path / "summary.json"
    res = subprocess.run(
        soakd_cmd(
            "run", "--duration", "3s", "--warmup", "10", "--metrics-addr", "127.0.0.1:0", "--summary-json", str(summary)
        ),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    said = [line for line in res.stderr.splitlines() if "keeping large blocks" in line]
    assert len(said) == 1 and "MALLOC_ARENA_MAX=1" in said[0] and "docs/model-threads.md" in said[0], res.stderr
    assert "page-faults" not in res.stderr
    off = json.loads(summary.read_text())["model_offline"]
    # Under the warning's bound, measured: the faults whose pages are given back (faults whose
    # pages are kept are paid once; CI's 10-call probe once read 644 a call of those and warned).
    assert off["churn_faults_per_call"] * 4096 < (1 << 20), off
    assert off["soak_churn_faults_per_call"] * 4096 < (1 << 20), off
    assert "allocator_warning" not in off
