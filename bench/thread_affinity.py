"""Why soakd measured half the model's speed on CPU (issue #13), one cause per case, each case in
its own process so that no case inherits another's thread pools or allocator state.

Cases (each: warm-up then a timed loop at one batch size, throughput in req/s):

Models: ``encoder`` (bench/models.py, the issue's TorchScript transformer encoder, reconstructed)
and ``convnet`` (soakd's builtin), at batch 8 on 3x224x224.

  same-main      warm up and run on the main thread, the same input tensor every call
  cross-thread   warm up on the main thread, then run on a second thread (what soakd does today)
  same-thread    warm up and run, both on one second thread
  CASE@VAR=VAL   CASE with VAR=VAL in its environment; same-main@GOMP_SPINCOUNT=100 gives the main
                 thread's OpenMP team the short spin (100) that libgomp switches to by itself once a
                 process holds more OpenMP threads than cores (two teams on 2 cores do)
  fresh-clone    same-main, but ``x.clone()`` before every call (a fresh batch allocation)
  fresh-stack    same-main, but ``torch.stack`` of 8 pooled requests every call (soakd's collate)
  staged-stack   same-main, ``torch.stack(..., out=buf)`` into one reused buffer (the fix)
  kN-all         N model threads ("instances"), each warmed and run on its own thread, each
                 leaving torch's thread count alone (every instance claims every core)
  kN-budget      the same, each thread first calling ``torch.set_num_threads(max(1, cores // N))``

``--info`` prints torch's parallel settings and whether ``set_num_threads`` is per thread.

    PYTHONPATH=. .venv/bin/python bench/thread_affinity.py [--seconds 2] [--rounds 3] [--models encoder,convnet]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.models import save_torchscript

WARMUP = 20
BATCH = 8
SHAPE = (3, 224, 224)
CASES = (
    "same-main",
    "cross-thread",
    "same-thread",
    "same-main@GOMP_SPINCOUNT=100",
    "fresh-clone",
    "fresh-stack",
    "staged-stack",
    # Allocation cost alone, without any OpenMP team (so no spin policy) in the way:
    "same-main@OMP_NUM_THREADS=1",
    "fresh-clone@OMP_NUM_THREADS=1",
    "fresh-stack@OMP_NUM_THREADS=1",
    "staged-stack@OMP_NUM_THREADS=1",
)


def load(model: str, encoder_path: str | None) -> Callable[[torch.Tensor], Any]:
    if model == "encoder":
        assert encoder_path is not None
        fn: Callable[[torch.Tensor], Any] = torch.jit.load(encoder_path)  # type: ignore[no-untyped-call]
        return fn
    from soakd.models.builtin import ConvNet

    torch.manual_seed(0)
    return ConvNet().eval()


# ---------------------------------------------------------------------------------- child side


Rate = tuple[float, float]  # (req/s, process CPU ms per request)
_PEAK_THREADS: list[int] = []  # OS threads in the process at the end of each timed window


def _os_threads() -> int:
    """Threads in this process: each thread that ran a parallel op holds its own OpenMP team."""
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1


def _timed(fn: Callable[[torch.Tensor], Any], make_input: Callable[[], torch.Tensor], seconds: float) -> Rate:
    """Throughput, and process CPU ms per request: on a shared box the second moves less with
    the neighbours' load, and it shows thread pools spinning that the first only hints at."""
    with torch.inference_mode():
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < seconds:
            fn(make_input())
            n += BATCH
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        _PEAK_THREADS.append(_os_threads())
        return n / wall, 1e3 * cpu / n


def _warm(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> None:
    with torch.inference_mode():
        for _ in range(WARMUP):
            fn(x)


def _on_thread(target: Callable[[], Rate]) -> Rate:
    out: list[Rate] = []
    t = threading.Thread(target=lambda: out.append(target()), name="soakd-model-0")
    t.start()
    t.join()
    return out[0]


def run_case(case: str, model: str, encoder_path: str | None, seconds: float) -> dict[str, Any]:
    fn = load(model, encoder_path)
    rps, cpu_ms = _case(case, fn, seconds)
    threads = max(_PEAK_THREADS, default=-1)
    return {"case": case, "model": model, "rps": rps, "cpu_ms_per_req": cpu_ms, "threads": threads}


def _case(case: str, fn: Callable[[torch.Tensor], Any], seconds: float) -> Rate:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, *SHAPE, generator=gen)
    pool = [torch.randn(*SHAPE, generator=gen) for _ in range(BATCH)]
    if case == "same-main":
        _warm(fn, x)
        rate = _timed(fn, lambda: x, seconds)
    elif case == "cross-thread":
        _warm(fn, x)
        rate = _on_thread(lambda: _timed(fn, lambda: x, seconds))
    elif case == "same-thread":

        def warm_then_time() -> tuple[float, float]:
            _warm(fn, x)
            return _timed(fn, lambda: x, seconds)

        rate = _on_thread(warm_then_time)
    elif case == "fresh-clone":
        _warm(fn, x)
        rate = _timed(fn, x.clone, seconds)
    elif case == "fresh-stack":
        _warm(fn, x)
        rate = _timed(fn, lambda: torch.stack(pool), seconds)
    elif case == "staged-stack":
        _warm(fn, x)
        buf = torch.empty(BATCH, *SHAPE)
        rate = _timed(fn, lambda: torch.stack(pool, out=buf), seconds)
    elif case.startswith("k"):
        k_text, _, mode = case[1:].partition("-")
        rate = _instances(fn, x, int(k_text), mode == "budget", seconds)
    else:
        raise SystemExit(f"unknown case {case!r}")
    return rate


def _instances(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, k: int, budget: bool, seconds: float) -> Rate:
    """K threads, each warming and running the model on its own thread, started together."""
    cores = os.cpu_count() or 1
    counts = [0] * k
    go = threading.Barrier(k + 1)
    stop = threading.Event()

    def instance(slot: int) -> None:
        if budget:
            torch.set_num_threads(max(1, cores // k))  # per calling thread in an OpenMP build
        _warm(fn, x)
        go.wait()
        with torch.inference_mode():
            while not stop.is_set():
                fn(x)
                counts[slot] += BATCH

    threads = [threading.Thread(target=instance, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    go.wait()
    t0, c0, before = time.perf_counter(), time.process_time(), sum(counts)
    time.sleep(seconds)
    done, elapsed, cpu = sum(counts) - before, time.perf_counter() - t0, time.process_time() - c0
    _PEAK_THREADS.append(_os_threads())
    stop.set()
    for t in threads:
        t.join()
    return done / elapsed, 1e3 * cpu / max(1, done)


def thread_info() -> dict[str, Any]:
    """What torch reports, and whether set_num_threads on one thread changes another's count."""
    seen: dict[str, Any] = {
        "cores": os.cpu_count(),
        "main_num_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "parallel_info": torch.__config__.parallel_info(),
    }

    def probe(label: str, set_to: int | None = None) -> None:
        def body() -> None:
            before = torch.get_num_threads()
            if set_to is not None:
                torch.set_num_threads(set_to)
            seen[label] = {"before": before, "after": torch.get_num_threads()}

        t = threading.Thread(target=body)
        t.start()
        t.join()

    probe("new_thread")
    probe("thread_sets_1", 1)
    seen["main_after_thread_set_1"] = torch.get_num_threads()
    probe("another_new_thread_after_that")
    torch.set_num_threads(1)
    probe("new_thread_after_main_set_1")
    return seen


# ---------------------------------------------------------------------------------- parent side


def child(args: list[str], extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), **(extra_env or {})}
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="timed loop per case and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, cases interleaved; the median is shown")
    ap.add_argument("--models", default="encoder,convnet")
    ap.add_argument("--instances", default="2", help="comma-separated K for the kN-all / kN-budget cases")
    ap.add_argument("--info", action="store_true", help="only print torch's thread settings")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--encoder-path", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child == "info":
        print(json.dumps(thread_info()))
        return 0
    if args.child:
        print(json.dumps(run_case(args.child, args.model, args.encoder_path, args.seconds)))
        return 0

    info = child(["--child", "info"])
    print(info["parallel_info"].rstrip())
    print(
        f"\ncores {info['cores']}, main thread get_num_threads {info['main_num_threads']}, "
        f"interop {info['interop_threads']}"
    )
    for key in ("new_thread", "thread_sets_1", "another_new_thread_after_that", "new_thread_after_main_set_1"):
        print(f"  {key:<32} get_num_threads before {info[key]['before']}  after {info[key]['after']}")
    print(f"  {'main_after_thread_set_1':<32} {info['main_after_thread_set_1']}")
    if args.info:
        return 0

    ks = [int(k) for k in args.instances.split(",") if k]
    cases = [*CASES, *(f"k{k}-{m}" for k in ks for m in ("all", "budget"))]
    with tempfile.TemporaryDirectory() as tmp:
        enc = str(save_torchscript(Path(tmp) / "enc.pt"))
        for model in args.models.split(","):
            rps: dict[str, list[float]] = {c: [] for c in cases}
            cpu: dict[str, list[float]] = {c: [] for c in cases}
            nthreads: dict[str, int] = {}
            for _ in range(args.rounds):
                for case in cases:
                    name, _, var = case.partition("@")  # CASE@VAR=VALUE: the case under that environment
                    extra = dict([var.split("=", 1)]) if var else None
                    r = child(
                        ["--child", name, "--model", model, "--encoder-path", enc, "--seconds", str(args.seconds)],
                        extra,
                    )
                    rps[case].append(r["rps"])
                    cpu[case].append(r["cpu_ms_per_req"])
                    nthreads[case] = r["threads"]
            print(
                f"\n{model}, batch {BATCH} x {'x'.join(map(str, SHAPE))}, {args.seconds:g} s per case, "
                f"{args.rounds} rounds interleaved, each case its own process; ratios to same-main "
                "(under the same environment)"
            )
            print(
                f"  {'case':<30} {'median':>8} {'ratio':>6} {'best':>8} {'ratio':>6} {'cpu ms/req':>11} {'ratio':>6}"
                f" {'threads':>7}   rounds (req/s)"
            )
            for case in cases:
                env_part = case.partition("@")[2]
                ref = f"same-main@{env_part}" if env_part and f"same-main@{env_part}" in rps else "same-main"
                base, base_best = statistics.median(rps[ref]), max(rps[ref])
                base_cpu = statistics.median(cpu[ref])
                med, best, c = statistics.median(rps[case]), max(rps[case]), statistics.median(cpu[case])
                rounds = ", ".join(f"{v:.0f}" for v in rps[case])
                print(
                    f"  {case:<30} {med:8.0f} {med / base:6.2f} {best:8.0f} {best / base_best:6.2f}"
                    f" {c:11.3f} {c / base_cpu:6.2f} {nthreads[case]:7d}   {rounds}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
